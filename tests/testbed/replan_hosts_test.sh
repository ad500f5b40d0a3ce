#!/usr/bin/env bash
# ctest: online re-planning triggered by a change of the measured link rate
# (issue 8). `cortado launch --hosts` on 4 emulated hosts x 1 worker at
# 10gbit runs exec_check --mode replan with profiling windows of 3 iterations
# (the scheduler plans with fp16, which is exact on exec_check's integer
# inputs, so every result of every iteration is checked against the reference
# sum), and hands out a plan only when it is predicted 15% faster. Once the
# scheduler's first verdict on the fast link is in (usually: keep version 0,
# nothing compressed), every host's link is changed to 20mbit with
# `testbed.sh rate` mid-run. The test then expects:
#   - a first plan, if one was handed out, fitted to a fast inter-machine
#     link (> 0.1 Gbit/s: on this 2-core machine the fit sees 1.9-8.4 Gbit/s,
#     what the CPUs move);
#   - a plan version fitted to the slow link (< 0.05 Gbit/s) is handed out
#     after the change, and every worker switches to it;
#   - its choice differs from the plan that ran when the rate changed;
#   (or, when the first plan compressed already, a window at the slow rate
#   that keeps it, see CORTADO_REPLAN_MIN_GAIN below);
#   - every worker's every result equals the reference sum; no process left.
#
#
# Case `bench`: `cortado bench model --strategies plan,replan` with dgc on 2
# hosts at 100mbit, where the offline plan compresses (lossy) and the
# scheduler plans with fp16: tensors switch from lossy to lossless options,
# which fold the retired residuals into the switch iteration's input; every
# result the benchmark can check exactly must be right (it exits 1 on a
# wrong one), and the offline plan must have been lossy for this to test it.
#
#   replan_hosts_test.sh CORTADO EXEC_CHECK [rate|bench]
#
# Skips (exit 77) where it cannot run: not root, no mpirun, no network
# namespaces.
set -uo pipefail

CORTADO=$1
CHECK=$2
CASE=${3:-rate}
HERE=$(cd "$(dirname "$0")" && pwd)
TB=$HERE/testbed.sh
NAME=r$(printf '%04x%03x' $((RANDOM % 65536)) $(($$ % 4096)))
OUT=$(mktemp -d /tmp/cortado-replan-test.XXXXXX)
source "$HERE/host_test_lib.sh"


if [[ $CASE == bench ]]; then
  hosts=2
  "$TB" up "$NAME" "$hosts" --rate 100mbit >/dev/null || { echo "FAIL: testbed.sh up failed" >&2; exit 1; }
  CORTADO_LOG_LEVEL=warn CORTADO_PROFILE_WINDOW=2 CORTADO_REPLAN_CODEC=fp16 CORTADO_REPLAN_AHEAD=3 \
    "$TB" exec "$NAME" 1 timeout -s KILL 100 "$CORTADO" launch --hosts "$NAME-h1,$NAME-h2" -w 1 -s 1 \
    --agent "$TB exec-host {host}" -- "$CORTADO" bench model --profile "$HERE/../launcher/data/tiny_profile.json" \
    --codec dgc:ratio=0.01 --strategies plan,replan --iterations 3 --warmup 1 --json >"$OUT/log" 2>&1
  rc=$?
  plan=$(grep '"strategy":"plan"' "$OUT/log")
  replan=$(grep '"strategy":"replan"' "$OUT/log")
  echo "$plan"
  echo "$replan"
  ((rc == 0)) || fail "the benchmark exited with $rc"
  echo "$plan" | grep -Eq '"lossy_tensors":[1-9]' || fail "the offline plan compressed nothing at 100mbit: the lossy-to-lossless switch was not exercised"
  echo "$replan" | grep -q '"wrong_elements":0' && echo "$replan" | grep -Eq '"checked_elements":[1-9]' ||
    fail "replan results wrong or unchecked: $replan"
  echo "$replan" | grep -Eq '"plan_version":([2-9]|[1-9][0-9])' || fail "no switch to a scheduler's plan: $replan"
  for _ in $(seq 50); do [[ -z $(left_in_hosts) ]] && break; sleep 0.2; done
  [[ -z $(left_in_hosts) ]] || fail "processes left in the hosts"
  if ((FAILED)); then
    grep -v '^\[' "$OUT/log" | tail -30 | cut -c1-400
    exit 1
  fi
  echo "replan after a lossy offline plan passed"
  exit 0
fi

hosts=4 per=1 slow=20mbit
"$TB" up "$NAME" "$hosts" --rate 10gbit >/dev/null || { echo "FAIL: testbed.sh up failed" >&2; exit 1; }
list=$(seq -s, -f "$NAME-h%g" 1 "$hosts")
progress() { cat "$OUT/progress" 2>/dev/null; }  # "ITERATION VERSION" of rank 0
# The first rate below 0.05 Gbit/s at which the scheduler kept the running
# plan ("[replan] window W: inter-machine link rate R Gbit/s, ...; ... the plan
# stays"), or nothing.
kept_slow() {
  sed -n 's/.*\[replan\] window [0-9]*: inter-machine link rate \([0-9.e+-]*\) Gbit\/s.*the plan stays.*/\1/p' \
    "$OUT/log" | awk '$1 < 0.05 { print; exit }'
}

# Plan lines of the scheduler: "[replan] plan version V (...): ..., inter X
# Gbit/s (N points), ...; switch at S" -> "V X S".
plans() {
  sed -n 's/.*\[replan\] plan version \([0-9]*\) .* inter \([0-9.e+-]*\) Gbit\/s ([0-9]* points).*switch at \([0-9]*\).*/\1 \2 \3/p' \
    "$OUT/log"
}

# CORTADO_REPLAN_MIN_GAIN=0.15: a plan must be predicted 15% faster to be
# sent. On the fast link fp16 on the 128 KiB tensors is predicted 0-8%
# faster (the fit sees 1.9-9 Gbit/s, what the CPUs move), so the workers
# keep version 0 (nothing compressed); at 20mbit a compressing plan is
# predicted 22-34% faster. With MIN_GAIN=0 the first plan already compressed
# on most fits, which is also what the slow link calls for, and the test
# failed about one run in three with "the same options" or "no plan for the
# slow link". On a rare slow fit of the fast link (1 Gbit/s, one run in
# seven) the first plan compresses already: then a window at the slow rate
# that keeps it is what the test accepts.
CORTADO_LOG_LEVEL=info CORTADO_PROFILE_WINDOW=3 CORTADO_REPLAN_CODEC=fp16 CORTADO_REPLAN_AHEAD=4 \
  CORTADO_REPLAN_MIN_GAIN=0.15 \
  "$TB" exec "$NAME" 1 timeout -s KILL 110 "$CORTADO" launch --hosts "$list" -w "$per" -s 1 \
  --agent "$TB exec-host {host}" -- "$CHECK" --mode replan --tensors 8 --elements 32768 \
  --iters 1000000 --stop-file "$OUT/stop" --after 2 --progress-file "$OUT/progress" \
  --max-seconds 90 >"$OUT/log" 2>&1 &
job=$!

# The scheduler's first verdict on the fast link: a plan handed out, or
# "window 0: first complete profile; ... the plan stays".
first_verdict() {
  [[ -n $(plans) ]] && { echo plan; return; }
  grep -q '\[replan\] window [0-9]*: first complete profile.*the plan stays' "$OUT/log" && echo kept
}

# 1. The first verdict (fitted to the fast link), and the plan it leaves
# running on every worker.
verdict=""
for _ in $(seq 400); do
  verdict=$(first_verdict)
  read -r it ver <<<"$(progress)"
  if [[ -n $verdict && -n ${ver:-} ]]; then
    [[ $verdict == kept ]] && break
    ((ver >= 1)) && break
  fi
  kill -0 "$job" 2>/dev/null || break
  sleep 0.1
done
read -r at_it at_ver <<<"$(progress)"
if [[ -z $verdict || -z ${at_ver:-} ]] || { [[ $verdict == plan ]] && ((at_ver < 1)); }; then
  fail "no verdict from the scheduler within 40 s (progress: '$(progress)')"
else
  if [[ $verdict == plan ]]; then
    first_rate=$(plans | head -1 | cut -d' ' -f2)
    echo "plan version $at_ver runs at iteration $at_it; the first plan was fitted to inter $first_rate Gbit/s"
    awk -v r="$first_rate" 'BEGIN { exit !(r > 0.1) }' ||
      fail "the first plan was fitted to inter $first_rate Gbit/s on a 10gbit link (expected > 0.1)"
  else
    echo "the scheduler kept plan version $at_ver (nothing compressed) at its first verdict; iteration $at_it"
  fi

  # 2. Slow every link down, both directions.
  for ((i = 1; i <= hosts; i++)); do "$TB" rate "$NAME" "$i" "$slow" || fail "testbed.sh rate $i $slow failed"; done
  read -r cut_it cut_ver <<<"$(progress)"
  echo "links changed to $slow at iteration $cut_it (plan version $cut_ver running)"

  # 3. A new plan switched to after the change, and the slow link measured
  # with it: either that plan was fitted to the slow link, or one from a
  # window that straddled the change already is what the slow link calls for,
  # and a later window at the slow rate keeps it (CORTADO_REPLAN_MIN_GAIN:
  # "the plan stays"; or the measured check of that plan: "...: kept").
  new_ver="" new_at="" new_rate="" confirmed=""
  for _ in $(seq 600); do
    new_ver="" new_at="" new_rate=""
    while read -r v r s; do
      if ((s > cut_it)); then new_ver=$v new_at=$s new_rate=$r; fi
    done < <(plans)
    if [[ -n $new_ver ]]; then
      if awk -v r="$new_rate" 'BEGIN { exit !(r < 0.05) }'; then
        confirmed="fitted to inter $new_rate Gbit/s"
      elif r=$(kept_slow) && [[ -n $r ]]; then
        confirmed="fitted to inter $new_rate Gbit/s, kept by a window at $r Gbit/s"
      elif grep -q "\[replan\] window [0-9]*: plan version $new_ver measured .*: kept" "$OUT/log"; then
        # Since 2026-11-25 a link moves by its messages' time at the same
        # sizes, so the window that straddles the change re-plans already,
        # fitted between the two rates; the plan's first window, wholly at the
        # slow rate, is its measured check, which keeps it, and that window
        # is the reference from then on.
        confirmed="fitted to inter $new_rate Gbit/s (a window straddling the change), kept by its measured check at the slow rate"
      fi
    elif [[ $verdict == plan ]] && r=$(kept_slow) && [[ -n $r ]]; then
      confirmed="the first plan (version $cut_ver, fitted to inter $first_rate Gbit/s) kept by a window at $r Gbit/s"
    elif ((${cut_ver:-0} >= 1)) &&
      grep -q "\[replan\] plan version $cut_ver (.*): 8 of 8 tensors compressed" "$OUT/log" &&
      grep -q "\[replan\] window [0-9]*: plan version $cut_ver measured .*(a link slowed down): kept" "$OUT/log"; then
      # A plan handed out after a first verdict that kept version 0, but
      # before the change (a window on the loaded fast link drifted beyond
      # the threshold: 1.54x in one fresh-clone CI run, 2026-11-26), already
      # compresses every tensor, what the slow link calls for; its measured
      # check, on the slow link, keeps it: the link slowed down.
      confirmed="the plan running at the change (version $cut_ver, from a window before it) kept by its measured check at the slow rate (a link slowed down)"
    fi
    [[ -n $confirmed ]] && break
    kill -0 "$job" 2>/dev/null || break
    sleep 0.1
  done
  if [[ -z $confirmed ]]; then
    fail "no plan for the slow link (< 0.05 Gbit/s) within 60 s of the change; plans: $(plans | tr '\n' ';')"
  elif [[ -z $new_ver ]]; then
    echo "no new plan: $confirmed"
  else
    echo "plan version $new_ver ($confirmed), switch at iteration $new_at"
    for _ in $(seq 600); do
      read -r it ver <<<"$(progress)"
      [[ -n ${it:-} ]] && ((it > new_at)) && break
      kill -0 "$job" 2>/dev/null || break
      sleep 0.1
    done
  fi
fi
touch "$OUT/stop"
wait "$job"
rc=$?
job=""
((rc == 0)) || fail "the job exited with $rc"
W=$((hosts * per))
for ((r = 0; r < W; r++)); do
  grep -q "^rank $r: PASSED" "$OUT/log" || fail "worker $r did not report every result correct"
done
if [[ -n ${new_ver:-} ]]; then
  for ((r = 0; r < W; r++)); do
    grep -Eq "^rank $r: [0-9]+ iterations checked, plan versions ([0-9]+,)*$new_ver(,|$)" "$OUT/log" ||
      fail "worker $r did not run plan version $new_ver: $(grep "^rank $r: .*plan versions" "$OUT/log")"
  done
  opts() { sed -n "s/^replan: iteration [0-9]*: plan version $1: //p" "$OUT/log" | head -1; }
  before=$(opts "$cut_ver") after=$(opts "$new_ver")
  echo "ran when the rate changed (version $cut_ver): $before"
  echo "after (version $new_ver): $after"
  [[ -n $after && "$before" != "$after" ]] || fail "plan version $new_ver chooses the same options as version $cut_ver"
fi
for _ in $(seq 50); do [[ -z $(left_in_hosts) ]] && break; sleep 0.2; done
left=$(left_in_hosts)
[[ -z $left ]] || fail "processes left in the hosts: $(ps -o pid,args -p ${left// /,} | cut -c1-160)"

if ((FAILED)); then
  echo "---- plans the workers ran ----"
  grep '^replan: iteration' "$OUT/log" | cut -c1-600
  echo "---- job output ----"
  grep -v '\[debug\]' "$OUT/log" | tail -60 | cut -c1-400
  exit 1
fi
echo "re-planning on a link rate change passed"

#!/bin/bash
# cortado bench model under `cortado launch --mpi` on 2 emulated machines of
# 2 workers (CORTADO_FAKE_HOST_SIZE=2): every strategy for a few iterations
# with fp16 (whose sums of the integer-valued gradients are exact), so every
# result is checked against the exact sum on every worker; a lossy codec
# (dgc) where the uncompressed tensors are still checked; then the refusals.
#   bench_model_test.sh CORTADO_BIN PROFILE_JSON
set -u
cortado=$1 profile=$2
fail=0
check() {  # check NAME COND MESSAGE
  if eval "$2"; then echo "ok: $1"; else echo "FAIL: $1: $3"; fail=1; fi
}
export CORTADO_LOG_LEVEL=warn
out=$(CORTADO_FAKE_HOST_SIZE=2 timeout 240 "$cortado" launch --mpi -w 4 -s 2 -- "$cortado" bench model \
  --profile "$profile" --codec fp16 --iterations 3 --warmup 1 --json 2>&1)
rc=$?
echo "$out"
check "fp16 run exits 0" "[ $rc = 0 ]" "rc=$rc"
for s in none gpu cpu plan; do
  line=$(echo "$out" | grep "\"strategy\":\"$s\"")
  check "strategy $s reported" "[ -n \"\$line\" ]" "no JSON line"
  check "strategy $s exact" "echo \"\$line\" | grep -q '\"wrong_elements\":0' && ! echo \"\$line\" | grep -q '\"checked_elements\":0,'" "$line"
  check "strategy $s has a prediction" "echo \"\$line\" | grep -Eq '\"predicted_ms\":[0-9]*[1-9]'" "$line"
  check "strategy $s has the overlapped simulation" "echo \"\$line\" | grep -Eq '\"overlapped_ms\":[0-9]*[1-9]'" "$line"
done
check "summary" "echo \"\$out\" | grep -q plan_speedup_vs_none" "no summary line"
# The executor's compressed exchanges with the servers, probed at the
# codec probe's sizes (2 machines: the probe runs), each with a round trip.
check "compressed exchange probed" "echo \"\$out\" | grep -Eq 'measured compressed exchange \(fp16 x.push\* x.pull\*, through the servers; [0-9.]+ s\) by elements:pushed bytes:round trip( [0-9]+:[0-9]+B:[0-9]+us)+$'" "$(echo "$out" | grep 'compressed exchange')"
# The codec probe's decode: the first payload's add apart from each further
# one's, at every size probed.
check "decode's first payload probed" "echo \"\$out\" | grep -Eq \"measured codec fp16 decode's first payload/each further one per elements:( [0-9]+:[0-9]+/[0-9]+us)+\$\"" "$(echo "$out" | grep 'first payload')"
# The workers' skew, measured at start-up (auto) by chains of steps: its
# probe line with each chain's traced stages, and every strategy's curve and
# its prediction without the skew.
check "skew chains probed" "echo \"\$out\" | grep -Eq 'measured skew chain \(F: E\(fp16\) ag\* D\(fp16\) back to back, the slowest worker.s time per step, and its stages: the workers. mean encode and decode, the fastest worker.s allgather; [0-9.]+ s\) by steps x elements:( [0-9]+x[0-9]+:[0-9]+us\(E [0-9]+ ag\* [0-9]+ D [0-9]+\))+$'" "$(echo "$out" | grep 'skew chain')"
# And the same chains through the servers (2 machines), for the skew before
# a push: its own line, its own curve.
check "skew chains through the servers probed" "echo \"\$out\" | grep -Eq 'measured skew chain \(H: i.rs E\(fp16\) x.push\* x.pull\* i.ag\* D\(fp16\) back to back, the slowest worker.s time per step, and its stages: the workers. mean encode and decode, the fastest worker.s push and pull; [0-9.]+ s\) by steps x elements:( [0-9]+x[0-9]+:[0-9]+us\(E [0-9]+ x.push\*\+pull\* [0-9]+ D [0-9]+\))+$'" "$(echo "$out" | grep 'skew chain')"
for s in none gpu cpu plan; do
  line=$(echo "$out" | grep "\"strategy\":\"$s\"")
  check "strategy $s: skew and the prediction without it" "echo \"\$line\" | python3 -c '
import json, sys
r = json.loads(sys.stdin.read())
assert r[\"sync_skew_us\"] == 0 and r[\"sync_skew_fraction\"] == 0, r
for k in (\"sync_skew_curve\", \"push_skew_curve\"):
    c = r[k]
    assert c and all(w > 0 and t >= 0 for w, t in c), (k, r)
    assert all(a[0] < b[0] and a[1] <= b[1] for a, b in zip(c, c[1:])), (k, r)
assert 0 < r[\"predicted_noskew_ms\"] <= r[\"predicted_ms\"] * (1 + 1e-9), r
'" "$line"
done
# Tensor fusion is on by default (64 MiB): gradients 0 and 1 of the profile
# are ready together, so they share a batch (fewer batches than tensors).
line=$(echo "$out" | grep '"strategy":"plan"')
check "fusion on by default" "echo \"\$line\" | grep -q '\"fusion_bytes\":67108864' && echo \"\$line\" | grep -Eq '\"batches_per_iteration\":[1-6](\.|,)'" "$line"
# Off: one batch per gradient (a plan group, handed over whole, one batch
# for its tensors), every result still exact.
# With the memory report: a line for each worker (its gradients: the
# profile's 4.0 MiB) and each server.
out=$(CORTADO_FAKE_HOST_SIZE=2 CORTADO_FUSION_BYTES=0 CORTADO_REPORT_MEMORY=1 timeout 240 "$cortado" launch --mpi -w 4 -s 2 -- \
  "$cortado" bench model --profile "$profile" --codec fp16 --strategies none,plan --iterations 2 --warmup 0 --json 2>&1)
rc=$?
echo "$out"
check "fusion-off run exits 0" "[ $rc = 0 ]" "rc=$rc"
check "a memory line per worker" "[ \"\$(echo \"\$out\" | grep -Ec '^memory: worker [0-3]: gradients 4\.0 MiB; overhead .*x the gradients')\" = 4 ]" "$(echo "$out" | grep '^memory:')"
check "a memory line per server" "[ \"\$(echo \"\$out\" | grep -Ec '^memory: server [01]: keys .*x the keys')\" = 2 ]" "$(echo "$out" | grep '^memory:')"
for s in none plan; do
  line=$(echo "$out" | grep "\"strategy\":\"$s\"")
  want=7
  if echo "$line" | grep -Eq '[0-9]+ fused groups of [0-9]+ tensors'; then
    read -r groups members < <(echo "$line" | sed -E 's/.* ([0-9]+) fused groups of ([0-9]+) tensors.*/\1 \2/')
    want=$((7 - members + groups))
  fi
  check "fusion off: $s exact, one batch per tensor or plan group ($want)" "echo \"\$line\" | grep -q '\"wrong_elements\":0' && echo \"\$line\" | grep -q '\"fusion_bytes\":0' && echo \"\$line\" | grep -Eq '\"batches_per_iteration\":$want(\\.0)?[,}]'" "$line"
done

# Fused groups: the per-tensor plan, the plan with Cupcake's groups, and
# MergeComp's search for groups by timing iterations (timed once it ended),
# every result exact (fp16 on integers), each predicted; the summary compares
# them. With every gradient in a buffer of its own (--separate-buffers), so
# that the groups take the executor's copy path (the runs above: in place).
out=$(CORTADO_FAKE_HOST_SIZE=2 CORTADO_FUSION_BYTES=0 timeout 240 "$cortado" launch --mpi -w 4 -s 2 -- \
  "$cortado" bench model --profile "$profile" --codec fp16 --strategies pertensor,plan,mergecomp \
  --iterations 2 --warmup 1 --separate-buffers --json 2>&1)
rc=$?
echo "$out"
check "groups run exits 0" "[ $rc = 0 ]" "rc=$rc"
for s in pertensor plan mergecomp; do
  line=$(echo "$out" | grep "\"strategy\":\"$s\"")
  check "groups: $s exact and predicted" "echo \"\$line\" | grep -q '\"wrong_elements\":0' && echo \"\$line\" | grep -Eq '\"predicted_ms\":[0-9]*[1-9]'" "$line"
done
# Its alternatives are the best compress-everything option of each codec
# device and path (here E(g) and E(c), each on the flat collectives, the
# hierarchical ones and the servers: six, in the order of their predicted
# times); each is timed with every tensor on its own, the two fastest are
# searched on and the other four left out, whichever they are (the times
# decide), and the summary names the one it kept, one of the two searched.
line=$(echo "$out" | grep '"strategy":"mergecomp"')
check "mergecomp screens its six alternatives and searches two" "echo \"\$line\" | python3 -c '
import json, re, sys
s = json.loads(sys.stdin.read())[\"search\"]
head = \"fusion search over 6 option sets (each tensor on its own timed first, the 2 fastest searched): \"
assert s.startswith(head), s
parts = re.split(r\"; (?=[1-6] \\()\", s[len(head):])
assert [p[:3] for p in parts] == [\"%d (\" % i for i in range(1, 7)], parts
out = [i + 1 for i, p in enumerate(parts) if \"): left out, each tensor on its own \" in p]
assert len(out) == 4, (out, s)
kept = re.search(r\"; kept ([1-6]) \\(\", parts[5])
assert kept and int(kept.group(1)) not in out, s
'" "$line"
check "groups summary" "echo \"\$out\" | grep -q plan_speedup_vs_pertensor && echo \"\$out\" | grep -q mergecomp_speed_vs_plan" "no summary"

# The encode pipeline without fusion by size: each iteration is one batch
# whose gradients the executor awaits (batches_per_iteration 1), every
# result exact and predicted (the prediction models the pipeline).
out=$(CORTADO_FAKE_HOST_SIZE=2 CORTADO_FUSION_BYTES=0 CORTADO_PIPELINE=1 timeout 240 "$cortado" launch --mpi -w 4 -s 2 -- \
  "$cortado" bench model --profile "$profile" --codec fp16 --strategies cpu,plan \
  --iterations 2 --warmup 1 --json 2>&1)
rc=$?
echo "$out"
check "pipelined run exits 0" "[ $rc = 0 ]" "rc=$rc"
for s in cpu plan; do
  line=$(echo "$out" | grep "\"strategy\":\"$s\"")
  check "pipelined: $s exact, one batch an iteration, predicted" "echo \"\$line\" | grep -q '\"wrong_elements\":0' && echo \"\$line\" | grep -Eq '\"batches_per_iteration\":1(\\.0)?[,}]' && echo \"\$line\" | grep -Eq '\"predicted_ms\":[0-9]*[1-9]'" "$line"
done
check "pipelined: the JSON says so" "echo \"\$out\" | grep '\"strategy\":\"plan\"' | grep -q '\"pipeline\":true'" "no pipeline field"

# replan too: a tensor that is lossy before a switch gets the retired
# residuals folded into the switch iteration's input (not checked there),
# every other lossless result is.
out=$(CORTADO_FAKE_HOST_SIZE=2 CORTADO_PROFILE_WINDOW=2 CORTADO_REPLAN_CODEC=dgc:ratio=0.1 CORTADO_REPLAN_AHEAD=5 \
  timeout 240 "$cortado" launch --mpi -w 4 -s 2 -- "$cortado" bench model \
  --profile "$profile" --codec dgc:ratio=0.1 --strategies none,plan,replan --iterations 2 --warmup 0 2>&1)
rc=$?
echo "$out"
check "dgc run exits 0" "[ $rc = 0 ]" "rc=$rc"
check "dgc none exact" "echo \"\$out\" | grep -q '^| none .*| exact (0 lossy tensors)'" "no exact row for none"
check "dgc plan row" "echo \"\$out\" | grep -q '^| plan '" "no plan row"
check "dgc replan row" "echo \"\$out\" | grep -Eq '^\\| replan .*(then version [0-9]* \\(first switch at iteration|kept by the scheduler)'" "no replan row"
# The cost line (without --json) says how the chains' traced codec calls
# stretch the CPU codec's price, by elements, and sets the chains' traced
# stages beside their prices.
check "codec calls stretched by the chains" "echo \"\$out\" | grep -Eq 'CPU codec calls priced as the executor makes them, stretched as the skew chains. calls of workers coding at once ran against that price \(by elements\): [0-9]+: E [0-9.]+x, D [0-9.]+x'" "$(echo "$out" | grep -o 'CPU codec calls priced.*' | head -1)"
check "skew chains against their prices" "echo \"\$out\" | grep -Eq 'the skew chains. steps traced against their prices \(us per step, priced in brackets; ag\* the fastest worker.s\): [0-9]+x[0-9]+: [0-9]+ \([0-9]+\): E [0-9]+ \([0-9]+\), ag\* [0-9]+ \([0-9]+\), D [0-9]+ \([0-9]+\), the rest -?[0-9]+'" "$(echo "$out" | grep -o 'the skew chains.*' | head -1)"

# Between strategies too: `none` after a lossy compress-everything strategy
# gets that strategy's unsent residuals in its first iteration (setPlan()
# folds them), which is not checked; every later iteration must be exact.
# Two rounds (gpu, none, then none, gpu), probed once (--probe-once).
out=$(CORTADO_FAKE_HOST_SIZE=2 timeout 240 "$cortado" launch --mpi -w 4 -s 2 -- "$cortado" bench model \
  --profile "$profile" --codec dgc:ratio=0.1 --strategies gpu,none --iterations 2 --warmup 0 \
  --rounds 2 --probe-once --sync-skew 300,0.5 2>&1)
rc=$?
echo "$out"
check "lossy-then-none run exits 0" "[ $rc = 0 ]" "rc=$rc"
check "none after a lossy strategy exact" "echo \"\$out\" | grep -q '^| none .*| exact (0 lossy tensors)'" "none not exact after gpu"
check "--probe-once: no probe before round 2" "echo \"\$out\" | grep -q 'measured push+pull' && ! echo \"\$out\" | grep -q 'measured (round 2)'" "probed again"
check "--sync-skew set, not measured" "echo \"\$out\" | grep -q 'sync skew: not measured (--sync-skew 300,0.5): 300 us + 0.500 x the work' && echo \"\$out\" | grep -q 'skew at a step after CPU work 300 us + 0.500 x the work'" "$(echo "$out" | grep -i skew)"

# replan: online profiling on (windows of 2 iterations, switch 5 after), the
# scheduler plans with fp16 too, so every plan it hands out is exact here; the
# strategy is timed after the first switch, which must have happened. Two
# rounds: none, replan (online), then replan (the plan it settled on, fixed),
# none; each strategy's iterations of both rounds are timed.
out=$(CORTADO_FAKE_HOST_SIZE=2 CORTADO_PROFILE_WINDOW=2 CORTADO_REPLAN_CODEC=fp16 CORTADO_REPLAN_AHEAD=5 \
  timeout 240 "$cortado" launch --mpi -w 4 -s 2 -- "$cortado" bench model --profile "$profile" \
  --codec fp16 --strategies none,replan --iterations 3 --warmup 1 --rounds 2 --json 2>&1)
rc=$?
echo "$out"
check "replan run exits 0" "[ $rc = 0 ]" "rc=$rc"
line=$(echo "$out" | grep '"strategy":"replan"')
check "replan reported" "[ -n \"\$line\" ]" "no JSON line"
check "replan exact" "echo \"\$line\" | grep -q '\"wrong_elements\":0' && ! echo \"\$line\" | grep -q '\"checked_elements\":0,'" "$line"
# The first window is iterations 1-2, reported at 3: its plan switches at
# 3 + 5 = 8, or the scheduler keeps the offline plan (version 1) when no plan
# is predicted CORTADO_REPLAN_MIN_GAIN faster; timed from 8 either way.
check "replan decided at the first window" "echo \"\$line\" | grep -Eq '\"plan_version\":([1-9]|[1-9][0-9])' && echo \"\$line\" | grep -q '\"switched_at\":8'" "$line"
check "replan summary" "echo \"\$out\" | grep -q replan_speedup_vs_none" "no replan summary line"
check "replan reports what beginIteration took" "echo \"\$line\" | grep -Eq '\"begin_iteration_ms\":[0-9]'" "$line"
for s in none replan; do
  line=$(echo "$out" | grep "\"strategy\":\"$s\"")
  check "$s: 2 rounds of 3 timed iterations" "echo \"\$line\" | grep -q '\"rounds\":2' && echo \"\$line\" | grep -Eq '\"round_ms\":\[[0-9.e+-]+,[0-9.e+-]+\]' && echo \"\$line\" | grep -Eq '\"iteration_ms\":\[([0-9.e+-]+,){5}[0-9.e+-]+\]'" "$line"
done
# Each round probes the links and the codec again (--probe-once not given):
# the round's prediction from its own costs, the strategy's their mean.
check "round 2 probed again" "echo \"\$out\" | grep -q 'measured (round 2) push+pull'" "no probe of round 2"
for s in none replan; do
  line=$(echo "$out" | grep "\"strategy\":\"$s\"")
  check "$s: predicted per round, the mean reported" "echo \"\$line\" | python3 -c '
import json, sys
r = json.loads(sys.stdin.read())
p = r[\"round_predicted_ms\"]
assert len(p) == 2 and min(p) > 0 and abs(sum(p) / 2 - r[\"predicted_ms\"]) < 1e-6 * r[\"predicted_ms\"], r
'" "$line"
done
line=$(echo "$out" | grep '"strategy":"none"')
check "none exact in both rounds" "echo \"\$line\" | grep -q '\"wrong_elements\":0' && ! echo \"\$line\" | grep -q '\"checked_elements\":0,'" "$line"
# Its plan (the scheduler's, fp16 as --codec) is predicted by the run's own costs.
check "replan has a prediction" "echo \"\$line\" | grep -Eq '\"predicted_ms\":[0-9]*[1-9]' && echo \"\$line\" | grep -Eq '\"overlapped_ms\":[0-9]*[1-9]'" "$line"

# gravac: GraVAC in the executor, one batch per iteration, its plan made by
# the planner (measured costs) at every CF that moved 2x. Settings that move
# the CF in a few iterations: the candidate is always sent (epsilon 0.1) and
# scaled every 2 iterations (4x, 8x, 32x, 64x), so it re-plans at least
# twice. `none` after it gets GraVAC's residuals in its first iteration
# (not checked) and must be exact after.
out=$(CORTADO_FAKE_HOST_SIZE=2 timeout 240 "$cortado" launch --mpi -w 4 -s 2 -- "$cortado" bench model \
  --profile "$profile" --codec dgc:ratio=0.1 --strategies gravac,none --iterations 6 --warmup 1 \
  --gravac codec=topk,min_ratio=2,max_ratio=64,window=2,epsilon=0.1,omega=0,alpha=1 --json 2>&1)
rc=$?
echo "$out"
check "gravac run exits 0" "[ $rc = 0 ]" "rc=$rc"
line=$(echo "$out" | grep '"strategy":"gravac"')
check "gravac reported" "[ -n \"\$line\" ]" "no JSON line"
check "gravac re-planned by the planner" "echo \"\$line\" | python3 -c '
import json, sys
r = json.loads(sys.stdin.read())
assert r[\"gravac_replans\"] >= 2, r
assert len(r[\"gravac_ratios\"]) == 6 and len(set(r[\"gravac_ratios\"])) >= 2, r
assert r[\"lossy_tensors\"] == 7 and r[\"predicted_ms\"] is None, r
assert \"re-plans by the planner\" in r[\"options\"], r
'" "$line"
line=$(echo "$out" | grep '"strategy":"none"')
check "none after gravac exact" "echo \"\$line\" | grep -q '\"wrong_elements\":0' && ! echo \"\$line\" | grep -q '\"checked_elements\":0,'" "$line"

# Stage traces of a real run, compared with the predicted timeline.
tdir=$(mktemp -d /tmp/bench-model-trace-XXXXXX)
trap 'rm -rf "$tdir"' EXIT
out=$(CORTADO_FAKE_HOST_SIZE=2 CORTADO_TRACE_ITERATIONS=1:2 timeout 240 "$cortado" launch --mpi -w 4 -s 2 \
  --trace "$tdir/run" -- "$cortado" bench model --profile "$profile" --codec fp16 --strategies plan \
  --iterations 2 --warmup 1 --predicted-trace "$tdir/predicted.json" 2>&1)
rc=$?
check "traced run exits 0" "[ $rc = 0 ]" "rc=$rc: $out"
for f in worker-0 worker-1 worker-2 worker-3 server-0 server-1; do
  check "trace $f written" "[ -s \"$tdir/run/$f.json\" ]" "missing: $(ls "$tdir/run" 2>&1)"
done
check "worker stages use the simulator's names" \
  "grep -q '\"cat\": *\"intra reduce_scatter\"\|\"cat\": *\"intra alltoall\\*\"\|\"cat\": *\"flat ' \"$tdir/run/worker-0.json\"" \
  "$(head -c 600 "$tdir/run/worker-0.json")"
check "only iterations 1 and 2 traced" \
  "! grep -q '\"iteration\": *[03-9]' \"$tdir/run/worker-0.json\"" "$(grep -o '\"iteration\": *[0-9]*' "$tdir/run/worker-0.json" | sort | uniq -c)"
cmp=$("$cortado" trace compare --predicted "$tdir/predicted.json" --measured "$tdir/run" 2>&1)
rc=$?
echo "$cmp"
check "trace compare runs" "[ $rc = 0 ] && echo \"\$cmp\" | grep -q '2 iterations, 4 workers'" "rc=$rc"

# The path of a CUDA device's buffers (CORTADO_DEVICE=cuda), on the host
# device with a thread per stream (--queued-streams): the gradients in device
# buffers apart from the host's staging, copied in and out around each
# iteration, the executor's copies through pinned memory, and the device
# probes (the device's codec, the copies) in the predictions. Every result
# exact (fp16), in one flat buffer and in buffers of their own.
for layout in "" --separate-buffers; do
  out=$(CORTADO_FAKE_HOST_SIZE=2 timeout 240 "$cortado" launch --mpi -w 4 -s 2 -- "$cortado" bench model \
    --profile "$profile" --codec fp16 --strategies none,gpu,cpu,plan --iterations 2 --warmup 1 \
    --queued-streams $layout --json 2>&1)
  rc=$?
  echo "$out"
  check "queued streams $layout: exits 0" "[ $rc = 0 ]" "rc=$rc"
  for s in none gpu cpu plan; do
    line=$(echo "$out" | grep "\"strategy\":\"$s\"")
    check "queued streams $layout: $s exact on the device, predicted" "echo \"\$line\" | grep -q '\"device\":\"host (queued streams)\"' && echo \"\$line\" | grep -q '\"wrong_elements\":0' && ! echo \"\$line\" | grep -q '\"checked_elements\":0,' && echo \"\$line\" | grep -Eq '\"predicted_ms\":[0-9]*[1-9]'" "$line"
  done
  check "queued streams $layout: the device's codec probed" "echo \"\$out\" | grep -q 'measured codec fp16 on host (queued streams) encode/decode per elements: 10:'" "no device codec probe"
  check "queued streams $layout: the copies probed" "echo \"\$out\" | grep -q 'measured copy device to host (pinned host memory): ' && echo \"\$out\" | grep -q 'measured copy host to device (pinned host memory): '" "no copy probes"
done
# A lossy codec there: the uncompressed strategy stays exact after it.
out=$(CORTADO_FAKE_HOST_SIZE=2 timeout 240 "$cortado" launch --mpi -w 4 -s 2 -- "$cortado" bench model \
  --profile "$profile" --codec dgc:ratio=0.1 --strategies gpu,none --iterations 2 --warmup 1 \
  --queued-streams 2>&1)
rc=$?
echo "$out"
check "queued streams, dgc: exits 0" "[ $rc = 0 ]" "rc=$rc"
check "queued streams, dgc: none exact after gpu" "echo \"\$out\" | grep -q '^| none .*| exact (0 lossy tensors)'" "none not exact"
check "queued streams, dgc: the device's dgc probed" "echo \"\$out\" | grep -q 'measured codec dgc:ratio=0.1 on host (queued streams)'" "no device codec probe"

refuse() {  # refuse NAME NEEDLE ARGS...
  local name=$1 needle=$2
  shift 2
  local o
  o=$(timeout 60 "$cortado" bench model "$@" 2>&1)
  local r=$?
  check "$name refused" "[ $r = 2 ] && echo \"\$o\" | grep -q -- \"\$needle\"" "rc=$r: $o"
}
refuse "unknown profile" "unknown model 'nosuch'" --profile nosuch
refuse "unknown strategy" "unknown strategy 'fast'" --profile "$profile" --strategies none,fast
refuse "replan without profiling" "CORTADO_PROFILE_WINDOW" --profile "$profile" --strategies plan,replan
refuse "negative scale" "compute-scale -2" --profile "$profile" --compute-scale -2
refuse "nan scale" "compute-scale nan" --profile "$profile" --compute-scale nan
refuse "no rounds" "rounds 0" --profile "$profile" --rounds 0
refuse "unknown codec" "unknown codec 'zip'" --profile "$profile" --codec zip
refuse "negative skew fraction" "--sync-skew '0,-1': the skew's fraction" --profile "$profile" --sync-skew 0,-1
refuse "malformed skew" "--sync-skew 'fast'" --profile "$profile" --sync-skew fast
refuse "bad gravac epsilon" "epsilon is 2" --profile "$profile" --strategies gravac --gravac epsilon=2
refuse "unknown gravac setting" "unknown setting 'speed'" --profile "$profile" --strategies gravac --gravac speed=3
refuse "outside a job" "cortado launch --mpi" --profile "$profile"
o=$(CORTADO_DEVICE=cuda timeout 60 "$cortado" bench model --profile "$profile" --queued-streams 2>&1)
r=$?
check "--queued-streams with CORTADO_DEVICE=cuda refused" "[ $r = 2 ] && echo \"\$o\" | grep -q 'queued-streams is a mode of the host device'" "rc=$r: $o"
o=$(CORTADO_DEVICE=cuda timeout 60 "$cortado" bench model --profile "$profile" 2>&1)
r=$?
check "CORTADO_DEVICE=cuda without a GPU refused" "[ $r = 2 ] && echo \"\$o\" | grep -Eq 'CORTADO_DEVICE=cuda, but (no CUDA device is visible|this build has no CUDA device)'" "rc=$r: $o"
# Refused inside a job too: every worker exits, the launcher reports it.
o=$(CORTADO_FAKE_HOST_SIZE=2 timeout 120 "$cortado" launch --mpi -w 4 -s 2 -- "$cortado" bench model \
  --profile "$profile" --compute-scale -1 2>&1)
r=$?
check "bad scale in a job exits non-zero" "[ $r != 0 ] && echo \"\$o\" | grep -q 'compute-scale -1'" "rc=$r: $o"
exit $fail

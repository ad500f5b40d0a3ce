#!/usr/bin/env bash
# Push-pull against MPI_Allreduce across emulated hosts (tests/testbed/testbed.sh).
#
#   bench/multihost.sh [options]     (as root)
#
# Builds a testbed of H + K hosts (links shaped with tc tbf at --rate), runs on
# the first H hosts with 1 worker and 1 server per host:
#   1. MPI_Allreduce (bench/mpi/mpi_allreduce_bench under `cortado launch
#      --mpi-only`: the same mpirun and host agent as the Cortado jobs),
#   2. `cortado bench pushpull` (algorithm bandwidth),
#   3. the same with K extra server-only hosts (--server-hosts, 1 server each),
#   4. with --dedicated-hosts D: the servers on D server-only hosts alone
#      (--dedicated-servers), none beside the workers, as in BytePS's setup,
#   5. Horovod's allreduce over Gloo, 1 rank per worker host
#      (bench/horovod_allreduce.py; skipped, with a line saying why, where
#      HOROVOD_PYTHON, default $CORTADO_VENV/bin/python, has no Horovod with
#      Gloo: bench/install_horovod.sh),
# and prints one markdown table: algorithm bandwidth (median over the
# repetitions, with min-max), the ratio to MPI_Allreduce and to the link rate,
# the link-limited bound of each job (from the traffic model with bytes split
# evenly over the servers, and from the bytes the busiest link really carried
# per iteration), and what the monitor saw while data
# moved (bench/multihost_monitor.py): the busiest link's utilization, how many
# of the machine's cores were busy (all processes; softirq is where veth and
# tbf forwarding runs), and the job's own cores, running and runnable-waiting.
# Progress and per-run details go to stderr, the table to stdout.
#
# Options:
#   --rate R              link rate, tc syntax (default 1gbit)
#   --sizes S1,S2,...     tensor sizes, with K/M/G suffixes (default 64M)
#   --reps N              repetitions of each job, interleaved (default 3)
#   --iters N             timed iterations per run (default 5)
#   --warmup N            untimed iterations per run (default 1)
#   --transport T         zmq or ucx (default zmq)
#   --hosts H             worker hosts (default 4)
#   --server-only-hosts K extra hosts with a server and no worker (default 2; 0: skip job 3)
#   --dedicated-hosts D   run job 4 with D server hosts (default 0: skip it)
#   --jobs LIST           only these of mpi,ps,ps_sonly,ps_ded,horovod (default: all
#                         that the host counts and the installed packages allow)
#   --build DIR           build directory (default: build next to this script's parent)
#   --name NAME           testbed name, 1-8 of [a-z0-9] (default: mhb + pid)
#   --save FILE           keep the raw results (bench/multihost_table.py FILE ... reprints the table)
#   --plot FILE           also draw each job's bandwidth as a PNG (matplotlib)
#   --timeline DIR        also write every link's load every 10 ms of each run to
#                         DIR/JOB-BYTES-REP.tsv (bench/link_timeline.py)
set -Eeuo pipefail

PROG=multihost.sh
# shellcheck source=bench/lib_testbed.sh
source "$(dirname "$0")/lib_testbed.sh"
MONITOR=$HERE/multihost_monitor.py
TIMELINE_PY=$HERE/link_timeline.py
PYTHON=${PYTHON:-/usr/bin/python3}

RATE=1gbit SIZES=64M REPS=3 ITERS=5 WARMUP=1 TRANSPORT=zmq HOSTS=4 SONLY=2 DED=0
BUILD=$ROOT/build NAME=mhb$(($$ % 100000)) SAVE="" JOBS=mpi,ps,ps_sonly,ps_ded,horovod PLOT=""
HOROVOD_PYTHON=${HOROVOD_PYTHON:-${CORTADO_VENV:-$ROOT/.venv}/bin/python}
TIMELINE=""

while (($#)); do
  case $1 in
    --rate) need_value "$@"; RATE=$2; shift 2 ;;
    --sizes) need_value "$@"; SIZES=$2; shift 2 ;;
    --reps) need_value "$@"; REPS=$2; shift 2 ;;
    --iters) need_value "$@"; ITERS=$2; shift 2 ;;
    --warmup) need_value "$@"; WARMUP=$2; shift 2 ;;
    --transport) need_value "$@"; TRANSPORT=$2; shift 2 ;;
    --hosts) need_value "$@"; HOSTS=$2; shift 2 ;;
    --server-only-hosts) need_value "$@"; SONLY=$2; shift 2 ;;
    --dedicated-hosts) need_value "$@"; DED=$2; shift 2 ;;
    --jobs) need_value "$@"; JOBS=$2; shift 2 ;;
    --build) need_value "$@"; BUILD=$2; shift 2 ;;
    --name) need_value "$@"; NAME=$2; shift 2 ;;
    --save) need_value "$@"; SAVE=$2; shift 2 ;;
    --plot) need_value "$@"; PLOT=$(realpath -m "$2"); shift 2 ;;
    --timeline) need_value "$@"; TIMELINE=$(realpath -m "$2"); shift 2 ;;
    -h | --help) usage 0 ;;
    *) die "unknown option '$1' (see --help)" ;;
  esac
done

rate_bps() {
  local r=${1,,}
  [[ $r =~ ^([0-9]+)(kbit|mbit|gbit)$ ]] || die "rate '$1' is not of the form <number>{kbit,mbit,gbit}, e.g. 1gbit or 300mbit"
  local n=${BASH_REMATCH[1]}
  case ${BASH_REMATCH[2]} in
    kbit) echo $((n * 1000)) ;; mbit) echo $((n * 1000000)) ;; gbit) echo $((n * 1000000000)) ;;
  esac
}

is_count "$REPS" 1 100 || die "--reps must be 1 to 100 (got '$REPS')"
is_count "$ITERS" 1 10000 || die "--iters must be 1 to 10000 (got '$ITERS')"
is_count "$WARMUP" 0 10000 || die "--warmup must be 0 to 10000 (got '$WARMUP')"
is_count "$HOSTS" 2 8 || die "--hosts must be 2 to 8 (got '$HOSTS')"
is_count "$SONLY" 0 6 || die "--server-only-hosts must be 0 to 6 (got '$SONLY')"
is_count "$DED" 0 6 || die "--dedicated-hosts must be 0 to 6 (got '$DED')"
IFS=, read -ra JOB_LIST <<<"$JOBS"
for j in "${JOB_LIST[@]}"; do
  [[ $j =~ ^(mpi|ps|ps_sonly|ps_ded|horovod)$ ]] ||
    die "--jobs: unknown job '$j' (mpi, ps, ps_sonly, ps_ded, horovod)"
done
want() { [[ ,$JOBS, == *,$1,* ]]; }
EXTRA=$((SONLY > DED ? SONLY : DED))
((HOSTS + EXTRA <= 8)) ||
  die "--hosts + the larger of --server-only-hosts and --dedicated-hosts is $((HOSTS + EXTRA)); the testbed has at most 8 hosts"
[[ $TRANSPORT == zmq || $TRANSPORT == ucx ]] || die "--transport must be zmq or ucx (got '$TRANSPORT')"
check_name
RATE_BPS=$(rate_bps "$RATE")
IFS=, read -r -a SIZE_LIST <<<"$SIZES"
BYTES_LIST=()
for s in "${SIZE_LIST[@]}"; do
  n=$(to_bytes "$s")
  ((n >= 4)) || die "size '$s' is smaller than one float32"
  BYTES_LIST+=("$n")
done

[[ $(id -u) -eq 0 ]] ||
  die "must run as root: the emulated hosts are network namespaces with veth pairs and tc (try: sudo $0 $*)"
CORTADO=$BUILD/launcher/cortado
MPIBENCH=$BUILD/bench/mpi/mpi_allreduce_bench
[[ -z $SAVE ]] || touch "$SAVE" 2>/dev/null || die "--save $SAVE: cannot write there"
[[ -z $TIMELINE ]] || { mkdir -p "$TIMELINE" && [[ -w $TIMELINE ]]; } ||
  die "--timeline $TIMELINE: cannot make or write that folder"
[[ -z $PLOT ]] || "$PYTHON" -c 'import matplotlib' 2>/dev/null ||
  die "--plot needs matplotlib (scripts/install_deps.sh installs Debian's python3-matplotlib)"
for f in "$CORTADO" "$MPIBENCH"; do
  [[ -x $f ]] || die "$f is missing: build it first (ninja -C $BUILD cortado mpi_allreduce_bench) or pass --build DIR"
done
command -v mpirun >/dev/null || die "mpirun is not installed (scripts/install_deps.sh installs OpenMPI)"
[[ -x $PYTHON ]] || die "$PYTHON is missing (set PYTHON to a python3)"
HAVE_HOROVOD=""
if want horovod; then
  if "$HOROVOD_PYTHON" -c 'import horovod.torch as h; assert h.gloo_built()' 2>/dev/null; then
    HAVE_HOROVOD=$("$HOROVOD_PYTHON" -c 'import horovod; print(horovod.__version__)')
  else
    echo "# horovod: skipped: horovod.torch (with Gloo) does not import in $HOROVOD_PYTHON;" \
      "bench/install_horovod.sh installs Horovod 0.28.1 (HOROVOD_PYTHON names another interpreter)" >&2
  fi
fi

OUT=$(mktemp -d /tmp/cortado-multihost.XXXXXX)
MON_PID="" JOB_PID="" TL_PID=""
bench_cleanup() {
  [[ -n $JOB_PID ]] && kill "$JOB_PID" 2>/dev/null  # timeout passes it on to the launcher
  [[ -n $MON_PID ]] && kill "$MON_PID" 2>/dev/null && wait "$MON_PID" 2>/dev/null
  [[ -n $TL_PID ]] && kill "$TL_PID" 2>/dev/null && wait "$TL_PID" 2>/dev/null
  return 0
}
bench_cleanup_after() { rm -rf "$OUT"; }
tb_traps

NTOTAL=$((HOSTS + EXTRA))
tb_up "$NTOTAL" "$RATE" >/dev/null
WORKER_HOSTS=$(tb_hosts 1 "$HOSTS")
SERVER_HOSTS=$( ((SONLY)) && tb_hosts $((HOSTS + 1)) $((HOSTS + SONLY)) || true)
DED_HOSTS=$( ((DED)) && tb_hosts $((HOSTS + 1)) $((HOSTS + DED)) || true)
AGENT="$TB exec-host {host}"

# "OVERLIMITS,DROPPED" summed over every link's tbf, both directions:
# overlimits grow while a link runs at its rate (packets held back), drops
# when its queue (50 ms at the rate) overflows.
tbf_counts() {
  local i
  for ((i = 1; i <= NTOTAL; i++)); do
    tc -s qdisc show dev "${NAME}v$i"
    tc -n "$NAME-h$i" -s qdisc show dev eth0
  done | awk '{ for (i = 1; i < NF; i++) { if ($i == "overlimits") o += $(i + 1); if ($i == "(dropped") d += $(i + 1) } }
              END { printf "%d,%d\n", o, d }'
}

# run JOB BYTES REP: runs one job, appends "JOB BYTES algbw monitor-json" to $OUT/results.
run() {
  local job=$1 bytes=$2 rep=$3
  # Generous deadline: 20x the time the data would take at the link rate, plus start-up.
  local limit=$((120 + (ITERS + WARMUP) * bytes * 8 * 20 / RATE_BPS))
  local cmd
  case $job in
    mpi)
      cmd=("$CORTADO" launch --mpi-only --hosts "$WORKER_HOSTS" -w 1 --agent "$AGENT" --
        "$MPIBENCH" --min-bytes "$bytes" --max-bytes "$bytes" --iters "$ITERS" --warmup "$WARMUP") ;;
    ps)
      cmd=("$CORTADO" launch --hosts "$WORKER_HOSTS" -w 1 -s 1 --transport "$TRANSPORT" --agent "$AGENT" --
        "$CORTADO" bench pushpull -b "$bytes" -e "$bytes" -n "$ITERS" --warmup "$WARMUP" --json) ;;
    ps_sonly)
      cmd=("$CORTADO" launch --hosts "$WORKER_HOSTS" --server-hosts "$SERVER_HOSTS" -w 1 -s 1
        --transport "$TRANSPORT" --agent "$AGENT" --
        "$CORTADO" bench pushpull -b "$bytes" -e "$bytes" -n "$ITERS" --warmup "$WARMUP" --json) ;;
    ps_ded)
      cmd=("$CORTADO" launch --hosts "$WORKER_HOSTS" --server-hosts "$DED_HOSTS" --dedicated-servers
        -w 1 -s 1 --transport "$TRANSPORT" --agent "$AGENT" --
        "$CORTADO" bench pushpull -b "$bytes" -e "$bytes" -n "$ITERS" --warmup "$WARMUP" --json) ;;
    horovod)
      cmd=("$HOROVOD_PYTHON" "$HERE/horovod_allreduce.py" --hosts "$WORKER_HOSTS" --agent "$AGENT"
        --bytes "$bytes" --iters "$ITERS" --warmup "$WARMUP" --timeout "$limit") ;;
  esac
  "$PYTHON" "$MONITOR" --name "$NAME" --hosts "$NTOTAL" --rate-bps "$RATE_BPS" >"$OUT/mon" &
  MON_PID=$!
  if [[ -n $TIMELINE ]]; then
    "$PYTHON" "$TIMELINE_PY" --name "$NAME" --hosts "$NTOTAL" --rate-bps "$RATE_BPS" \
      --out "$TIMELINE/$job-$bytes-$rep.tsv" &
    TL_PID=$!
  fi
  local tc0 rc=0
  tc0=$(tbf_counts)
  # In the background and waited for, so that a signal to this script runs
  # its trap at once (bash defers traps while a foreground child runs).
  CORTADO_LOG_LEVEL=warn "$TB" exec "$NAME" 1 timeout -s KILL "$limit" "${cmd[@]}" >"$OUT/log" 2>&1 &
  JOB_PID=$!
  wait "$JOB_PID" || rc=$?
  JOB_PID=""
  local tc1 ol
  tc1=$(tbf_counts)
  ol="$((${tc1%,*} - ${tc0%,*})),$((${tc1#*,} - ${tc0#*,}))"
  kill "$MON_PID"
  wait "$MON_PID" || true
  MON_PID=""
  if [[ -n $TL_PID ]]; then
    kill "$TL_PID"
    wait "$TL_PID" || true
    TL_PID=""
  fi
  if ((rc != 0)); then
    echo "---- $job ($bytes bytes) output ----" >&2
    tail -40 "$OUT/log" >&2
    ((rc == 137)) && die "$job at $bytes bytes did not finish within $limit s (killed)"
    die "$job at $bytes bytes failed (exit $rc); its output is above"
  fi
  local line
  line=$(grep -m1 '^{"size_bytes"' "$OUT/log") || die "$job printed no result line: $(tail -5 "$OUT/log")"
  [[ $line == *'"ok": true'* ]] || die "$job at $bytes bytes computed wrong sums: $line"
  local algbw
  algbw=$(sed -n 's/.*"algbw_gbps": \([0-9.]*\).*/\1/p' <<<"$line")
  local mon
  mon=$(cat "$OUT/mon")
  echo "$job $bytes $algbw $ol $mon" >>"$OUT/results"
  echo "# rep $rep $job $bytes B: algbw $algbw GB/s, tbf overlimits,drops $ol, monitor $mon" >&2
}

for bytes in "${BYTES_LIST[@]}"; do
  for ((rep = 1; rep <= REPS; rep++)); do
    want mpi && run mpi "$bytes" "$rep"
    want ps && run ps "$bytes" "$rep"
    ((SONLY)) && want ps_sonly && run ps_sonly "$bytes" "$rep"
    ((DED)) && want ps_ded && run ps_ded "$bytes" "$rep"
    [[ -n $HAVE_HOROVOD ]] && run horovod "$bytes" "$rep"
  done
done

# The table (bench/multihost_table.py, which also re-reads a saved --save file).
[[ -n $SAVE ]] && cp "$OUT/results" "$SAVE"
"$PYTHON" "$HERE/multihost_table.py" "$OUT/results" --rate "$RATE" --hosts "$HOSTS" --server-only-hosts "$SONLY" \
  --dedicated-hosts "$DED" --transport "$TRANSPORT" --iters "$ITERS" --warmup "$WARMUP" --reps "$REPS" \
  --load "$(cut -d' ' -f1-3 /proc/loadavg)" |
  tee "$OUT/table.md"
[[ -z $PLOT ]] || "$PYTHON" "$HERE/plot_figures.py" --table "$OUT/table.md" "$PLOT" --x job --x size \
  --y "algbw (GB/s)" --note "Push-pull and MPI_Allreduce on $HOSTS emulated hosts at $RATE: algorithm bandwidth (median)"

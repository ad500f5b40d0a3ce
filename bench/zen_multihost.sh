#!/usr/bin/env bash
# Zen's sparse push/pull against its peers across emulated hosts
# (tests/testbed/testbed.sh; the machinery of bench/multihost.sh).
#
#   bench/zen_multihost.sh [options]     (as root)
#
# Builds a testbed of H hosts (links shaped with tc tbf at --rate) and runs
# one job on it, 1 worker and 1 server per host, the workers under the
# launcher's mpirun: `cortado bench sparse` times, per density and in the
# same run, Zen (push of hashed COO pairs, pull of hash bitmaps), dense
# push/pull of the tensor, an allgather of the pairs (MPI_Allgatherv) and
# MPI_Allreduce of the dense tensor, checks every sum, and prints a markdown
# table with the ratios to Zen. This script adds the date, the command and
# the load average.
#
# Options:
#   --rate R          link rate, tc syntax (default 1gbit)
#   --elements N      float32 elements of the tensor (default 16777216)
#   --densities D     percent non-zero per worker, comma-separated (default 0.1,1,5)
#   --iters N         timed iterations per density (default 5)
#   --warmup N        untimed iterations per density (default 1)
#   --hosts H         hosts (default 4)
#   --transport T     zmq or ucx (default zmq)
#   --build DIR       build directory (default: build next to this script's parent)
#   --name NAME       testbed name, 1-8 of [a-z0-9] (default: zen + pid)
#   --plot FILE       also draw each method's time per density as a PNG (matplotlib)
set -Eeuo pipefail

PROG=zen_multihost.sh
# shellcheck source=bench/lib_testbed.sh
source "$(dirname "$0")/lib_testbed.sh"
RATE=1gbit ELEMENTS=16777216 DENSITIES=0.1,1,5 ITERS=5 WARMUP=1 HOSTS=4 TRANSPORT=zmq
BUILD=$ROOT/build NAME=zen$(($$ % 100000)) PLOT=""

while (($#)); do
  case $1 in
    --rate) need_value "$@"; RATE=$2; shift 2 ;;
    --elements) need_value "$@"; ELEMENTS=$2; shift 2 ;;
    --densities) need_value "$@"; DENSITIES=$2; shift 2 ;;
    --iters) need_value "$@"; ITERS=$2; shift 2 ;;
    --warmup) need_value "$@"; WARMUP=$2; shift 2 ;;
    --hosts) need_value "$@"; HOSTS=$2; shift 2 ;;
    --transport) need_value "$@"; TRANSPORT=$2; shift 2 ;;
    --build) need_value "$@"; BUILD=$2; shift 2 ;;
    --name) need_value "$@"; NAME=$2; shift 2 ;;
    --plot) need_value "$@"; PLOT=$(realpath -m "$2"); shift 2 ;;
    -h | --help) usage 0 ;;
    *) die "unknown option '$1' (see --help)" ;;
  esac
done
[[ $ELEMENTS =~ ^[0-9]+$ ]] || die "--elements must be a number (got '$ELEMENTS')"
[[ $HOSTS =~ ^[2-8]$ ]] || die "--hosts must be 2 to 8 (got '$HOSTS')"
check_name
[[ $(id -u) -eq 0 ]] || die "must run as root: the emulated hosts are network namespaces (try: sudo $0 $*)"
CORTADO=$BUILD/launcher/cortado
[[ -x $CORTADO ]] || die "$CORTADO is missing: build it first (ninja -C $BUILD cortado)"
command -v mpirun >/dev/null || die "mpirun is not installed (scripts/install_deps.sh installs OpenMPI)"
[[ -z $PLOT ]] || /usr/bin/python3 -c 'import matplotlib' 2>/dev/null ||
  die "--plot needs matplotlib (scripts/install_deps.sh installs Debian's python3-matplotlib)"
TABLE=$(mktemp)

bench_cleanup_after() { rm -f "$TABLE"; }
tb_traps

tb_up "$HOSTS" "$RATE" >/dev/null
HOST_LIST=$(tb_hosts 1 "$HOSTS")
# Generous: every method moves at most the dense tensor a few times per iteration.
LIMIT=$((300 + (ITERS + WARMUP) * 4 * ELEMENTS * 8 * 12 / 1000000000 * 4))
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# bench/zen_multihost.sh --rate $RATE --elements $ELEMENTS --densities $DENSITIES --iters $ITERS --warmup $WARMUP --hosts $HOSTS --transport $TRANSPORT"
CORTADO_LOG_LEVEL=warn "$TB" exec "$NAME" 1 timeout -s KILL "$LIMIT" "$CORTADO" launch --hosts "$HOST_LIST" \
  -w 1 -s 1 --transport "$TRANSPORT" --agent "$TB exec-host {host}" -- \
  "$CORTADO" bench sparse --elements "$ELEMENTS" --densities "$DENSITIES" --iters "$ITERS" --warmup "$WARMUP" |
  tee "$TABLE"
echo "# load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
[[ -z $PLOT ]] || /usr/bin/python3 "$HERE/plot_figures.py" --table "$TABLE" "$PLOT" --x "density/worker" \
  --y "Zen ms" --y "Zen-MPI BP ms" --y "Zen-MPI HC ms" --y "dense push/pull ms" --y "allgather pairs ms" \
  --y "MPI_Allreduce ms" --log \
  --note "Zen against its peers, $ELEMENTS float32 elements, $HOSTS emulated hosts at $RATE: ms per iteration by density per worker"

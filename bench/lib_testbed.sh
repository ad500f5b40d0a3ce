# shellcheck shell=bash
# Shared by the benchmarks that run on emulated hosts (bench/multihost.sh,
# zen_multihost.sh, zen_train_multihost.sh, train.sh, model.sh): option checks, the
# testbed's start (tests/testbed/testbed.sh) and its tear-down on exit or a
# signal. Sourced after the script set
#   PROG  its name in messages ("multihost.sh")
# It sets HERE (bench/), ROOT and TB (testbed.sh's path).
# The testbed's name is the script's NAME; a script with more to clean up
# defines bench_cleanup (run first: stop jobs) and bench_cleanup_after (run
# last: copy or remove files), then calls tb_traps.

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(dirname "$HERE")
TB=$ROOT/tests/testbed/testbed.sh
TB_UP=""

die() {
  echo "$PROG: $*" >&2
  exit 2
}
# usage [STATUS]: the script's first comment block, without the #! line.
usage() {
  awk 'NR > 1 && !/^#/ { exit } NR > 1' "$0" | sed 's/^# \{0,1\}//'
  exit "${1:-2}"
}
need_value() { [[ $# -ge 2 && -n $2 ]] || die "$1 needs a value (see --help)"; }
is_count() { [[ $1 =~ ^[0-9]+$ ]] && (($1 >= $2 && $1 <= $3)); }
check_name() {
  [[ $NAME =~ ^[a-z0-9]{1,8}$ ]] || die "--name must be 1 to 8 characters of a-z and 0-9 (got '$NAME')"
}

# Converts 64M, 512K, 1G or a plain number to bytes.
to_bytes() {
  local s=${1^^}
  [[ $s =~ ^([0-9]+)([KMG]?)I?B?$ ]] || die "size '$1' is not a number with an optional K, M or G suffix"
  local n=${BASH_REMATCH[1]}
  case ${BASH_REMATCH[2]} in
    K) n=$((n << 10)) ;; M) n=$((n << 20)) ;; G) n=$((n << 30)) ;;
  esac
  echo "$n"
}

# codec_threads_per_host HOSTS: an emulated host's codec threads
# (CORTADO_CODEC_THREADS, docs/executor.md) where each host sees every core
# of this machine: the cores over twice the hosts, at least 1, as a host of
# its own with a worker and a server would get.
codec_threads_per_host() {
  local n=$(($(nproc) / (2 * $1)))
  echo $((n > 0 ? n : 1))
}

# tb_up HOSTS RATE: brings testbed NAME up with HOSTS hosts whose links run
# at RATE; testbed.sh's host table (index, host, address) goes to stdout.
tb_up() {
  echo "# testbed $NAME: $1 hosts at $2" >&2
  TB_UP=1
  "$TB" up "$NAME" "$1" --rate "$2"
}

# tb_hosts FIRST LAST: "NAME-hFIRST,...,NAME-hLAST", the names the launcher's
# --hosts takes.
tb_hosts() { seq -s, -f "$NAME-h%g" "$1" "$2"; }

tb_cleanup() {
  local rc=$?
  trap - EXIT INT TERM HUP
  if declare -F bench_cleanup >/dev/null; then bench_cleanup; fi
  if [[ -n $TB_UP ]]; then
    "$TB" down "$NAME" >/dev/null 2>&1 || echo "$PROG: 'testbed.sh down $NAME' failed" >&2
  fi
  if declare -F bench_cleanup_after >/dev/null; then bench_cleanup_after; fi
  exit "$rc"
}

# Tears the testbed down at exit and on a signal (exit status 128 + signal).
tb_traps() {
  trap tb_cleanup EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  trap 'exit 129' HUP
}

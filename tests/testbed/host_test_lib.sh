# Shared by the ctests that run jobs on emulated hosts (launch_hosts_test.sh,
# replan_hosts_test.sh); sourced after the script set
#   TB    testbed.sh's path
#   NAME  this test's testbed name
#   OUT   its temporary directory (removed at exit)
# It sets FAILED=0 and job="" (a background job's pid, killed at exit when
# set), installs the clean-up trap, and skips (exit 77, with the reason)
# where the test cannot run: not root, no mpirun, no network namespaces.
# left_in_hosts lists the processes still in hosts 1..$hosts.

FAILED=0
job=""

fail() {
  echo "FAIL: $*" >&2
  FAILED=1
}
skip() {
  echo "SKIP: $*"
  exit 77
}
cleanup() {
  [[ -n $job ]] && kill "$job" 2>/dev/null
  "$TB" down "$NAME" >/dev/null 2>&1 || true
  rm -rf "$OUT"
}
trap cleanup EXIT

[[ $(id -u) -eq 0 ]] || skip "the emulated hosts need root (network namespaces, veth pairs, tc); run ctest as root"
command -v mpirun >/dev/null || skip "mpirun is not installed (scripts/install_deps.sh installs OpenMPI)"
if ! err=$(ip netns add "${NAME}x" 2>&1); then
  skip "this machine does not allow network namespaces ('ip netns add' failed: $err)"
fi
ip netns del "${NAME}x"

left_in_hosts() {
  local i pids=""
  for ((i = 1; i <= hosts; i++)); do pids+=$(ip netns pids "$NAME-h$i" 2>/dev/null | tr '\n' ' '); done
  echo "$pids"
}

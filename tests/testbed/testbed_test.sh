#!/usr/bin/env bash
# ctest: the emulated-host test-bed (testbed.sh). Brings up 2 hosts at
# 1 Gbit/s, checks that each sees its own hostname and address and resolves
# the other's name, pings across, measures a TCP transfer (iperf3) against the
# shaped rate, checks the argument errors, tears down and verifies that
# nothing is left. Fails, saying why, where this machine cannot build
# network namespaces.
set -uo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
TB=$HERE/testbed.sh
NAME=t$(printf '%04x%03x' $((RANDOM % 65536)) $(($$ % 4096)))
FAILED=0

fail() {
  echo "FAIL: $*" >&2
  FAILED=1
}
fatal() {
  echo "FAIL: $*" >&2
  exit 1
}

cleanup() {
  "$TB" down "$NAME" >/dev/null 2>&1 || true
}
trap cleanup EXIT

[[ $(id -u) -eq 0 ]] || fatal "the test-bed needs root (network namespaces, veth pairs, tc); run ctest as root"
for t in ip tc ping iperf3 unshare nsenter; do
  command -v "$t" >/dev/null || fatal "'$t' is not installed; run scripts/install_deps.sh"
done
probe=${NAME}x
if ! err=$(ip netns add "$probe" 2>&1); then
  fatal "this machine does not allow network namespaces ('ip netns add' failed: $err)"
fi
ip netns del "$probe"

# --- argument errors ---------------------------------------------------------
expect_error() {
  local want=$1
  shift
  local out
  if out=$("$TB" "$@" 2>&1); then
    fail "testbed.sh $* succeeded, expected an error mentioning '$want'"
  elif [[ $out != *"$want"* ]]; then
    fail "testbed.sh $* said '$out', expected it to mention '$want'"
  fi
}
expect_error "2 to 8" up "$NAME" 9
expect_error "not a testbed hostname" exec-host "Bad_Host" true
expect_error "1 to 8 characters" up "Bad_Name" 2
expect_error "rate 'fast'" up "$NAME" 2 --rate fast
expect_error "lists 1 rates for 2 hosts" up "$NAME" 2 --rates 1gbit
expect_error "no testbed named" exec "$NAME" 1 true
"$TB" leftovers "$NAME" >/dev/null || fail "a refused 'up' left parts behind: $("$TB" leftovers "$NAME")"

# --- up ----------------------------------------------------------------------
echo "bringing up testbed $NAME: 2 hosts at 1gbit"
"$TB" up "$NAME" 2 --rate 1gbit || fatal "testbed.sh up failed"
expect_error "exists already" up "$NAME" 2
expect_error "not one of 1..2" exec "$NAME" 3 true
mapfile -t hosts < <("$TB" info "$NAME")
((${#hosts[@]} == 2)) || fatal "info lists ${#hosts[@]} hosts, expected 2"
read -r _ h1 a1 _ <<<"${hosts[0]}"
read -r _ h2 a2 _ <<<"${hosts[1]}"
[[ $a1 != "$a2" && $h1 != "$h2" ]] || fail "hosts share a name or an address: ${hosts[*]}"

for i in 1 2; do
  read -r _ want_host want_addr _ <<<"${hosts[i - 1]}"
  got_host=$("$TB" exec "$NAME" "$i" hostname)
  [[ $got_host == "$want_host" ]] || fail "host $i: hostname is '$got_host', expected '$want_host'"
  got_addr=$("$TB" exec "$NAME" "$i" ip -4 -o addr show dev eth0 | awk '{print $4}')
  [[ $got_addr == "$want_addr/24" ]] || fail "host $i: eth0 has '$got_addr', expected '$want_addr/24'"
  other=$((3 - i))
  read -r _ other_host other_addr _ <<<"${hosts[other - 1]}"
  resolved=$("$TB" exec "$NAME" "$i" getent hosts "$other_host" | awk '{print $1}')
  [[ $resolved == "$other_addr" ]] || fail "host $i resolves $other_host to '$resolved', expected $other_addr"
done
[[ $(hostname) != "$h1" ]] || fail "the root namespace's hostname changed to $h1"

"$TB" exec "$NAME" 1 ping -c 2 -W 2 "$a2" >/dev/null || fail "host 1 cannot ping host 2 ($a2)"
"$TB" exec "$NAME" 2 ping -c 2 -W 2 "$h1" >/dev/null || fail "host 2 cannot ping host 1 by name ($h1)"

# --- exec by hostname, and the link helper -------------------------------------
got=$("$TB" exec-host "$h2" hostname)
[[ $got == "$h2" ]] || fail "exec-host $h2 ran on '$got'"
# From inside host 1 too (how a launcher on host 1 reaches host 2).
got=$("$TB" exec "$NAME" 1 "$TB" exec-host "$h2" hostname)
[[ $got == "$h2" ]] || fail "exec-host $h2 from host 1 ran on '$got'"
expect_error "must be 'down' or 'up'" link "$NAME" 2 sideways
"$TB" link "$NAME" 2 down || fail "link $NAME 2 down failed"
"$TB" exec "$NAME" 1 ping -c 1 -W 1 "$a2" >/dev/null 2>&1 && fail "host 1 still reaches host 2 with its link down"
"$TB" link "$NAME" 2 up || fail "link $NAME 2 up failed"
ok=0
for _ in $(seq 20); do
  "$TB" exec "$NAME" 1 ping -c 1 -W 1 "$a2" >/dev/null 2>&1 && { ok=1; break; }
done
((ok)) || fail "host 1 does not reach host 2 again after link up"

# --- shaped throughput ---------------------------------------------------------
# A 4-second TCP transfer from host 1 to host 2 must land near 1 Gbit/s: not
# above it (the shaping works) and not far below it (the link is usable at
# that rate). Generous bounds: the machine running the test may be busy.
port=$((20000 + RANDOM % 20000))
"$TB" exec "$NAME" 2 timeout 30 iperf3 -s -1 -p "$port" >/dev/null 2>&1 &
server=$!
ok=0
for _ in $(seq 50); do
  if "$TB" exec "$NAME" 2 sh -c "ss -ltn | grep -q ':$port '"; then ok=1; break; fi
  sleep 0.1
done
((ok)) || fail "iperf3 server on host 2 did not start listening on port $port within 5 s"
json=$("$TB" exec "$NAME" 1 timeout 30 iperf3 -c "$a2" -p "$port" -t 4 -O 1 -J 2>&1)
wait "$server" 2>/dev/null || true
bps=$(printf '%s' "$json" | python3 -c 'import json,sys; print(int(json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"]))' 2>/dev/null)
if [[ -z $bps ]]; then
  fail "iperf3 from host 1 to host 2 gave no result: $json"
else
  echo "measured $((bps / 1000000)) Mbit/s host 1 -> host 2 through a 1 Gbit/s tbf"
  ((bps <= 1100000000)) || fail "measured $bps bit/s, above the 1 Gbit/s shaping (+10%): tbf is not limiting"
  ((bps >= 600000000)) || fail "measured $bps bit/s, below 60% of the shaped 1 Gbit/s"
fi

# --- changing a link's rate mid-run (testbed.sh rate) --------------------------
expect_error "is not one of 1..2" rate "$NAME" 3 100mbit
expect_error "rate 'fast'" rate "$NAME" 2 fast
"$TB" rate "$NAME" 2 100mbit || fail "rate $NAME 2 100mbit failed"
tc qdisc show dev "${NAME}v2" | grep -q "rate 100Mbit" || fail "bridge end of host 2: $(tc qdisc show dev "${NAME}v2")"
tc -n "$NAME-h2" qdisc show dev eth0 | grep -q "rate 100Mbit" || fail "eth0 of host 2: $(tc -n "$NAME-h2" qdisc show dev eth0)"
"$TB" info "$NAME" | grep -q "^2 .* 100mbit$" || fail "info does not show host 2 at 100mbit: $("$TB" info "$NAME")"
port=$((20000 + RANDOM % 20000))
"$TB" exec "$NAME" 2 timeout 30 iperf3 -s -1 -p "$port" >/dev/null 2>&1 &
server=$!
for _ in $(seq 50); do
  "$TB" exec "$NAME" 2 sh -c "ss -ltn | grep -q ':$port '" && break
  sleep 0.1
done
json=$("$TB" exec "$NAME" 1 timeout 30 iperf3 -c "$a2" -p "$port" -t 3 -O 1 -J 2>&1)
wait "$server" 2>/dev/null || true
bps=$(printf '%s' "$json" | python3 -c 'import json,sys; print(int(json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"]))' 2>/dev/null)
if [[ -z $bps ]]; then
  fail "iperf3 after the rate change gave no result: $json"
else
  echo "measured $((bps / 1000000)) Mbit/s host 1 -> host 2 after changing host 2 to 100 Mbit/s"
  ((bps <= 110000000)) || fail "measured $bps bit/s, above the new 100 Mbit/s (+10%)"
  ((bps >= 60000000)) || fail "measured $bps bit/s, below 60% of the new 100 Mbit/s"
fi

# --- an OpenMPI session directory left by a killed mpirun on host 2 ----------
# (as a daemon killed with a cut-off job leaves it); down removes it.
if command -v mpirun >/dev/null; then
  session="${TMPDIR:-/tmp}/ompi.$NAME-h2.$(id -u)"
  "$TB" exec "$NAME" 2 mpirun --allow-run-as-root -np 1 sleep 30 >/dev/null 2>&1 &
  mpi=$!
  for _ in $(seq 100); do [[ -d $session ]] && break; sleep 0.1; done
  [[ -d $session ]] || fail "mpirun on host 2 made no session directory $session within 10 s"
  pkill -KILL -f "mpirun --allow-run-as-root -np 1 sleep 30" 2>/dev/null
  wait "$mpi" 2>/dev/null
  [[ -d $session ]] || fail "the killed mpirun removed its session directory: nothing for down to check"
  left=$("$TB" leftovers "$NAME" || true)
  [[ $left == *"OpenMPI session directory"* ]] || fail "leftovers does not list $session: $left"
fi

# --- down --------------------------------------------------------------------
"$TB" down "$NAME" || fail "testbed.sh down failed"
if ! left=$("$TB" leftovers "$NAME"); then
  fail "after down, parts remain: $left"
fi
"$TB" down "$NAME" || fail "a second down (nothing left) failed"

if ((FAILED)); then
  echo "testbed test FAILED" >&2
  exit 1
fi
echo "testbed test passed"

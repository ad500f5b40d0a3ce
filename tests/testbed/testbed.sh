#!/usr/bin/env bash
# Emulated hosts on one machine, for multi-machine tests and benchmarks.
#
#   testbed.sh up NAME N [--rate R | --rates R1,R2,...]   build N (2..8) hosts
#   testbed.sh exec NAME I CMD...                          run CMD on host I (1..N)
#   testbed.sh exec-host HOSTNAME CMD...                   the same by hostname (NAME-hI)
#   testbed.sh link NAME I down|up                         cut or restore host I's link
#   testbed.sh rate NAME I R                               change host I's shaped rate (both ends)
#   testbed.sh info NAME                                   print "I HOSTNAME ADDRESS RATE" per host
#   testbed.sh down NAME                                   remove everything (idempotent)
#   testbed.sh leftovers NAME                              print what of NAME remains; exit 1 if any
#
# Host I is a network namespace NAME-hI whose eth0 is one end of a veth pair;
# the other end is on the bridge NAME-br, which holds .1 of the testbed's /24
# (so the root namespace reaches every host). Host I has address .(10+I) and
# hostname NAME-hI: a persistent UTS namespace (unshare --uts=FILE) entered by
# `exec`, plus /etc/netns/NAME-hI/{hostname,hosts}, which `ip netns exec`
# mounts over /etc so that every host resolves every other host's name.
# Each link is shaped in both directions with tc tbf (no netem on this kernel)
# at R (tc's rate syntax: 1gbit, 10gbit, 500mbit; default 1gbit).
#
# NAME keeps parallel testbeds apart: at most 8 characters of [a-z0-9] (it
# prefixes interface names, which Linux limits to 15). The subnet is chosen
# from 10.201.0.0/16..10.250.0.0/16 so that it is free. Needs root (or
# CAP_NET_ADMIN and CAP_SYS_ADMIN), iproute2 and util-linux.
set -Eeuo pipefail

STATE_ROOT=${CORTADO_TESTBED_STATE:-/run/cortado-testbed}
MAX_HOSTS=8

die() {
  echo "testbed: $*" >&2
  exit 2
}

check_name() {
  [[ $1 =~ ^[a-z0-9]{1,8}$ ]] || die "name '$1' must be 1 to 8 characters of a-z and 0-9 (it prefixes interface names)"
}

need_tools() {
  local t
  for t in ip tc unshare nsenter mount umount; do
    command -v "$t" >/dev/null || die "'$t' is not installed (scripts/install_deps.sh installs iproute2 and util-linux)"
  done
  [[ $(id -u) -eq 0 ]] || die "must run as root: network namespaces, veth pairs and tc need CAP_NET_ADMIN and CAP_SYS_ADMIN"
}

# Converts a tc rate (1gbit, 500mbit, 10gbit, 100kbit) to bits per second.
rate_bps() {
  local r=${1,,}
  [[ $r =~ ^([0-9]+)(bit|kbit|mbit|gbit)$ ]] || die "rate '$1' is not of the form <number>{bit,kbit,mbit,gbit}"
  local n=${BASH_REMATCH[1]} u=${BASH_REMATCH[2]}
  case $u in
    bit) echo "$n" ;;
    kbit) echo $((n * 1000)) ;;
    mbit) echo $((n * 1000000)) ;;
    gbit) echo $((n * 1000000000)) ;;
  esac
}

# Shapes egress of DEV (in namespace NS, or the root one when NS is empty).
shape() {
  local ns=$1 dev=$2 rate=$3
  local bps
  bps=$(rate_bps "$rate")
  # tbf needs a bucket of at least rate / HZ bytes to reach its rate; 4 ms of
  # traffic covers HZ >= 250, and never less than 64 KiB (one GSO segment).
  local burst=$((bps / 8 / 250))
  ((burst < 65536)) && burst=65536
  if [[ -n $ns ]]; then
    tc -n "$ns" qdisc replace dev "$dev" root tbf rate "$rate" burst "$burst" latency 50ms
  else
    tc qdisc replace dev "$dev" root tbf rate "$rate" burst "$burst" latency 50ms
  fi
}

subnet_in_use() {
  ip -4 -o addr show | grep -q " $1\." && return 0
  ip -4 route show | grep -q "^$1\." && return 0
  return 1
}

cmd_up() {
  local name=$1 n=$2
  shift 2
  check_name "$name"
  [[ $n =~ ^[0-9]+$ ]] && ((n >= 2 && n <= MAX_HOSTS)) || die "the number of hosts must be 2 to $MAX_HOSTS (got '$n')"
  local rates=()
  while (($#)); do
    case $1 in
      --rate) [[ $# -ge 2 ]] || die "--rate needs a value"; rates=(); for ((i = 1; i <= n; i++)); do rates+=("$2"); done; shift 2 ;;
      --rates) [[ $# -ge 2 ]] || die "--rates needs a value"; IFS=, read -r -a rates <<<"$2"; shift 2 ;;
      *) die "unknown option '$1' (use --rate R or --rates R1,R2,...)" ;;
    esac
  done
  ((${#rates[@]})) || for ((i = 1; i <= n; i++)); do rates+=("1gbit"); done
  ((${#rates[@]} == n)) || die "--rates lists ${#rates[@]} rates for $n hosts"
  local r
  for r in "${rates[@]}"; do rate_bps "$r" >/dev/null; done
  need_tools
  local state=$STATE_ROOT/$name
  [[ -e $state ]] && die "a testbed named '$name' exists already ($state); run 'testbed.sh down $name' first"
  ip link show "$name-br" >/dev/null 2>&1 && die "interface $name-br exists already; run 'testbed.sh down $name' first"

  # A free /24, chosen from the name so that parallel runs rarely collide.
  local h
  h=$(printf '%s' "$name" | cksum | cut -d' ' -f1)
  local prefix="" k
  for ((k = 0; k < 50 * 250; k++)); do
    local a=$((201 + (h + k) / 250 % 50)) b=$(((h + k) % 250))
    if ! subnet_in_use "10.$a.$b"; then
      prefix="10.$a.$b"
      break
    fi
  done
  [[ -n $prefix ]] || die "no free /24 in 10.201.0.0 - 10.250.255.0"

  mkdir -p "$state/uts"
  # Everything created from here on is removed by `down`, also when up fails.
  trap 'echo "testbed: up failed; removing what was built" >&2; cmd_down "'"$name"'" >/dev/null 2>&1 || true' ERR
  echo "$n" >"$state/count"
  echo "$prefix" >"$state/prefix"

  ip link add "$name-br" type bridge
  ip addr add "$prefix.1/24" dev "$name-br"
  ip link set "$name-br" up

  local hosts="127.0.0.1 localhost"$'\n'
  for ((i = 1; i <= n; i++)); do hosts+="$prefix.$((10 + i)) $name-h$i"$'\n'; done

  for ((i = 1; i <= n; i++)); do
    local ns=$name-h$i veth=${name}v$i peer=${name}p$i addr=$prefix.$((10 + i))
    ip netns add "$ns"
    ip link add "$veth" type veth peer name "$peer"
    ip link set "$peer" netns "$ns"
    ip -n "$ns" link set "$peer" name eth0
    ip -n "$ns" addr add "$addr/24" dev eth0
    ip -n "$ns" link set lo up
    ip -n "$ns" link set eth0 up
    ip -n "$ns" route add default via "$prefix.1"
    ip link set "$veth" master "$name-br"
    ip link set "$veth" up
    shape "" "$veth" "${rates[i - 1]}"  # bridge -> host
    shape "$ns" eth0 "${rates[i - 1]}"  # host -> bridge

    mkdir -p "/etc/netns/$ns"
    echo "$ns" >"/etc/netns/$ns/hostname"
    printf '%s' "$hosts" >"/etc/netns/$ns/hosts"
    touch "$state/uts/h$i"
    unshare --uts="$state/uts/h$i" hostname "$ns"
    echo "$i $ns $addr ${rates[i - 1]}" >>"$state/hosts"
  done
  trap - ERR
  cat "$state/hosts"
}

cmd_exec() {
  local name=$1 i=$2
  shift 2
  check_name "$name"
  local state=$STATE_ROOT/$name
  [[ -f $state/count ]] || die "no testbed named '$name' (run 'testbed.sh up $name N' first)"
  [[ $i =~ ^[0-9]+$ ]] && ((i >= 1 && i <= $(cat "$state/count"))) ||
    die "host '$i' is not one of 1..$(cat "$state/count") of testbed '$name'"
  (($#)) || die "exec needs a command"
  exec nsenter --uts="$state/uts/h$i" -- ip netns exec "$name-h$i" "$@"
}

# exec by hostname, for launcher agent templates ('testbed.sh exec-host {host}').
cmd_exec_host() {
  local host=$1
  shift
  [[ $host =~ ^([a-z0-9]{1,8})-h([0-9]+)$ ]] ||
    die "'$host' is not a testbed hostname (NAME-hI, e.g. tb1-h2)"
  cmd_exec "${BASH_REMATCH[1]}" "${BASH_REMATCH[2]}" "$@"
}

# Sets the bridge end of host I's link down or up: with it down, host I
# reaches nobody and nobody reaches it (its processes keep running).
cmd_link() {
  local name=$1 i=$2 state=$3
  check_name "$name"
  [[ -f $STATE_ROOT/$name/count ]] || die "no testbed named '$name'"
  [[ $i =~ ^[0-9]+$ ]] && ((i >= 1 && i <= $(cat "$STATE_ROOT/$name/count"))) ||
    die "host '$i' is not one of 1..$(cat "$STATE_ROOT/$name/count") of testbed '$name'"
  [[ $state == down || $state == up ]] || die "link state must be 'down' or 'up', not '$state'"
  ip link set "${name}v$i" "$state"
}

# Changes the shaped rate of host I's link, both directions (tbf replaced in
# place on the bridge end and on the host's eth0), e.g. mid-run.
cmd_rate() {
  local name=$1 i=$2 rate=$3
  check_name "$name"
  local state=$STATE_ROOT/$name
  [[ -f $state/count ]] || die "no testbed named '$name'"
  [[ $i =~ ^[0-9]+$ ]] && ((i >= 1 && i <= $(cat "$state/count"))) ||
    die "host '$i' is not one of 1..$(cat "$state/count") of testbed '$name'"
  rate_bps "$rate" >/dev/null
  shape "" "${name}v$i" "$rate"
  shape "$name-h$i" eth0 "$rate"
  sed -i "s/^$i \([^ ]*\) \([^ ]*\) .*$/$i \1 \2 $rate/" "$state/hosts"
}

cmd_info() {
  check_name "$1"
  [[ -f $STATE_ROOT/$1/hosts ]] || die "no testbed named '$1'"
  cat "$STATE_ROOT/$1/hosts"
}

# Removes every part of testbed NAME that exists; safe to run more than once.
cmd_down() {
  local name=$1
  check_name "$name"
  local state=$STATE_ROOT/$name i
  for ((i = 1; i <= MAX_HOSTS; i++)); do
    local ns=$name-h$i
    if [[ -e /run/netns/$ns ]]; then
      # Processes left in the namespace would keep its interfaces alive.
      local pids
      pids=$(ip netns pids "$ns" 2>/dev/null || true)
      [[ -n $pids ]] && kill $pids 2>/dev/null || true
      ip netns del "$ns" 2>/dev/null || true
    fi
    ip link del "${name}v$i" 2>/dev/null || true
    ip link del "${name}p$i" 2>/dev/null || true
    rm -rf "/etc/netns/$ns"
    # OpenMPI's session directories of the host's daemons (ompi.HOSTNAME.UID):
    # a daemon killed with its job (a cut link, a failed test) leaves its own.
    rm -rf "${TMPDIR:-/tmp}/ompi.$ns."*
    if [[ -e $state/uts/h$i ]]; then
      umount "$state/uts/h$i" 2>/dev/null || true
    fi
  done
  ip link del "$name-br" 2>/dev/null || true
  rm -rf "$state"
}

cmd_leftovers() {
  local name=$1 left=0 i
  check_name "$name"
  for ((i = 1; i <= MAX_HOSTS; i++)); do
    [[ -e /run/netns/$name-h$i ]] && { echo "network namespace $name-h$i"; left=1; }
    ip link show "${name}v$i" >/dev/null 2>&1 && { echo "interface ${name}v$i"; left=1; }
    [[ -e /etc/netns/$name-h$i ]] && { echo "/etc/netns/$name-h$i"; left=1; }
    compgen -G "${TMPDIR:-/tmp}/ompi.$name-h$i.*" >/dev/null && { echo "OpenMPI session directory ${TMPDIR:-/tmp}/ompi.$name-h$i.*"; left=1; }
  done
  ip link show "$name-br" >/dev/null 2>&1 && { echo "bridge $name-br"; left=1; }
  grep -q " $STATE_ROOT/$name/" /proc/self/mounts && { echo "UTS namespace mounts under $STATE_ROOT/$name"; left=1; }
  [[ -e $STATE_ROOT/$name ]] && { echo "state directory $STATE_ROOT/$name"; left=1; }
  return $left
}

usage() {
  sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
}

(($# >= 2)) || usage
cmd=$1
shift
case $cmd in
  up) (($# >= 2)) || usage; cmd_up "$@" ;;
  exec) (($# >= 3)) || usage; cmd_exec "$@" ;;
  exec-host) (($# >= 2)) || usage; cmd_exec_host "$@" ;;
  link) (($# == 3)) || usage; cmd_link "$@" ;;
  rate) (($# == 3)) || usage; cmd_rate "$@" ;;
  info) cmd_info "$1" ;;
  down) cmd_down "$1" ;;
  leftovers) cmd_leftovers "$1" ;;
  *) usage ;;
esac

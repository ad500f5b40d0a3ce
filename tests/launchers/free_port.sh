# Sourced by the launcher tests: free_port prints a TCP port that nothing
# listens on, below the kernel's ephemeral range (ip_local_port_range), so
# that no outgoing connection of another test can hold it between this
# check and the bind (a port picked inside that range was once taken by a
# client socket: "cannot listen on 0.0.0.0:38174: Address already in use").
free_port() {
  local p low
  low=$(cut -f1 /proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || echo 32768)
  ((low > 21000)) || low=32768
  for _ in $(seq 100); do
    p=$((20000 + RANDOM % (low - 20000)))
    ss -Hltn "sport = :$p" 2>/dev/null | grep -q . || { echo "$p"; return; }
  done
  echo "no free TCP port found" >&2
  return 1
}

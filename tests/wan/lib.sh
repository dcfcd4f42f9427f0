# tests/wan/lib.sh: an emulated wide-area network on one machine, for the
# tests and benchmarks that need the links volunteers really have. Source
# it from bash. The coordinator runs in a network namespace of its own;
# each peer in another, joined to the coordinator's by a veth pair with
# its own addresses (10.211.I.1 on the coordinator's side, 10.211.I.2 on
# peer I's). On each link:
#   - bandwidth: a tbf qdisc on each side's egress (the peer's side is its
#     upload, the coordinator's its download);
#   - loss: nftables rules in the peer's namespace that drop a random share
#     of the packets in each direction;
#   - delay and jitter: tests/wan/relay.py in the coordinator's namespace,
#     listening on the link's address and relaying to the coordinator on
#     127.0.0.1, each direction delayed by half the round trip (this
#     kernel has no netem).
# Everything made is named after the harness's process and removed by
# wan_teardown, which wan_start arranges to run when the shell exits (on
# failure too); no traffic leaves the namespaces. Without root, network
# namespaces, tbf or nftables, wan_check says why and returns 1, so a test
# can report itself skipped.
#
# Use:
#   source tests/wan/lib.sh
#   wan_check || { echo "skipped: $WAN_WHY"; exit 77; }
#   wan_start 2                      # namespaces and links for 2 peers
#   wan_shape 1 far; wan_shape 2 home
#   wan_coord CMD ...                # runs in the coordinator's namespace
#   wan_relay 1 8443                 # link 1's relay to 127.0.0.1:8443
#   wan_peer 1 CMD ...               # runs in peer 1's namespace; it
#                                    # reaches the coordinator at
#                                    # $(wan_addr 1):$(wan_relay_port 1)

WAN_HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
WAN_PROFILES=${WAN_PROFILES:-$WAN_HERE/profiles.conf}
# Bandwidths are multiplied by WAN_SCALE and delays by WAN_TIME_SCALE, so
# a small model on a CPU can meet a link as a large one on a GPU meets the
# real one (docs/wan.md works the factors out).
WAN_SCALE=${WAN_SCALE:-1}
WAN_TIME_SCALE=${WAN_TIME_SCALE:-1}
WAN_TAG="vw$$"
WAN_NS="volley-wan-$$"
WAN_LINKS=0
WAN_RELAYS=()
WAN_WHY=""
WAN_WORK=""

# wan_check: 0 when this machine can emulate links, else 1 with WAN_WHY.
wan_check() {
  if [ "$(id -u)" != 0 ]; then WAN_WHY="needs root (network namespaces)"; return 1; fi
  local t="volley-wan-probe-$$"
  for c in ip tc nft python3; do
    command -v "$c" >/dev/null || { WAN_WHY="$c is not installed (deploy/install-deps.sh)"; return 1; }
  done
  if ! ip netns add "$t" 2>/dev/null; then WAN_WHY="network namespaces are not available"; return 1; fi
  local ok=1
  ip netns exec "$t" ip link add "${WAN_TAG}x" type veth peer name "${WAN_TAG}y" 2>/dev/null \
    || { WAN_WHY="veth pairs are not available"; ok=0; }
  if [ "$ok" = 1 ] && ! ip netns exec "$t" tc qdisc add dev "${WAN_TAG}x" root tbf rate 1mbit \
       burst 4kb latency 50ms 2>/dev/null; then
    WAN_WHY="the tbf qdisc is not available"; ok=0
  fi
  if [ "$ok" = 1 ] && ! ip netns exec "$t" nft add table inet probe 2>/dev/null; then
    WAN_WHY="nftables does not work here"; ok=0
  fi
  ip netns del "$t" 2>/dev/null || true
  [ "$ok" = 1 ]
}

# wan_profile NAME: sets WAN_UP and WAN_DOWN (kbit/s, scaled by
# WAN_SCALE), WAN_RTT and WAN_JITTER (ms, scaled by WAN_TIME_SCALE) and
# WAN_LOSS (%) from the profiles file. NAME may be "mixed:I" for the I-th peer of the mixed
# federation.
wan_profile() {
  local name=$1 idx
  if [[ "$name" == *:* ]]; then
    idx=${name#*:}
    name=${name%%:*}
    local members
    members=$(awk -v n="$name" '$1 == n && $2 == "=" { $1 = ""; $2 = ""; print }' "$WAN_PROFILES")
    [ -n "$members" ] || { echo "wan: no federation '$name' in $WAN_PROFILES" >&2; return 1; }
    read -r -a m <<< "$members"
    name=${m[$(( (idx - 1) % ${#m[@]} ))]}
  fi
  local line
  line=$(awk -v n="$name" '$1 == n && NF == 6 && $2 != "=" { print }' "$WAN_PROFILES")
  [ -n "$line" ] || { echo "wan: no profile '$name' in $WAN_PROFILES" >&2; return 1; }
  local rtt jitter
  read -r WAN_NAME up down rtt jitter WAN_LOSS <<< "$line"
  WAN_RTT=$(awk -v r="$rtt" -v s="$WAN_TIME_SCALE" 'BEGIN { print r * s }')
  WAN_JITTER=$(awk -v r="$jitter" -v s="$WAN_TIME_SCALE" 'BEGIN { print r * s }')
  WAN_UP=$(awk -v r="$up" -v s="$WAN_SCALE" 'BEGIN { printf "%d", r * s * 1000 }')
  WAN_DOWN=$(awk -v r="$down" -v s="$WAN_SCALE" 'BEGIN { printf "%d", r * s * 1000 }')
}

# wan_teardown: removes everything this harness made. Safe to call twice.
wan_teardown() {
  local p i ns all=()
  # Every process left in the namespaces (relays, servers, peers), not
  # only those started here: a namespace outlives nothing it holds.
  for ((i = 1; i <= WAN_LINKS; i++)); do all+=("$WAN_NS-p$i"); done
  [ "$WAN_LINKS" -gt 0 ] || [ -n "$WAN_WORK" ] && all+=("$WAN_NS-c")
  for ns in "${all[@]}"; do
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill "$p" 2>/dev/null || true; done
  done
  for p in "${WAN_RELAYS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${WAN_RELAYS[@]}"; do wait "$p" 2>/dev/null || true; done
  WAN_RELAYS=()
  for ns in "${all[@]}"; do
    for p in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$p" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
  done
  [ -n "$WAN_WORK" ] && rm -rf "$WAN_WORK"
  WAN_LINKS=0
  WAN_WORK=""
}

# wan_start N: the coordinator's namespace and N peers' namespaces, each
# joined to it by an unshaped link. Chains wan_teardown onto the shell's
# EXIT trap.
wan_start() {
  local n=$1 i
  WAN_WORK=$(mktemp -d /tmp/volley-wan.XXXXXX)
  local prev
  prev=$(trap -p EXIT | sed -e "s/^trap -- '//" -e "s/' EXIT$//")
  # The exit status is handed on to the earlier handler, which may judge
  # the run by it.
  # shellcheck disable=SC2064
  trap "__wan_rc=\$?; wan_teardown; (exit \$__wan_rc); ${prev:-:}" EXIT
  ip netns add "$WAN_NS-c"
  ip -n "$WAN_NS-c" link set lo up
  for ((i = 1; i <= n; i++)); do
    ip netns add "$WAN_NS-p$i"
    WAN_LINKS=$i
    ip -n "$WAN_NS-p$i" link set lo up
    ip -n "$WAN_NS-c" link add "${WAN_TAG}c$i" type veth peer name "${WAN_TAG}p$i"
    ip -n "$WAN_NS-c" link set "${WAN_TAG}p$i" netns "$WAN_NS-p$i"
    ip -n "$WAN_NS-c" addr add "10.211.$i.1/30" dev "${WAN_TAG}c$i"
    ip -n "$WAN_NS-p$i" addr add "10.211.$i.2/30" dev "${WAN_TAG}p$i"
    ip -n "$WAN_NS-c" link set "${WAN_TAG}c$i" up
    ip -n "$WAN_NS-p$i" link set "${WAN_TAG}p$i" up
  done
}

# tbf on dev in namespace ns at rate kbit/s: a bucket of 10 ms of the rate
# (at least two full frames, so a packet always fits) and a queue of
# 200 ms, which a sender fills before it sees drops, as on a home router.
wan_tbf() {
  local ns=$1 dev=$2 rate=$3
  local burst=$(( rate * 1000 / 8 / 100 ))
  [ "$burst" -lt 3200 ] && burst=3200
  ip netns exec "$ns" tc qdisc replace dev "$dev" root tbf rate "${rate}kbit" burst "$burst" \
    latency 200ms
}

# wan_shape I PROFILE: bandwidth and loss of link I (delay is the relay's;
# wan_relay reads the profile wan_shape set for the link).
wan_shape() {
  local i=$1 profile=$2
  wan_profile "$profile" || return 1
  wan_tbf "$WAN_NS-p$i" "${WAN_TAG}p$i" "$WAN_UP"
  wan_tbf "$WAN_NS-c" "${WAN_TAG}c$i" "$WAN_DOWN"
  printf '%s %s %s %s %s\n' "$WAN_RTT" "$WAN_JITTER" "$WAN_UP" "$WAN_DOWN" "$WAN_LOSS" \
    > "$WAN_WORK/link$i"
  wan_loss_on "$i"
}

# wan_loss_on I / wan_loss_off I: link I's packet loss (as wan_shape set
# it) in force or lifted. Rules count what they see and what they drop
# (wan_loss_counts).
wan_loss_on() {
  local i=$1 ns="$WAN_NS-p$1" dev="${WAN_TAG}p$1" loss per rest
  read -r rest rest rest rest loss < "$WAN_WORK/link$i"
  per=$(awk -v l="$loss" 'BEGIN { printf "%d", l * 100 }') # per ten thousand
  wan_loss_off "$i"
  [ "$per" -gt 0 ] || return 0
  ip netns exec "$ns" nft add table inet wanloss
  ip netns exec "$ns" nft add chain inet wanloss in '{ type filter hook input priority 0; }'
  ip netns exec "$ns" nft add chain inet wanloss out '{ type filter hook output priority 0; }'
  ip netns exec "$ns" nft add rule inet wanloss in iifname "$dev" counter
  ip netns exec "$ns" nft add rule inet wanloss in iifname "$dev" numgen random mod 10000 \< "$per" counter drop
  ip netns exec "$ns" nft add rule inet wanloss out oifname "$dev" counter
  ip netns exec "$ns" nft add rule inet wanloss out oifname "$dev" numgen random mod 10000 \< "$per" counter drop
}
wan_loss_off() { ip netns exec "$WAN_NS-p$1" nft delete table inet wanloss 2>/dev/null || true; }

# wan_loss_counts I: "seen dropped" packets of link I since wan_loss_on
# (both directions; "0 0" without loss).
wan_loss_counts() {
  ip netns exec "$WAN_NS-p$1" nft list table inet wanloss 2>/dev/null |
    awk '/counter packets/ { for (i = 1; i <= NF; i++) if ($i == "packets") v = $(i + 1)
                             if (/drop/) d += v; else s += v }
         END { printf "%d %d\n", s, d }'
}

# wan_addr I: the coordinator's address on link I, as peer I dials it.
wan_addr() { echo "10.211.$1.1"; }

# wan_relay I PORT [ARGS...]: starts link I's relay (half the profile's
# round trip each way, with its jitter) from $(wan_addr I) to
# 127.0.0.1:PORT in the coordinator's namespace, and waits until it
# listens. ARGS go to relay.py (--cut-after BYTES: a line that drops).
#
# The relay's send buffer toward the peer holds 50 ms of the download
# rate (at least 16 KiB): the delay is the relay's, so the kernel sees a
# round trip of almost nothing between relay and peer and would grow its
# window until the coordinator's 200 ms tbf queue overflowed; the losses
# that follow are recovered only after the inflated round trip, a stall
# that once cost the mobile profile's 2-second download 14-17 % of its
# rate in one try of four. A queue that never fills drops nothing.
wan_relay() {
  local i=$1 port=$2 rtt=0 jitter=0 up=0 down=0 rest
  shift 2
  [ -f "$WAN_WORK/link$i" ] && read -r rtt jitter up down rest < "$WAN_WORK/link$i"
  local sndbuf=$(awk -v d="$down" 'BEGIN { b = int(d * 1000 / 8 * 0.05); print (d > 0 && b < 16384) ? 16384 : b }')
  rm -f "$WAN_WORK/relay$i.port"
  ip netns exec "$WAN_NS-c" python3 "$WAN_HERE/relay.py" --listen "$(wan_addr "$i"):0" \
    --port-file "$WAN_WORK/relay$i.port" --jitter "$(awk -v j="$jitter" 'BEGIN { print j }')" \
    --sndbuf "$sndbuf" \
    --seed "$i" "$@" "127.0.0.1:$port" "$(awk -v r="$rtt" 'BEGIN { print r / 2 }')" \
    2> "$WAN_WORK/relay$i.log" &
  WAN_RELAYS+=($!)
  local pid=$! _
  for _ in $(seq 1 100); do
    [ -s "$WAN_WORK/relay$i.port" ] && return 0
    kill -0 "$pid" 2>/dev/null || { echo "wan: relay $i exited: $(cat "$WAN_WORK/relay$i.log")" >&2; return 1; }
    sleep 0.05
  done
  echo "wan: relay $i did not start" >&2
  return 1
}

# wan_relay_port I: the port link I's relay listens on.
wan_relay_port() { cat "$WAN_WORK/relay$1.port"; }

# wan_coord CMD...: runs CMD in the coordinator's namespace.
wan_coord() { ip netns exec "$WAN_NS-c" "$@"; }

# wan_peer I CMD...: runs CMD in peer I's namespace.
wan_peer() { local i=$1; shift; ip netns exec "$WAN_NS-p$i" "$@"; }

#!/usr/bin/env bash
# Two peers on the far-volunteer profile (2/10 Mbit/s, 150 ms, 0.5 % loss)
# train a small run to its last version over TLS through the emulated
# network, and peer 1's line drops in the middle of its first model
# download: the download must resume where it stopped (Range with
# If-Range on the version's ETag, answered 206) instead of starting over,
# and the run must finish. Peer 2 caps its downloads at 40 kB/s
# (--max-download-rate), which its model downloads must show. Skipped (exit 77) where the machine cannot make
# network namespaces.
source "$(dirname "$0")/../integration/lib.sh"
source "$(dirname "$0")/lib.sh"
wan_check || { echo "skipped: $WAN_WHY"; exit 77; }
VERSIONS=3
IT_TRAIN='{"steps": 4, "batch": 4, "lr": 0.003}' it_setup itwan "$VERSIONS" 2 \
  '"compression": {"kind": "none", "dtype": "F16"},'
rm -rf tls
bash "$ROOT/deploy/make-cert.sh" tls 127.0.0.1 10.211.1.1 10.211.2.1 >/dev/null
wan_start 2
wan_shape 1 far
wan_shape 2 far
IT_WRAP="ip netns exec $WAN_NS-c" it_start_coordinator
# The model file is about 120 KB; link 1's first connection is cut 40 KB
# into what the coordinator sends, which lands inside the first download.
wan_relay 1 "$PORT" --cut-after 40000
wan_relay 2 "$PORT"
cp "$WAN_WORK/relay1.log" relay1.log 2>/dev/null || true
for i in 1 2; do
  token=$("$COORD" token create --db run.db --uses 1 --ttl 1h) || fail "token create"
  url="https://$(wan_addr "$i"):$(wan_relay_port "$i")"
  "$PEER" keygen --dir "peer$i" > /dev/null || fail "keygen $i"
  wan_peer "$i" "$PEER" join --dir "peer$i" --coordinator "$url" --token "$token" \
    --cacert tls/ca.pem --name "wan-$i" > /dev/null 2> "join$i.log" || fail "join $i: $(cat "join$i.log")"
done
t0=$(date +%s)
wan_peer 1 "$PEER" run --dir peer1 --threads 1 --wait 10 --retries 12 2> peer1.log &
PIDS+=($!)
VOLLEY_LOG=debug wan_peer 2 "$PEER" run --dir peer2 --threads 1 --wait 10 --retries 12 \
  --max-download-rate 40k 2> peer2.log &
PIDS+=($!)
for p in "${PIDS[@]}"; do wait "$p" || fail "a peer exited with an error"; done
PIDS=()
t1=$(date +%s)
it_stop_coordinator
cp "$WAN_WORK/relay1.log" relay1.log
it_check_run "$VERSIONS" 2
grep -q 'cut a connection' relay1.log || fail "the relay never cut link 1"
grep -q 'download resumed at byte' peer1.log || fail "peer 1 did not resume its download"
grep -q 'GET /v1/model 206' coordinator.log \
  || fail "the coordinator answered no ranged model request"
at=$(grep -o 'download resumed at byte [0-9]*' peer1.log | head -n1 | awk '{print $NF}')
# Every model download of peer 2 took at least its bytes over 40 kB/s
# (less a fifth for libcurl's averaging).
slow=$(grep -o 'GET /v1/model?version=[0-9]* -> 200 ([0-9]* bytes, [0-9.]* s)' peer2.log |
  sed 's/.*(\([0-9]*\) bytes, \([0-9.]*\) s)/\1 \2/' |
  awk '{ n++; if ($2 < 0.8 * $1 / 40000) bad++; t += $2 } END { if (!n || bad) exit 1; printf "%.2f", t / n }') \
  || fail "peer 2's model downloads were not held to --max-download-rate 40k"
echo "wan far: $VERSIONS versions in $((t1 - t0)) s over 2/10 Mbit/s, 150 ms, 0.5 % loss; peer 1's model download cut and resumed at byte $at; peer 2's capped downloads took $slow s each"
echo "1 passed, 0 failed"

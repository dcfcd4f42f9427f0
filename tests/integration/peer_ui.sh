#!/usr/bin/env bash
# What a volunteer sees of `volley-peer run`. On a terminal (a
# pseudo-terminal here): a status line redrawn in place (\r, erase to the
# end of the line) with the step, loss, speed and device, and each log
# line and task summary whole above it, never cut into by the status
# line, an upload's progress and rate on it. With --log-format json: every line of stderr a JSON object, the
# events task_start, task_end (with the summary's fields) and
# run_finished among them. With nothing listening at the coordinator's
# address: "cannot reach the coordinator" said once over several retries,
# then "gave up ... stopping" and exit status 4; and when the coordinator
# comes back, "reached the coordinator ... again", then the finished run
# said in words.
source "$(dirname "$0")/lib.sh"
export IT_TRAIN='{"steps": 4, "batch": 4, "lr": 0.003, "dynamic_steps": false}'
it_setup itui 4 1 '"compression": {"kind": "topk", "ratio": 20, "dtype": "F16"},'
it_start_coordinator
for i in 1 2; do it_peer "$i"; done

# A command under a pseudo-terminal 100 columns wide; its raw output (what
# the terminal received) goes to the file named first.
cat > pty_run.py <<'PY'
import fcntl, os, pty, struct, sys, termios
out_path, argv = sys.argv[1], sys.argv[2:]
pid, fd = pty.fork()
if pid == 0:
    fcntl.ioctl(0, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    os.execvp(argv[0], argv)
out = bytearray()
while True:
    try:
        chunk = os.read(fd, 65536)
    except OSError:
        break
    if not chunk:
        break
    out += chunk
_, status = os.waitpid(pid, 0)
open(out_path, "wb").write(bytes(out))
sys.exit(os.waitstatus_to_exitcode(status))
PY

# ---- 1. on a terminal ------------------------------------------------------
# The upload (about 4.7 kB) capped at 2 kB/s takes a couple of seconds,
# long enough to show its progress.
python3 pty_run.py pty.out "$PEER" run --dir peer2 --threads 1 --wait 5 --retries 20 \
  --step-delay 400 --max-tasks 1 --max-upload-rate 2k || fail "the peer on a terminal exited with $?"
cp pty.out peer2-pty.log
python3 - pty.out <<'PY' || fail "the terminal's output is not as it should be"
import re, sys
raw = open(sys.argv[1], "rb").read().decode("utf-8", "replace")
CLEAR = "\r\x1b[K"
stamp = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (DEBUG|INFO|WARN|ERROR) volley-peer: ")
lines = raw.replace("\r\n", "\n").split("\n")
status = []
for i, seg in enumerate(lines):
    parts = seg.split(CLEAR)
    status += parts[:-1]
    last = parts[-1].rstrip("\r")
    if i < len(lines) - 1 and not stamp.match(last):
        sys.exit("a log line does not stand on its own: %r" % seg[:200])
drawn = [s for s in status if s]
steps = [s for s in drawn if re.search(r"\bstep [1-4]/4\b", s)]
if raw.count(CLEAR) < 4 or len(steps) < 2:
    sys.exit("%d redraws, %d showing a step: %r" % (raw.count(CLEAR), len(steps), drawn[:6]))
line = steps[-1]
for want in (r"^task \d+ \| step \d/4 \| loss \d+\.\d{4} \| \d+ tok/s \| cpu", ):
    if not re.search(want, line):
        sys.exit("status line %r lacks %s" % (line, want))
if any(len(s) > 99 for s in drawn):
    sys.exit("a status line is wider than the terminal: %r" % max(drawn, key=len))
summary = [l for l in lines if re.search(r"task \d+: base v\d+, 4 steps, loss .* upload \d+ bytes "
                                         r"\([0-9.]+ % less than the .* of a dense one\), \d+ "
                                         r"tok/s, update \d+ accepted .*; time: "
                                         r"download [0-9.]+ s, train [0-9.]+ s, compress [0-9.]+ s, "
                                         r"upload [0-9.]+ s", l)]
if len(summary) != 1:
    sys.exit("expected one task summary, got %d" % len(summary))
if not any(re.search(r"^task \d+ \| uploading \| .* \| up [0-9.]+/[0-9.]+ kB at [0-9.]+ k?B/s$", s)
           for s in drawn):
    sys.exit("no status line shows the upload's progress: %r" % drawn[-3:])
if not any(re.search(r" \| saved \d+\.\d kB$", s) for s in drawn):
    sys.exit("no status line shows the bytes compression saved: %r" % drawn[-3:])
if not raw.endswith(CLEAR) and not lines[-1] == "":
    sys.exit("the status line was left on the screen at exit: %r" % lines[-1][-120:])
print("terminal: %d redraws; last status line: %s" % (raw.count(CLEAR), line))
PY

# ---- 2. JSON lines ---------------------------------------------------------
"$PEER" run --dir peer1 --threads 1 --wait 5 --retries 20 --log-format json 2> peer1.log \
  || fail "the peer with --log-format json exited with $?"
python3 - peer1.log <<'PY' || fail "the JSON log is not as it should be"
import json, sys
events = []
for n, line in enumerate(open(sys.argv[1], encoding="utf-8"), 1):
    try:
        o = json.loads(line)
    except ValueError as e:
        sys.exit("line %d is not JSON (%s): %r" % (n, e, line[:200]))
    for k in ("ts", "level", "program", "event", "msg"):
        if k not in o:
            sys.exit("line %d lacks %s: %r" % (n, k, line[:200]))
    if o["program"] != "volley-peer" or o["level"] not in ("debug", "info", "warn", "error"):
        sys.exit("line %d: %r" % (n, line[:200]))
    events.append(o)
kinds = [o["event"] for o in events]
starts = [o for o in events if o["event"] == "task_start"]
ends = [o for o in events if o["event"] == "task_end"]
if len(starts) != 3 or len(ends) != 3 or kinds.count("run_finished") != 1:
    sys.exit("events: %s" % kinds)
for o in ends:
    for k, t in (("task", int), ("base_version", int), ("steps", int), ("loss", float),
                 ("last_loss", float), ("tokens_per_s", (int, float)), ("bytes_up", int),
                 ("dense_bytes", int), ("saved_bytes", int), ("download_s", (int, float)),
                 ("train_s", (int, float)), ("compress_s", (int, float)),
                 ("upload_s", (int, float)), ("version", int)):
        if not isinstance(o.get(k), t):
            sys.exit("task_end lacks %s: %r" % (k, o))
    if o["outcome"] != "accepted" or o["steps"] != 4 or o["train_s"] <= 0:
        sys.exit("task_end: %r" % o)
    # top-k at ratio 20 in F16: most of a dense update's bytes are saved.
    if (o["saved_bytes"] != o["dense_bytes"] - o["bytes_up"]
            or o["saved_bytes"] < 0.8 * o["dense_bytes"]):
        sys.exit("task_end: %r" % o)
if [o["task"] for o in starts] != [o["task"] for o in ends]:
    sys.exit("tasks started %s, ended %s" % ([o["task"] for o in starts], [o["task"] for o in ends]))
fin = [o for o in events if o["event"] == "run_finished"][0]
if fin["run"] != "itui" or fin["tasks"] != 3 or "stopping" not in fin["msg"]:
    sys.exit("run_finished: %r" % fin)
print("json: %d lines, events %s" % (len(events), sorted(set(kinds))))
PY
it_wait_finished 100 "the run did not finish"

# ---- 3. a coordinator out of reach -------------------------------------------
it_stop_coordinator
rc=0
"$PEER" run --dir peer1 --threads 1 --wait 5 --retries 5 2> down.log || rc=$?
[ "$rc" = 4 ] || fail "a peer that cannot reach the coordinator exited with $rc, not 4"
n=$(grep -c "cannot reach the coordinator at $URL (connection refused); retrying in" down.log || true)
[ "$n" = 1 ] || fail "'cannot reach' said $n times over 4 retries, not once"
tail -n 1 down.log | grep -q "^volley-peer: gave up after 5 attempts to reach the coordinator at $URL (connection refused; .*); stopping$" \
  || fail "the last line does not say the peer gives up: $(tail -n 1 down.log)"
! grep -q 'retry [0-9]*/' down.log || fail "each retry was logged"

# The coordinator comes back while the peer retries: said once, then the
# finished run, in words, and a clean exit.
"$PEER" run --dir peer1 --threads 1 --wait 5 --retries 15 2> back.log &
PIDS+=($!)
for _ in $(seq 1 100); do grep -q 'cannot reach' back.log && break; sleep 0.1; done
it_serve_again
wait "${PIDS[0]}" || fail "the peer did not come back with the coordinator"
PIDS=()
[ "$(grep -c 'cannot reach the coordinator' back.log)" = 1 ] || fail "'cannot reach' not said once"
grep -q "reached the coordinator at $URL again" back.log || fail "no word of the coordinator's return"
grep -q "run 'itui' has finished (410 run_finished): nothing more to train, stopping" back.log \
  || fail "the finished run is not said in words: $(tail -n 3 back.log)"
it_stop_coordinator
it_check_no_secrets
echo "1 passed, 0 failed"

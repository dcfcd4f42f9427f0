"""Opens N connections to HOST:PORT at once (non-blocking connects, so a
listener that stops accepting only leaves them waiting), optionally
completes a TLS handshake on each and sends something, then watches them
for up to WAIT seconds and prints how many the server closed, how many are
still open and how many never connected:

    flood_conns.py HOST PORT N WAIT [--tls CA] [--send byte|status]
    -> "closed C open O unconnected U of N after T s"

--send byte sends the first byte of a request head ("G") and nothing more;
--send status sends GET /v1/status, reads its whole answer and then keeps
the connection alive with nothing in progress.
"""
import argparse
import resource
import select
import socket
import ssl
import time

ap = argparse.ArgumentParser()
ap.add_argument("host")
ap.add_argument("port", type=int)
ap.add_argument("n", type=int)
ap.add_argument("wait", type=float)
ap.add_argument("--tls")
ap.add_argument("--send", choices=["byte", "status"])
a = ap.parse_args()

soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
if soft < a.n + 64:
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, a.n + 64), hard))

ctx = None
if a.tls:
    ctx = ssl.create_default_context(cafile=a.tls)


def read_answer(s):
    """Reads one whole answer (head and Content-Length body)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = s.recv(4096)
        if not chunk:
            raise ConnectionError("closed before the answer")
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    while len(body) < length:
        chunk = s.recv(4096)
        if not chunk:
            raise ConnectionError("closed in the answer")
        body += chunk


raw = []
for _ in range(a.n):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setblocking(False)
    s.connect_ex((a.host, a.port))
    raw.append(s)
# Which connects completed (the listener took them or its backlog did).
deadline = time.monotonic() + 5
pending = set(range(a.n))
connected = set()
by_fd = {s.fileno(): i for i, s in enumerate(raw)}
poller = select.poll()
for s in raw:
    poller.register(s, select.POLLOUT)
while pending and time.monotonic() < deadline:
    for fd, _ in poller.poll(200):
        i = by_fd[fd]
        poller.unregister(fd)
        pending.discard(i)
        if raw[i].getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) == 0:
            connected.add(i)
socks = {}
for i in sorted(connected):
    s = raw[i]
    if ctx is not None:
        s.setblocking(True)
        s.settimeout(10)
        try:
            s = ctx.wrap_socket(s, server_hostname=a.host)
            if a.send == "byte":
                s.sendall(b"G")
            elif a.send == "status":
                s.sendall(b"GET /v1/status HTTP/1.1\r\nHost: " + a.host.encode() + b"\r\n\r\n")
                read_answer(s)
        except (OSError, ssl.SSLError):
            continue
        s.setblocking(False)
    socks[i] = s
t0 = time.monotonic()
closed = set(i for i in connected if i not in socks)
poller = select.poll()
fd_of = {}
for i, s in socks.items():
    poller.register(s, select.POLLIN)
    fd_of[s.fileno()] = i
while time.monotonic() - t0 < a.wait and len(closed) < len(connected):
    for fd, _ in poller.poll(500):
        i = fd_of[fd]
        s = socks[i]
        if i in closed:
            continue
        try:
            if s.recv(4096) == b"":
                closed.add(i)
        except (BlockingIOError, ssl.SSLWantReadError):
            pass
        except (OSError, ssl.SSLError):
            closed.add(i)
        if i in closed:
            poller.unregister(fd)
print(
    f"closed {len(closed)} open {len(connected) - len(closed)} "
    f"unconnected {a.n - len(connected)} of {a.n} after {time.monotonic() - t0:.1f} s"
)
for s in raw:
    s.close()

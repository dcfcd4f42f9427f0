"""Opens N plain TCP connections to HOST:PORT that never send a byte (the
cheapest way to hold a server's descriptors), then watches them for up to
WAIT seconds and prints how many the server closed and how many are still
open once the count stops changing or WAIT runs out:

    hold_conns.py HOST PORT N WAIT
    -> "closed C open O of N after T s"
"""
import select
import socket
import sys
import time

host, port, n, wait = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
socks = []
for _ in range(n):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(5)
    s.connect((host, port))
    s.setblocking(False)
    socks.append(s)
t0 = time.monotonic()
closed = set()
while time.monotonic() - t0 < wait and len(closed) < n:
    live = [s for s in socks if s.fileno() not in closed]
    readable, _, _ = select.select(live, [], [], 0.5)
    for s in readable:
        try:
            if s.recv(4096) == b"":
                closed.add(s.fileno())
        except (ConnectionResetError, BrokenPipeError):
            closed.add(s.fileno())
        except BlockingIOError:
            pass
print(f"closed {len(closed)} open {n - len(closed)} of {n} after {time.monotonic() - t0:.1f} s")
for s in socks:
    s.close()

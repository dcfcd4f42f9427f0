#!/usr/bin/env python3
"""Measures an emulated link (tests/wan/check_links.sh): round trip,
upload and download throughput, through the link's relay.

    probe.py serve PORT_FILE            # in the coordinator's namespace
    probe.py measure HOST:PORT SECONDS UP_KBIT DOWN_KBIT

`serve` listens on 127.0.0.1 (any port, written to PORT_FILE) and answers
three commands, one per connection: "p" echoes single bytes until the
client closes; "u" + an 8-byte length reads that many bytes and answers
with the seconds from the first byte to the last as it saw them; "d" + an
8-byte length sends that many bytes.

`measure` prints one line, "rtt_ms=... up_kbit=... down_kbit=...":
the median of 15 one-byte round trips, and the goodput of a transfer each
way sized for SECONDS at the rate the link should have, timed from the
first byte to the last at the receiving end (so neither the round trip
nor the bucket's first burst is counted).
"""
import os
import socket
import statistics
import struct
import sys
import time


def recv_exact(s, n):
    out = bytearray()
    while len(out) < n:
        b = s.recv(n - len(out))
        if not b:
            raise ConnectionError("closed early")
        out += b
    return bytes(out)


def recv_timed(s, n):
    """Reads up to n bytes (less if the peer closes). Returns the bytes
    read after the first chunk and the seconds from the first chunk to
    the last, so neither the round trip before the data nor the bucket's
    first burst is counted."""
    got, first, last, first_len = 0, None, None, 0
    while got < n:
        b = s.recv(1 << 20)
        if not b:
            break
        now = time.monotonic()
        if first is None:
            first, first_len = now, len(b)
        last = now
        got += len(b)
    if first is None:
        return 0, 0.0
    return got - first_len, last - first


def serve(port_file):
    ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", 0))
    ls.listen(16)
    with open(port_file + ".tmp", "w") as f:
        f.write(f"{ls.getsockname()[1]}\n")
    os.replace(port_file + ".tmp", port_file)
    chunk = b"\x5a" * 65536
    while True:
        c, _ = ls.accept()
        c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            cmd = recv_exact(c, 1)
            if cmd == b"p":
                while True:
                    b = c.recv(1)
                    if not b:
                        break
                    c.sendall(b)
            elif cmd in (b"u", b"d"):
                (n,) = struct.unpack("!Q", recv_exact(c, 8))
                if cmd == b"u":
                    counted, span = recv_timed(c, n)
                    c.sendall(struct.pack("!dQ", span, counted))
                else:
                    left = n
                    while left > 0:
                        part = chunk[: min(left, len(chunk))]
                        c.sendall(part)
                        left -= len(part)
        except (ConnectionError, OSError):
            pass
        finally:
            c.close()


def connect(addr):
    host, port = addr.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=120)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def measure(addr, seconds, up_kbit, down_kbit):
    s = connect(addr)
    s.sendall(b"p")
    rtts = []
    for _ in range(15):
        t = time.monotonic()
        s.sendall(b"x")
        recv_exact(s, 1)
        rtts.append((time.monotonic() - t) * 1000)
    s.close()

    n_up = int(up_kbit * 1000 / 8 * seconds)
    s = connect(addr)
    s.sendall(b"u" + struct.pack("!Q", n_up))
    block = b"\xa5" * 65536
    left = n_up
    while left > 0:
        part = block[: min(left, len(block))]
        s.sendall(part)
        left -= len(part)
    span, counted = struct.unpack("!dQ", recv_exact(s, 16))
    s.close()
    up = counted * 8 / span / 1000 if span > 0 else 0.0

    n_down = int(down_kbit * 1000 / 8 * seconds)
    s = connect(addr)
    s.sendall(b"d" + struct.pack("!Q", n_down))
    counted, span = recv_timed(s, n_down)
    s.close()
    down = counted * 8 / span / 1000 if span > 0 else 0.0
    print(f"rtt_ms={statistics.median(rtts):.2f} up_kbit={up:.0f} down_kbit={down:.0f}")


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "serve":
        serve(sys.argv[2])
    elif len(sys.argv) == 6 and sys.argv[1] == "measure":
        measure(sys.argv[2], float(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5]))
    else:
        sys.exit(__doc__)

#!/usr/bin/env python3
"""A TCP relay that delays each direction of every connection, so tests
and benchmarks on one machine see the round trip of a wide-area link.

    relay.py [--listen HOST:PORT] [--port-file FILE] [--jitter MS] [--seed N]
             [--cut-after BYTES [--cuts N]] [--sndbuf BYTES]
             TARGET_HOST:TARGET_PORT ONE_WAY_MS

Listens on --listen (default 127.0.0.1:0, any free port; the port is
written to --port-file once listening) and relays every connection to the
target. Each chunk read on one side is written to the other ONE_WAY_MS
later, plus a jitter drawn uniformly from [-MS, +MS] (never below zero).
A chunk never overtakes the one before it, as on a TCP stream: jitter
bunches data up rather than reordering it. So a request and its answer
cost one round trip of about 2 * ONE_WAY_MS on top of the work.

With --cut-after, a connection is cut (both sides reset) once BYTES have
gone from the target to the client over it, for the first N connections
that get that far (--cuts, default 1): a line that drops in the middle of
a download, whatever short exchanges came before it.

--sndbuf bounds the kernel's send buffer toward the client, so a window
that sees no round trip (the delay is this process's) cannot overflow the
queue of the shaped link below it (tests/wan/lib.sh sizes it).

The relay only delays. Bandwidth and packet loss belong to the network
below it (tests/wan/lib.sh shapes each emulated link with tbf and drops
packets with nftables). TLS passes through untouched; the certificate
must name the address the client dials. Stops on SIGTERM or SIGINT.
"""
import argparse
import asyncio
import os
import random
import signal
import socket
import sys


def parse_addr(s):
    host, _, port = s.rpartition(":")
    if not host or not port.isdigit():
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {s!r}")
    return host, int(port)


class Cut(Exception):
    pass


async def pipe(reader, writer, delay, jitter, rnd, budget=None, on_cut=None):
    """Copies reader to writer, each chunk `delay` (+- jitter) seconds late,
    in order; passes the end of the stream on as a half close. With a
    budget, calls on_cut once that many bytes have been written."""
    loop = asyncio.get_running_loop()
    pending = asyncio.Queue()

    async def sender():
        while True:
            due, chunk = await pending.get()
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            if chunk is None:
                break
            if budget is not None and budget[0] is not None:
                if len(chunk) >= budget[0]:
                    head, chunk = chunk[: budget[0]], chunk[budget[0]:]
                    writer.write(head)
                    budget[0] = None  # spent: the cut happens once or not at all
                    if on_cut():
                        return
                else:
                    budget[0] -= len(chunk)
            writer.write(chunk)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()

    task = asyncio.create_task(sender())
    last_due = 0.0
    try:
        while True:
            chunk = await reader.read(65536)
            due = loop.time() + max(0.0, delay + rnd.uniform(-jitter, jitter))
            last_due = max(last_due, due)
            pending.put_nowait((last_due, chunk or None))
            if not chunk:
                break
        await task
    except (ConnectionError, OSError):
        task.cancel()


async def main(args):
    target_host, target_port = args.target
    delay = args.one_way_ms / 1000.0
    jitter = args.jitter / 1000.0
    rnd = random.Random(args.seed)

    cuts_left = [args.cuts if args.cut_after is not None else 0]

    async def serve(r, w):
        try:
            ur, uw = await asyncio.open_connection(target_host, target_port)
        except OSError:
            w.close()
            return
        if args.sndbuf:
            w.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF,
                                                  args.sndbuf)
        budget, on_cut = None, None
        if cuts_left[0] > 0:
            budget = [args.cut_after]

            def on_cut():
                if cuts_left[0] <= 0:
                    return False
                cuts_left[0] -= 1
                print(f"relay: cut a connection after {args.cut_after} bytes", flush=True,
                      file=sys.stderr)
                w.transport.abort()
                uw.transport.abort()
                return True

        await asyncio.gather(pipe(r, uw, delay, jitter, rnd),
                             pipe(ur, w, delay, jitter, rnd, budget, on_cut),
                             return_exceptions=True)
        uw.close()
        w.close()

    host, port = args.listen
    server = await asyncio.start_server(serve, host, port)
    bound = server.sockets[0].getsockname()[1]
    if args.port_file:
        with open(args.port_file + ".tmp", "w") as f:
            f.write(f"{bound}\n")
        os.replace(args.port_file + ".tmp", args.port_file)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    async with server:
        await stop.wait()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description="delay every direction of TCP connections")
    ap.add_argument("--listen", type=parse_addr, default=("127.0.0.1", 0))
    ap.add_argument("--port-file")
    ap.add_argument("--jitter", type=float, default=0.0, help="milliseconds, uniform +-")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--cut-after", type=int, help="bytes to the client before a cut")
    ap.add_argument("--cuts", type=int, default=1, help="connections to cut")
    ap.add_argument("--sndbuf", type=int, default=0,
                    help="send buffer toward the client, bytes (0: the kernel's)")
    ap.add_argument("target", type=parse_addr)
    ap.add_argument("one_way_ms", type=float)
    a = ap.parse_args()
    if a.one_way_ms < 0 or a.jitter < 0:
        ap.error("delays must not be negative")
    asyncio.run(main(a))

#!/usr/bin/env python3
"""A TCP relay that adds a fixed one-way delay in each direction, so a
benchmark on one machine sees the round trip of a wide-area link.

    delay_relay.py LISTEN_PORT TARGET_PORT ONE_WAY_MS [PORT_FILE]

Listens on 127.0.0.1:LISTEN_PORT (0: any free port, written to PORT_FILE
once listening) and relays every connection to 127.0.0.1:TARGET_PORT.
Each chunk read on one side is written to the other ONE_WAY_MS later, in
order, so a request and its answer cost one round trip of 2 * ONE_WAY_MS
on top of the work. Bandwidth is not limited: the relay only delays.
TLS passes through untouched (the certificate still names 127.0.0.1).
"""
import asyncio
import os
import sys


async def pipe(reader, writer, delay):
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
            writer.write(chunk)
            await writer.drain()
        try:
            writer.write_eof()
        except (OSError, RuntimeError):
            pass

    task = asyncio.create_task(sender())
    try:
        while True:
            chunk = await reader.read(65536)
            pending.put_nowait((loop.time() + delay, chunk or None))
            if not chunk:
                break
        await task
    except (ConnectionError, OSError):
        task.cancel()


async def main():
    listen_port, target_port = int(sys.argv[1]), int(sys.argv[2])
    delay = float(sys.argv[3]) / 1000.0
    port_file = sys.argv[4] if len(sys.argv) > 4 else None

    async def serve(r, w):
        try:
            ur, uw = await asyncio.open_connection("127.0.0.1", target_port)
        except OSError:
            w.close()
            return
        await asyncio.gather(pipe(r, uw, delay), pipe(ur, w, delay), return_exceptions=True)
        uw.close()
        w.close()

    server = await asyncio.start_server(serve, "127.0.0.1", listen_port)
    port = server.sockets[0].getsockname()[1]
    if port_file:
        with open(port_file + ".tmp", "w") as f:
            f.write(f"{port}\n")
        os.replace(port_file + ".tmp", port_file)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    if len(sys.argv) < 4:
        sys.exit("usage: delay_relay.py LISTEN_PORT TARGET_PORT ONE_WAY_MS [PORT_FILE]")
    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass

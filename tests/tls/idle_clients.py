"""Idle subscribed WebSocket connections held by a separate process, for
tests/tls_idle_live_bytes.rs (whose allocator must count the server alone). Reads target
counts from stdin, one per line: opens connections until that many are open (wss:// trusting
CA_FILE, or ws:// when CA_FILE is "-"), each subscribed to idle.<i mod 100>, then prints
`ok N`. Exits, closing them all, at the end of stdin. Every wait is bounded.

usage: idle_clients.py HOST PORT CA_FILE
"""
import asyncio
import json
import ssl
import sys

from websockets.asyncio.client import connect

LIMIT = 20.0


async def main(host, port, ca):
    ctx = None
    scheme = "ws"
    if ca != "-":
        ctx = ssl.create_default_context(cafile=ca)
        scheme = "wss"
    url = f"{scheme}://{host}:{port}/ws"
    held = []
    loop = asyncio.get_running_loop()
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line:
            break
        want = int(line)
        while len(held) < want:
            kw = {"ssl": ctx} if ctx else {}
            ws = await connect(url, compression=None, open_timeout=LIMIT, ping_interval=None, **kw)
            await ws.send(json.dumps({"op": "sub", "ch": f"idle.{len(held) % 100}"}))
            await asyncio.wait_for(ws.recv(), LIMIT)
            held.append(ws)
        print(f"ok {len(held)}", flush=True)
    for ws in held:
        await ws.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[3]))

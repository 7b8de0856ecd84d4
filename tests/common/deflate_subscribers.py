"""Two subscribers of one channel through Python `websockets` (an independent RFC 7692
implementation): one offering permessage-deflate, one not. Prints `ready` once both are
subscribed, then, when each has N `msg` frames, one JSON line: the extensions each negotiated
and, per subscriber, [seq, raw text] of every `msg` (text after inflation). Every wait is
bounded (exit 1 with the reason).

usage: deflate_subscribers.py WS_URL CHANNEL N
"""
import asyncio
import json
import sys

from websockets.asyncio.client import connect

LIMIT = 10.0


async def subscribed(ws, ch):
    await ws.send(json.dumps({"op": "sub", "ch": ch}))
    while True:
        m = json.loads(await asyncio.wait_for(ws.recv(), LIMIT))
        if m.get("op") == "subscribed":
            return


async def messages(ws, n):
    got = []
    while len(got) < n:
        raw = await asyncio.wait_for(ws.recv(), LIMIT)
        if json.loads(raw).get("op") == "msg":
            got.append([json.loads(raw)["seq"], raw])
    return got


async def main(url, ch, n):
    deflate = await connect(url, compression="deflate", max_size=None, open_timeout=LIMIT)
    plain = await connect(url, compression=None, max_size=None, open_timeout=LIMIT)
    exts = {
        "deflate": [e.name for e in deflate.protocol.extensions],
        "plain": [e.name for e in plain.protocol.extensions],
    }
    await subscribed(deflate, ch)
    await subscribed(plain, ch)
    print("ready", flush=True)
    got = {"deflate": await messages(deflate, n), "plain": await messages(plain, n)}
    print(json.dumps({"extensions": exts, "got": got}), flush=True)
    await deflate.close()
    await plain.close()


try:
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
except Exception as e:  # noqa: BLE001 - the test prints it
    print(f"error: {type(e).__name__}: {e}", flush=True)
    sys.exit(1)

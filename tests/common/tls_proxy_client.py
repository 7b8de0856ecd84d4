"""An independent TLS client of tether behind a proxy: Python `ssl` (trusting only the test CA)
with `websockets` for wss://, or a raw TLS socket for Server-Sent Events over https://.
Driven line by line by tests/proxy_recipes.rs; every wait is bounded (exit 1 with the reason).

usage: tls_proxy_client.py ws  WSS_URL CA_FILE CHANNEL HOLD_S N1 N2 N3
  Subscribes, prints `subscribed`, stays idle HOLD_S seconds (longer than the proxy's idle
  timeout: only tether's pings keep it open), prints `held`, reads N1 `msg`s, cuts its TCP
  connection without a close frame, prints `cut`, waits for `go` on stdin, reconnects, resumes
  with `from` = the last seq it processed and the epoch, reads N2 replayed and then N3 live
  `msg`s (printing `resumed` after the `subscribed` answer), then prints one JSON line:
  {"seqs": [...every msg seq in order...], "data": [...], "recovered": bool}.
usage: tls_proxy_client.py sse HOST:PORT CA_FILE CHANNEL HOLD_S
  GET /sse?ch=CHANNEL over TLS; prints `open` after the 200 head, stays idle HOLD_S seconds,
  prints `held`, then prints `event JSON` for the first `msg` event.
"""
import asyncio
import json
import socket
import ssl
import sys
import time

from websockets.asyncio.client import connect

LIMIT = 10.0


def context(ca):
    ctx = ssl.create_default_context(cafile=ca)
    ctx.set_alpn_protocols(["http/1.1"])
    return ctx


async def answer(ws, op):
    while True:
        m = json.loads(await asyncio.wait_for(ws.recv(), LIMIT))
        if m.get("op") == op or m.get("op") in ("error", "reset"):
            return m


async def messages(ws, n, seqs, data):
    while n > 0:
        m = json.loads(await asyncio.wait_for(ws.recv(), LIMIT))
        if m.get("op") == "msg":
            seqs.append(m["seq"])
            data.append(m["data"])
            n -= 1


async def line():
    return (await asyncio.wait_for(asyncio.to_thread(sys.stdin.readline), 3 * LIMIT)).strip()


async def ws_main(url, ca, ch, hold, n1, n2, n3):
    ctx = context(ca)
    seqs, data = [], []
    # ping_interval=None: the only traffic while idle is tether's pings and the pongs.
    ws = await connect(url, ssl=ctx, ping_interval=None, open_timeout=LIMIT)
    await ws.send(json.dumps({"op": "sub", "ch": ch}))
    sub = await answer(ws, "subscribed")
    if sub.get("op") != "subscribed":
        raise RuntimeError(f"sub answered {sub}")
    print("subscribed", flush=True)
    await asyncio.sleep(hold)
    print("held", flush=True)
    await messages(ws, n1, seqs, data)
    epoch = sub["epoch"]
    # A cut, not a close: the TCP connection goes away under the proxy with no close frame.
    ws.transport.abort()
    print("cut", flush=True)
    if await line() != "go":
        raise RuntimeError("no go")
    ws = await connect(url, ssl=ctx, ping_interval=None, open_timeout=LIMIT)
    await ws.send(json.dumps({"op": "sub", "ch": ch, "from": seqs[-1], "epoch": epoch}))
    again = await answer(ws, "subscribed")
    if again.get("op") != "subscribed":
        raise RuntimeError(f"resume answered {again}")
    await messages(ws, n2, seqs, data)
    print("resumed", flush=True)
    await messages(ws, n3, seqs, data)
    print(json.dumps({"seqs": seqs, "data": data, "recovered": again.get("recovered", False)}), flush=True)
    await ws.close()


def sse_main(hostport, ca, ch, hold):
    host, port = hostport.rsplit(":", 1)
    raw = socket.create_connection((host, int(port)), timeout=LIMIT)
    s = context(ca).wrap_socket(raw, server_hostname=host)
    s.sendall(f"GET /sse?ch={ch} HTTP/1.1\r\nHost: {hostport}\r\nAccept: text/event-stream\r\n\r\n".encode())
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = s.recv(65536)
        if not chunk:
            raise RuntimeError(f"EOF before the head: {buf!r}")
        buf += chunk
    head, buf = buf.split(b"\r\n\r\n", 1)
    if not head.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(f"answered {head!r}")
    print("open", flush=True)
    end = time.monotonic() + hold
    # Idle, but read what comes (heartbeat comments, the subscribed event) so nothing is lost.
    while time.monotonic() < end:
        s.settimeout(max(0.05, end - time.monotonic()))
        try:
            chunk = s.recv(65536)
        except socket.timeout:
            continue
        if not chunk:
            raise RuntimeError("stream ended during the hold")
        buf += chunk
    print("held", flush=True)
    s.settimeout(LIMIT)
    while True:
        for ln in buf.split(b"\n"):
            if ln.startswith(b"data: ") and b'"op":"msg"' in ln:
                print("event " + ln[6:].decode(), flush=True)
                return
        chunk = s.recv(65536)
        if not chunk:
            raise RuntimeError(f"stream ended before a msg event: {buf[-400:]!r}")
        buf += chunk


try:
    if sys.argv[1] == "ws":
        a = sys.argv
        asyncio.run(ws_main(a[2], a[3], a[4], float(a[5]), int(a[6]), int(a[7]), int(a[8])))
    else:
        sse_main(sys.argv[2], sys.argv[3], sys.argv[4], float(sys.argv[5]))
except Exception as e:  # noqa: BLE001 - the test prints it
    print(f"error: {type(e).__name__}: {e}", flush=True)
    sys.exit(1)

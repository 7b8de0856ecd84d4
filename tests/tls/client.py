"""An independent TLS client for tests/tls_wss.rs: Python's `ssl` (OpenSSL) with `websockets`
for wss:// and `http.client` for https://, trusting only the test CA. Against one tether
serving TLS it subscribes over wss:// (permessage-deflate offered), publishes and reads its
messages, publishes over https://, resumes over a new wss:// connection from the last seq
it processed, reads an SSE stream over https://, and fetches /status and /metrics. Prints
one JSON line of what it saw; every wait is bounded (exit 1 with the reason).

usage: client.py HOST PORT CA_FILE CHANNEL
"""
import asyncio
import http.client
import json
import ssl
import sys

from websockets.asyncio.client import connect

LIMIT = 10.0


def context(ca):
    ctx = ssl.create_default_context(cafile=ca)
    ctx.set_alpn_protocols(["http/1.1"])
    return ctx


def https(host, port, ctx, method, path, body=None):
    c = http.client.HTTPSConnection(host, port, context=ctx, timeout=LIMIT)
    c.request(method, path, body=body, headers={"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    version = c.sock.version()
    c.close()
    return r.status, data.decode("utf-8", "replace"), version


async def until(ws, op):
    while True:
        m = json.loads(await asyncio.wait_for(ws.recv(), LIMIT))
        if m.get("op") == op:
            return m


def sse_until(resp, needle):
    seen = b""
    while needle not in seen:
        chunk = resp.fp.read1(4096) if hasattr(resp.fp, "read1") else resp.read(1)
        if not chunk:
            raise SystemExit(f"SSE stream ended before {needle!r}; saw {seen!r}")
        seen += chunk
    return seen


async def main(host, port, ca, ch):
    ctx = context(ca)
    url = f"wss://{host}:{port}/ws"
    out = {}
    ws = await connect(url, ssl=ctx, compression="deflate", open_timeout=LIMIT)
    out["extensions"] = [e.name for e in ws.protocol.extensions]
    out["tls_version"] = ws.transport.get_extra_info("ssl_object").version()
    out["alpn"] = ws.transport.get_extra_info("ssl_object").selected_alpn_protocol()
    await ws.send(json.dumps({"op": "sub", "ch": ch}))
    sub = await until(ws, "subscribed")
    epoch = sub["epoch"]
    seqs = []
    for i in range(3):
        await ws.send(json.dumps({"op": "pub", "ch": ch, "id": f"py-{i}", "data": {"n": i, "pad": "x" * 600}}))
        seqs.append((await until(ws, "msg"))["seq"])
    out["live"] = seqs
    await ws.close()

    # Two more while nobody listens, over https://.
    posted = []
    for i in range(3, 5):
        status, body, version = https(host, port, ctx, "POST", f"/publish/{ch}", json.dumps({"n": i}))
        posted.append([status, json.loads(body).get("seq")])
    out["https_publish"] = posted
    out["https_version"] = version

    ws = await connect(url, ssl=ctx, compression="deflate", open_timeout=LIMIT)
    await ws.send(json.dumps({"op": "sub", "ch": ch, "from": seqs[-1], "epoch": epoch}))
    resumed = await until(ws, "subscribed")
    out["recovered"] = resumed.get("recovered", False)
    out["replayed"] = [(await until(ws, "msg"))["seq"] for _ in range(2)]
    await ws.close()

    # Server-Sent Events over https://: subscribed, then a message published meanwhile.
    c = http.client.HTTPSConnection(host, port, context=ctx, timeout=LIMIT)
    c.request("GET", f"/sse?ch={ch}", headers={"Accept": "text/event-stream"})
    r = c.getresponse()
    out["sse_status"] = r.status
    sse_until(r, b"event: subscribed")
    https(host, port, ctx, "POST", f"/publish/{ch}", json.dumps({"n": "sse"}))
    seen = sse_until(r, b'"sse"')
    out["sse_msg"] = b"event: msg" in seen
    c.close()

    status, body, _ = https(host, port, ctx, "GET", "/status")
    out["status_page"] = [status, "<html" in body.lower()]
    status, body, _ = https(host, port, ctx, "GET", "/metrics")
    out["metrics"] = [status, [l for l in body.splitlines() if l.startswith("tether_tls_handshakes_total")]]
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    host, port, ca, ch = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    try:
        asyncio.run(main(host, port, ca, ch))
    except Exception as e:  # the test prints the reason
        print(json.dumps({"error": repr(e)}), flush=True)
        sys.exit(1)

"""An independent TLS client for tests/tls_record.rs: Python's `ssl` (OpenSSL) with
`websockets`, trusting only the test CA, held to one cipher suite. Against one tether serving
TLS it subscribes over wss://, publishes messages of several sizes (up to past one record's
16 KiB) and reads each back. Prints one JSON line: the protocol version and cipher OpenSSL
negotiated and the sizes read back; every wait is bounded (exit 1 with the reason).

usage: suite_client.py HOST PORT CA_FILE CHANNEL VERSION [CIPHER]
  VERSION 1.2: CIPHER is an OpenSSL TLS 1.2 cipher name (set_ciphers);
  VERSION 1.3: the suite comes from OPENSSL_CONF (Ciphersuites), which the test sets.
"""
import asyncio
import json
import ssl
import sys

from websockets.asyncio.client import connect

LIMIT = 10.0
SIZES = [5, 700, 16_384, 40_000]


async def until(ws, op):
    while True:
        m = json.loads(await asyncio.wait_for(ws.recv(), LIMIT))
        if m.get("op") == op:
            return m


async def main(host, port, ca, ch, version, cipher):
    ctx = ssl.create_default_context(cafile=ca)
    ctx.set_alpn_protocols(["http/1.1"])
    if version == "1.2":
        ctx.maximum_version = ssl.TLSVersion.TLSv1_2
        ctx.set_ciphers(cipher)
    else:
        ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ws = await connect(f"wss://{host}:{port}/ws", ssl=ctx, compression=None, open_timeout=LIMIT, max_size=None)
    tls = ws.transport.get_extra_info("ssl_object")
    out = {"version": tls.version(), "cipher": tls.cipher()[0]}
    await ws.send(json.dumps({"op": "sub", "ch": ch}))
    await until(ws, "subscribed")
    got = []
    for i, n in enumerate(SIZES):
        await ws.send(json.dumps({"op": "pub", "ch": ch, "id": f"p{i}", "data": "z" * n}))
        got.append(len((await until(ws, "msg"))["data"]))
    out["sizes"] = got
    await ws.close()
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    host, port, ca, ch, version = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
    cipher = sys.argv[6] if len(sys.argv) > 6 else ""
    try:
        asyncio.run(main(host, port, ca, ch, version, cipher))
    except Exception as e:  # the test prints the reason
        print(json.dumps({"error": repr(e)}), flush=True)
        sys.exit(1)

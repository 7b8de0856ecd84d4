"""The peer's close_notify is answered (RFC 8446 §6.1), seen from OpenSSL through Python's ssl.

Usage: close_notify.py HOST PORT CA_PEM
For each case a TLS connection is made trusting only CA_PEM, then `unwrap()` sends this
side's close_notify and waits (5 s socket timeout) for the server's: it returns only when the
server's close_notify arrived; a bare FIN raises. Prints one JSON line: per case, "answered"
or the error seen.
  handshake  close_notify right after the handshake (it may arrive with the client Finished)
  after_http one keep-alive GET /healthz read to its end first, then close_notify
  after_ws   a WebSocket upgrade (the 101 head read; no frame follows unasked), then
             close_notify without a close frame
"""
import json
import socket
import ssl
import sys

host, port, ca = sys.argv[1], int(sys.argv[2]), sys.argv[3]
ctx = ssl.create_default_context(cafile=ca)
ctx.check_hostname = False


def read_response(s):
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = s.recv(4096)
        if not chunk:
            raise EOFError("EOF inside the response head")
        buf += chunk
    head, body = buf.split(b"\r\n\r\n", 1)
    length = 0
    for line in head.split(b"\r\n")[1:]:
        k, _, v = line.partition(b":")
        if k.strip().lower() == b"content-length":
            length = int(v)
    while len(body) < length:
        chunk = s.recv(4096)
        if not chunk:
            raise EOFError("EOF inside the response body")
        body += chunk
    return head.split(b"\r\n")[0].decode()


UPGRADE = (
    b"GET /ws HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
)
REQUESTS = {None: None, "http": b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", "ws": UPGRADE}


def case(first):
    raw = socket.create_connection((host, port), timeout=5)
    s = ctx.wrap_socket(raw, server_hostname="127.0.0.1")
    try:
        status = None
        if first:
            s.sendall(REQUESTS[first])
            status = read_response(s)
        s.unwrap()
        return "answered" if not first else f"answered after {status}"
    except Exception as e:  # the server's bare FIN or a reset
        return f"{type(e).__name__}: {e}"
    finally:
        s.close()


print(json.dumps({"handshake": case(None), "after_http": case("http"), "after_ws": case("ws")}))

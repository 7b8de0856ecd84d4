"""moto's server (`moto_server`, same arguments: -H HOST -p PORT) with one lock around each
request, for the DynamoDB lease store tests (tests/common/moto.rs).

`moto_server` runs requests on parallel threads and does not lock a table while it checks a
ConditionExpression and applies the update, so two racing conditional UpdateItem calls can
both pass (seen here: 32 racing acquires of one item, 5 rounds in 20 with 2 or 3 winners).
DynamoDB itself applies each conditional write to an item atomically; serializing the
requests gives the emulator that property. Connections are still served on threads (HTTP
keep-alive works), only the request handling is one at a time.
"""

import sys
import threading

import moto.server as moto_server

_run_simple = moto_server.run_simple


def _run_serialized(host, port, app, **kwargs):
    lock = threading.Lock()

    def serialized(environ, start_response):
        with lock:
            body = app(environ, start_response)
            try:
                return [b"".join(body)]
            finally:
                close = getattr(body, "close", None)
                if close is not None:
                    close()

    _run_simple(host, port, serialized, **kwargs)


moto_server.run_simple = _run_serialized

if __name__ == "__main__":
    moto_server.main(sys.argv[1:])

"""The API server's stop inside the daemon's (daemon/api/server.py, docs/operations.md
"Stopping"): a request in flight is waited for only as long as the stop is told, one
`[store] lock_timeout`, not uvicorn's 5 s whatever the store's settings."""

from __future__ import annotations

import http.client
import socket
import threading
import time

from fastapi import FastAPI

from daemon.api.server import ApiServer


def _free_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as probe:
        return int(probe.getsockname()[1])


def test_a_request_in_flight_is_waited_for_only_as_long_as_the_stop_is_told() -> None:
    app = FastAPI()
    entered, release = threading.Event(), threading.Event()

    @app.get("/slow")
    def slow() -> dict[str, str]:
        entered.set()
        release.wait(10)  # a store write waiting for a row another session holds
        return {}

    port = _free_port()
    server = ApiServer(app, "127.0.0.1", port)
    server.start()
    client = http.client.HTTPConnection("127.0.0.1", port, timeout=15)

    def ask() -> None:
        try:
            client.request("GET", "/slow")
            client.getresponse().read()
        except OSError:
            pass  # cut short by the stop: no answer

    asking = threading.Thread(target=ask, daemon=True)
    asking.start()
    try:
        assert entered.wait(5), "the request never reached its handler"
        started = time.monotonic()
        server.stop(wait=1.0)
        took = time.monotonic() - started
    finally:
        release.set()
        asking.join(15)
        client.close()
    assert took < 2.0, f"the stop took {took:.1f}s"

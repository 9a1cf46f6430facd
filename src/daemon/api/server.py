"""uvicorn in a thread: the daemon serves the API beside its scheduler, and stops it on
shutdown; `sendledger api` runs the same server in the foreground."""

from __future__ import annotations

import logging
import signal
import threading
import time

import uvicorn
from fastapi import FastAPI

log = logging.getLogger("sendledger.api")


class ApiServer:
    def __init__(self, app: FastAPI, host: str, port: int) -> None:
        config = uvicorn.Config(
            app,
            host=host,
            port=port,
            log_config=None,  # the daemon's logging, not uvicorn's own
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=5,
        )
        self.server = uvicorn.Server(config)
        # uvicorn installs signal handlers only on the main thread: in the daemon's
        # background thread the daemon keeps its own (SIGTERM drains, SIGHUP reloads).
        self._thread: threading.Thread | None = None
        self.host, self.port = host, port

    def start(self, timeout: float = 10.0) -> None:
        """Serve in a background thread; return once the port listens (or raise)."""
        self._thread = threading.Thread(target=self.server.run, name="api", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise OSError(f"api: cannot listen on {self.host}:{self.port}")
            time.sleep(0.01)
        log.info("API listening on http://%s:%d", self.host, self.port)

    def stop(self) -> None:
        self.server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)

    def run(self) -> None:
        """In the foreground until SIGTERM or SIGINT; then finish and exit 0, as `run` does
        (uvicorn's own handlers would re-raise the signal after shutting down)."""
        stop = threading.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stop.set())
        self.start()
        while not stop.wait(0.5):
            if self._thread is None or not self._thread.is_alive():
                raise OSError(f"api: the server on {self.host}:{self.port} stopped")
        self.stop()

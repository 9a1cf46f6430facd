"""uvicorn in a thread: the daemon serves the API beside its scheduler, and stops it on
shutdown; `sendledger api` runs the same server in the foreground.

The listening socket is bound here, before uvicorn starts, so that a port in use is a
`ListenRefused` naming the address (the caller names the setting), not a thread that dies
with uvicorn's own log line and a generic failure."""

from __future__ import annotations

import errno
import logging
import math
import signal
import socket
import threading
import time
from collections.abc import Callable, Sequence

import uvicorn
from fastapi import FastAPI

from daemon.wakeup import WakeUp
from ledger.exceptions import MayClearLater, SendledgerError

log = logging.getLogger("sendledger.api")

#: Seconds a stopping server waits for its requests in flight, at most.
GRACEFUL_SHUTDOWN = 5

_WHY = {
    errno.EADDRINUSE: "is in use by another process",
    errno.EADDRNOTAVAIL: "is not an address of this machine",
    errno.EACCES: "needs privileges this process lacks (a port below 1024)",
}


class ListenRefused(SendledgerError, OSError):
    """The API's address cannot be listened on; the message says why, in words."""


class ListenBusy(ListenRefused, MayClearLater):
    """The address is in use, or not one of this machine's yet: both may change by the
    next start (a process giving the port back, an interface coming up at boot)."""


#: What a later start may find otherwise (`ListenBusy`).
_FOR_NOW = (errno.EADDRINUSE, errno.EADDRNOTAVAIL)


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on host:port (SO_REUSEADDR, as uvicorn's own)."""
    try:
        family, kind, proto, _name, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror as exc:
        raise ListenRefused(f"{host}:{port}: the host does not resolve ({exc.strerror})") from None
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        why = _WHY.get(exc.errno or 0, exc.strerror or str(exc))
        refused = ListenBusy if exc.errno in _FOR_NOW else ListenRefused
        raise refused(f"{shown} {why}") from None
    return sock


class ApiServer:
    def __init__(self, app: FastAPI, host: str, port: int) -> None:
        config = uvicorn.Config(
            app,
            host=host,
            port=port,
            log_config=None,  # the daemon's logging, not uvicorn's own
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=GRACEFUL_SHUTDOWN,
        )
        self.server = uvicorn.Server(config)
        # uvicorn installs signal handlers only on the main thread: in the daemon's
        # background thread the daemon keeps its own (SIGTERM drains, SIGHUP reloads).
        self._thread: threading.Thread | None = None
        self._socket: socket.socket | None = None
        self.host, self.port = host, port

    def bind(self) -> None:
        """Take the port now (ListenRefused when it cannot be had); `start` serves it."""
        if self._socket is None:
            self._socket = bind(self.host, self.port)

    def start(self, timeout: float = 10.0) -> None:
        """Serve in a background thread; return once the port listens (or raise)."""
        self.bind()
        self._thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self._socket]}, name="api", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise OSError(f"api: cannot listen on {self.host}:{self.port}")
            time.sleep(0.01)
        log.info("API listening on http://%s:%d", self.host, self.port)

    def stop(self, wait: float | None = None) -> None:
        """Stop serving; requests in flight are waited for at most `wait` seconds (the
        daemon's stop: one `[store] lock_timeout`, daemon/config/stop_bound.py), else
        the configured 5 s. A request cut short gets no answer: its caller retries (a
        submit by its key is idempotent)."""
        if wait is not None:
            # Read by uvicorn when it shuts down, not when it starts.
            self.server.config.timeout_graceful_shutdown = min(math.ceil(wait), GRACEFUL_SHUTDOWN)
        self.server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._socket is not None:
            self._socket.close()

    def run(
        self,
        on_hangup: Callable[[], object] | None = None,
        hangups: Sequence[int] = (),
        stop_when: Callable[[], bool] = lambda: False,
    ) -> int:
        """In the foreground until SIGTERM or SIGINT; then finish, as `run` does: the exit
        code 130 after SIGINT, 0 after SIGTERM (uvicorn's own handlers would re-raise the
        signal after shutting down). SIGHUP calls `on_hangup` (`sendledger api` reloads
        its policies, as the daemon does), from this thread; so does one of `hangups`
        (those of the start-up), read once these handlers are in. The handlers only write
        to a pipe (`daemon/wakeup.py`). `stop_when`, asked every half second: a stop the
        caller asks for (`sendledger api` on a newer event format), as SIGTERM's."""
        wake = WakeUp()
        signals = [signal.SIGTERM, signal.SIGINT]
        if on_hangup is not None:
            signals.append(signal.SIGHUP)
        for signum in signals:
            signal.signal(signum, lambda signum, _frame: wake.post(signum))
        if on_hangup is not None and hangups:
            wake.post(signal.SIGHUP)
        self.start()
        while True:
            posted = wake.wait(0.5)
            if signal.SIGTERM in posted or signal.SIGINT in posted or stop_when():
                break
            if on_hangup is not None and signal.SIGHUP in posted:
                on_hangup()
            if self._thread is None or not self._thread.is_alive():
                raise OSError(f"api: the server on {self.host}:{self.port} stopped")
        self.stop()
        return 130 if signal.SIGINT in posted else 0

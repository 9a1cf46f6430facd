"""A process that imports sendledger once and forks a `sendledger` command per request
(a `sendledger run`, or a CLI command such as `review resolve`).

Starting an interpreter and importing the daemon's stack (eventsourcing, the Google client,
APScheduler) costs about a second of CPU; a test that stops the daemon 150 times would
spend minutes on imports alone. This server pays for them once, then forks: each child
is a process of its own that runs `daemon.cli.main([... "run"])` exactly as the console
script does, with its own signals, threads and exit code, and signals sent to its pid
reach it alone. The server has no thread of its own (forking a threaded process is
unsafe): it waits in `select` on stdin (requests) and on a pipe that SIGCHLD wakes
(exits), so an idle server costs no CPU.

Protocol, one JSON object a line. In: {"id", "argv", "cwd", "log"} starts a child with
stdout and stderr on `log`; optional "stdout", "stderr" (files of their own), "stdin" (a
file to read, else nothing) and "env" (the child's whole environment, as a console script
would be given it). Out: {"id", "pid"} when it started; {"pid", "code", "at"} when it
exited, `at` its `time.monotonic()` (CLOCK_MONOTONIC is the machine's, so the test
compares it with its own). A child exits as the console script would: `main`'s code, a
SystemExit's, or 1 with the traceback printed.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import select
import signal
import sys
import time
import traceback

import daemon.cli

#: Imported once, before any fork, beside every command's module (daemon.cli.COMMANDS):
#: what a daemon or a command imports only when it runs (each provider, the stores, the
#: API), so that no child spends CPU on imports of its own (profiled: imports were three
#: quarters of a forked daemon's CPU in the crash matrix).
PRELOAD = (
    "daemon.bootstrap",
    "daemon.runtime",
    "daemon.logs",
    "daemon.providers.gmail",
    "daemon.providers.graph",
    "daemon.providers.graph_credentials",
    "daemon.providers.smtp_imap",
    "daemon.providers.kept",
    "daemon.service_layer.doors",
    "daemon.api.build",
    "daemon.api.server",
    "daemon.api.metrics",
    "ledger.stores.sqlite",
    "ledger.stores.postgres",
    "ledger.addresses",
    "ledger.provider_handle",
    "pydantic_settings",
    "encodings.idna",
    # The Graph provider imports msal at its first token (0.6 s of CPU, every Graph daemon).
    "msal",
)


def _preload() -> None:
    for name in dict.fromkeys([*daemon.cli.COMMANDS.values(), *PRELOAD]):
        importlib.import_module(name)


def _child(request: dict[str, object], wakeup: tuple[int, int]) -> None:
    """In the forked child: become `sendledger ARGV` and never return."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        for fd in wakeup:
            os.close(fd)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
        out = os.open(str(request.get("stdout", request["log"])), flags, 0o600)
        err = os.open(str(request.get("stderr", request["log"])), flags, 0o600)
        source = os.open(str(request.get("stdin", os.devnull)), os.O_RDONLY)
        os.dup2(source, 0)
        os.dup2(out, 1)
        os.dup2(err, 2)
        if "env" in request:
            env = request["env"]
            assert isinstance(env, dict)
            os.environ.clear()
            os.environ.update({str(k): str(v) for k, v in env.items()})
        os.chdir(str(request["cwd"]))
        argv = request["argv"]
        assert isinstance(argv, list)
        code = daemon.cli.main([str(word) for word in argv])
    except SystemExit as exc:  # argparse's exit: what the interpreter would exit with
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
    except BaseException:  # the child must never fall back into the server's loop
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _reap() -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        code = os.waitstatus_to_exitcode(status)
        _say({"pid": pid, "code": code, "at": time.monotonic()})


def _say(message: dict[str, object]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def main() -> None:
    _preload()
    # SIGCHLD writes a byte to `wake` (the handler itself does nothing): select returns
    # at once on an exit. The timeout only bounds a wake-up that could be missed.
    wake, wakeup_w = os.pipe()
    os.set_blocking(wake, False)
    os.set_blocking(wakeup_w, False)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    signal.set_wakeup_fd(wakeup_w)
    buffered = b""
    stdin = sys.stdin.fileno()
    while True:
        ready, _, _ = select.select([stdin, wake], [], [], 1.0)
        if wake in ready:
            with contextlib.suppress(BlockingIOError):
                while os.read(wake, 4096):
                    pass
        if stdin in ready:
            chunk = os.read(stdin, 65536)
            if not chunk:
                break  # the test ended: stop
            buffered += chunk
            while b"\n" in buffered:
                line, buffered = buffered.split(b"\n", 1)
                request = json.loads(line)
                sys.stdout.flush()
                pid = os.fork()
                if pid == 0:
                    _child(request, (wake, wakeup_w))
                _say({"id": request["id"], "pid": pid})
        _reap()
    # Children still running when the test goes away are ended with it.
    _reap()


if __name__ == "__main__":
    main()

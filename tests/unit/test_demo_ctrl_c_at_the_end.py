"""A Ctrl-C after the demo's last wait is acted on, not dropped with its handler: while
`sendledger demo` stops its daemon once every job settled, or prints its summary, SIGINT
is only noted (daemon/tools/ctrl_c.py), and nothing asked for it any more, so the demo
ended 0 with its whole summary (docs/cli.md "Exit codes": 130, interrupted)."""

from __future__ import annotations

import argparse
import io
import os
import signal
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from daemon.tools import demo
from daemon.tools.ctrl_c import CtrlC


def _ctrl_c() -> None:
    os.kill(os.getpid(), signal.SIGINT)


def test_a_ctrl_c_while_the_demo_ends_is_exit_130(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def demo_that_ends(folder: Path, *args: Any) -> int:
        _ctrl_c()  # the summary being printed: noted by the demo's handler
        return 0

    monkeypatch.setattr(demo, "_demo", demo_that_ends)
    args = argparse.Namespace(
        provider="gmail", lag=None, timeout="90s", json=False, keep=str(tmp_path / "demo")
    )
    assert demo.cmd_demo(args) == 130
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


class _Daemon:
    """A daemon whose stop, asked once every job settled, takes a moment; a Ctrl-C comes
    as it is asked."""

    def __init__(self, service: object, tick: float) -> None:
        self.requests = 0
        self.abandoned = False
        self._asked = threading.Event()

    def serve(self) -> None:
        self._asked.wait(10)
        time.sleep(0.3)  # its calls in flight finish

    def request_stop(self) -> None:
        self.requests += 1
        self._asked.set()
        _ctrl_c()


def test_a_ctrl_c_during_the_daemon_s_stop_at_the_end_ends_the_demo_after_the_stop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    daemons: list[_Daemon] = []

    def daemon(service: object, tick: float) -> _Daemon:
        daemons.append(_Daemon(service, tick))
        return daemons[-1]

    settings = SimpleNamespace(
        store=SimpleNamespace(url="x"),
        base_dir=tmp_path,
        policies_dir=tmp_path,
        providers={},
        daemon=SimpleNamespace(tick=0.1),
    )
    closed: list[bool] = []
    monkeypatch.setattr(demo, "load_settings", lambda path: settings)
    monkeypatch.setattr(demo, "load_policy_dir", lambda *a, **k: {})
    monkeypatch.setattr(
        demo, "Ledger", lambda *a, **k: SimpleNamespace(close=lambda: closed.append(True))
    )
    monkeypatch.setattr(demo, "bootstrap", lambda *a, **k: None)
    monkeypatch.setattr(demo, "Daemon", daemon)
    monkeypatch.setattr(demo, "_watch", lambda *a: True)
    monkeypatch.setattr(demo, "_operator_step", lambda *a: None)
    with CtrlC() as ctrl_c, pytest.raises(KeyboardInterrupt):
        demo._run_jobs(
            io.StringIO(), tmp_path, 5.0, [], index_wait=0.0, provider="x", ctrl_c=ctrl_c
        )
    # Its stop asked once (a second request is the daemon's "at once"), waited for, and
    # the demo's own Ctrl-C path taken: the ledger closed, not ended at once.
    assert [d.requests for d in daemons] == [1]
    assert not ctrl_c.at_once
    assert closed == [True]

"""A Ctrl-C while `sendledger try` sets up its page's jobs stops it there: the jobs wait
seconds for their searches (`--lag` and 2 s), and the Ctrl-C, only noted by try's
handler, waited for them all and for the page's whole how-to before the stop began
(docs/cli.md "Exit codes": 130, interrupted)."""

from __future__ import annotations

import signal
import time
from pathlib import Path

from tests.e2e.test_try import _printed, start_try


def test_a_ctrl_c_while_try_sets_up_stops_it_there(tmp_path: Path) -> None:
    folder = tmp_path / "try"
    # Searched 12 s after their sends: the jobs in review settle no sooner.
    proc = start_try(folder, "10s")
    try:
        lines = _printed(proc, "  log ")
        asked = time.monotonic()
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=60)
        took = time.monotonic() - asked
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    said = "\n".join(lines) + "\n" + rest
    assert proc.returncode == 130, said
    assert "The folder is kept" in rest, said
    assert "Submit a job over HTTP" not in rest, said
    assert took < 8, (took, said)


def test_try_started_with_sigint_ignored_leaves_it_ignored(tmp_path: Path) -> None:
    """A script's job in the background has SIGINT ignored: a SIGINT meant for the others
    of its group does not stop `try` (as the demo, 5a881fd); SIGTERM does, exit 0."""
    proc = start_try(tmp_path / "try", "300ms", sigint_ignored=True)
    try:
        _printed(proc, "Ctrl-C stops")
        proc.send_signal(signal.SIGINT)
        time.sleep(1.5)
        assert proc.poll() is None
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, rest
    assert "The folder is kept" in rest, rest

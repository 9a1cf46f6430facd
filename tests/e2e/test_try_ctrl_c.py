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

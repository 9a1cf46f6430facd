"""`review triage` on a slow mailbox, through the console script (docs/review.md "Triage"):
each job's line comes as soon as it is decided, and a Ctrl-C ends it with exit 130 and one
line saying how many jobs were triaged and that the rest are left as they were. Before, it
said nothing until its last search, and a Ctrl-C ended it silently."""

from __future__ import annotations

import queue
import signal
import subprocess
import threading
from pathlib import Path
from typing import IO

from tests.e2e.daemon_kit import SENDLEDGER, Rig

from ledger.decision_types import Review
from ledger.vocabulary import EscalationReason, PolicyRef
from testkit.relay import FaultPlan

LEGAL = {
    "provider": "gmail",
    "from": "Legal <legal@shop.example>",
    "message_id_domain": "mail.shop.example",
    "on_unknown": "review",
    "irreversible": True,
}
KEYS = ("notice-1", "notice-2")


def test_triage_shows_each_job_as_it_goes_and_a_ctrl_c_says_what_is_left(
    tmp_path: Path,
) -> None:
    # The first search is answered (no copy), the second hangs past the test.
    plan = FaultPlan(search=["pass"], default="hang")
    with Rig(tmp_path, lag=0.0, plan=plan, hang_seconds=60, timeout="30s",
             policies={"legal": LEGAL}) as rig:  # fmt: skip
        rig.submit(
            [
                {
                    "channel": "legal",
                    "key": key,
                    "to": "a@example.com",
                    "subject": "s",
                    "body": "b",
                }
                for key in KEYS
            ]
        )
        review = Review(PolicyRef("legal", "f"), EscalationReason.UNKNOWN_OUTCOME)
        for key in KEYS:
            rig.ledger.update(key, lambda j: j.escalate(review, detail="t", at=rig.ledger.clock()))
        proc = subprocess.Popen(
            [SENDLEDGER, "--config", str(rig.config), "review", "triage", "--dry-run"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=rig.child_env(),
            cwd=rig.dir,
        )
        lines: queue.Queue[str] = queue.Queue()
        assert proc.stdout is not None

        def read(stream: IO[str]) -> None:
            for line in stream:
                lines.put(line)

        reader = threading.Thread(target=read, args=(proc.stdout,))
        reader.start()
        try:
            # The first job's line while the second search still hangs.
            first = lines.get(timeout=20)
            assert first.split()[:3] == ["notice-1", "legal", "left"], first
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=30)
        finally:
            proc.kill()
            proc.wait()
            reader.join(timeout=10)
        assert proc.returncode == 130, err
        said = err.strip().splitlines()
        assert said[0] == "searching the mailbox for 2 jobs in review", err
        assert said[1:] == [
            "sendledger: interrupted after 1 of 2 jobs (a dry run: nothing recorded); the rest "
            "are left in review as they were: run the same command again for them"
        ], err
        assert lines.empty()
        assert [rig.state(key) for key in KEYS] == ["review", "review"]

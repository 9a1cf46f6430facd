"""The crash points x relay modes matrix for Gmail drafts mode (`send_via = "drafts"`),
with and without the emulator's `--rewrite-message-id`: each cell one job, the daemon
killed with SIGKILL at the point, a daemon of the same name started again; the job must
end confirmed with exactly one copy in the emulator's acceptance log (counted by the job's
subject: with a rewritten Message-ID the copy no longer carries ours).

`search_after` is a minute and a cell gets 20 s: every ambiguous job must settle through
its draft (drafts.get, then messages.get of the draft's message id), never through a
Message-ID search, which would also find nothing when the Message-ID is rewritten. The
relay's modes apply to drafts.send; drafts.create passes. Emulator results, not Gmail's.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tests.e2e.daemon_kit import MAILBOX, Rig, events_of
from tests.e2e.test_crash_matrix import (
    MATRIX_DAEMON,
    MODES,
    POINTS,
    POLICY,
    UNKNOWN_OUTCOME,
    matrix_row,
)

from testkit.gmail_emulator import GmailEmulator

DRAFTS_POLICY: dict[str, Any] = {**POLICY, "search_after": "60s", "search_interval": "60s"}


class DraftsRig(Rig):
    """Rig with `send_via = "drafts"` and an emulator that may rewrite Message-IDs."""

    def __init__(self, folder: Path, *, rewrite: bool, **kwargs: Any) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        emulator = GmailEmulator(
            lag=0.2, acceptance_log=folder / "acceptance.jsonl", rewrite_message_id=rewrite
        )
        super().__init__(folder, emulator=emulator, **kwargs)
        with self.config.open("a", encoding="utf-8") as handle:
            handle.write('send_via = "drafts"\n')

    def copies_in_log_file(self, message_id: str) -> int:
        key = next(r.key for r in self.rows() if r.message_id == message_id)
        if not self.acceptance_log.exists():
            return 0
        lines = self.acceptance_log.read_text(encoding="utf-8").splitlines()
        return sum(1 for line in lines if json.loads(line)["subject"] == f"Your receipt {key}")


@pytest.fixture(scope="module")
def results() -> Iterator[dict[tuple[str, str, str], str]]:
    table: dict[tuple[str, str, str], str] = {}
    yield table
    if table:
        print("\ndrafts mode: Message-ID x crash point x relay mode -> copies, final state")
        for (rewrite, point, mode), cell in sorted(table.items()):
            print(f"  {rewrite:<9} {point:<13} {mode:<20} {cell}")


@pytest.mark.parametrize("rewrite", [False, True], ids=["kept", "rewritten"])
@pytest.mark.parametrize("point", POINTS)
def test_drafts_crash_point_by_relay_mode(
    point: str, rewrite: bool, tmp_path: Path, results: dict[tuple[str, str, str], str]
) -> None:
    with DraftsRig(
        tmp_path,
        rewrite=rewrite,
        hang_seconds=1.5,
        timeout="1s",
        deadline_grace="60s",  # recovery must not wait for a deadline
        daemon_extra=MATRIX_DAEMON,
        policies={"receipts": DRAFTS_POLICY},
    ) as rig:
        row: dict[tuple[str, str], str] = {}
        wrong = matrix_row(rig, point, MODES, UNKNOWN_OUTCOME, row)
        label = "rewritten" if rewrite else "kept"
        results.update({(label, p, m): cell for (p, m), cell in row.items()})
        for row_key in rig.rows():
            history = rig.history(row_key.key)
            # Settled by the draft: no Message-ID search was ever needed.
            assert not events_of(history, "SearchedMiss"), (row_key.key, history)
            assert events_of(history, "DraftCreated"), row_key.key
        assert rig.emulator.drafts(MAILBOX) == {}, "an unsent draft was left"
        assert wrong == [], "\n".join(wrong)

"""`sendledger probe` says, while it searches, that it is searching (docs/providers.md
"Checking a provider"): it searched for up to `--max-wait` (10 minutes by default) and
printed nothing until its report, so a mailbox that replaces Message-IDs, the case the
probe is for, looked like a command that hung."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from daemon.doubles.fake_provider import Copy, FakeProvider
from daemon.tools.probe import PROGRESS_EVERY, search_until

MESSAGE_ID = "<probe@example.com>"


def _searched(provider: FakeProvider, said: list[str]) -> dict[str, Any]:
    """`search_until` for 10 minutes every 2 s on a clock that the sleeps move."""
    now = [0.0]

    def sleep(seconds: float) -> None:
        now[0] += seconds

    return search_until(
        provider,
        MESSAGE_ID,
        0.0,
        max_wait=600.0,
        interval=2.0,
        clock=lambda: now[0],
        sleep=sleep,
        progress=said.append,
    )


def test_a_search_that_finds_nothing_says_so_at_once_then_every_so_often() -> None:
    said: list[str] = []
    result = _searched(FakeProvider(clock=lambda: datetime.now(UTC)), said)
    assert result["found"] is False and result["searches"] == 301
    assert said[0] == (
        f"searching the sent mail for {MESSAGE_ID} every 2s, for at most 10m: not found yet"
    )
    assert len(said) == 1 + int(600 // PROGRESS_EVERY) - 1, said
    assert said[1] == f"still not found after {PROGRESS_EVERY:g}s (16 searches)", said
    assert said[-1].startswith("still not found after 570s"), said


def test_a_copy_found_at_the_first_search_says_nothing() -> None:
    provider = FakeProvider(clock=lambda: datetime.now(UTC))
    provider.copies.append(Copy("p1", MESSAGE_ID, datetime(2020, 1, 1, tzinfo=UTC)))
    said: list[str] = []
    assert _searched(provider, said)["found"] is True
    assert said == []

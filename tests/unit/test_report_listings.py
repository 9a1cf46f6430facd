"""The report listings a provider keeps between reads of a mailbox (docs/providers.md
"Bounces"): what keeping them costs. Pure: no client, no emulator."""

from __future__ import annotations

from daemon.providers.gmail_reports import _Progress


class _CountedId(str):
    """A listed id that counts the comparisons made with it."""

    compared = 0

    def __eq__(self, other: object) -> bool:
        _CountedId.compared += 1
        return str.__eq__(self, other)

    __hash__ = str.__hash__


def test_a_gmail_listing_asks_whether_an_id_is_listed_in_constant_time() -> None:
    """Each id a page lists is asked whether it is listed already (pages may overlap while
    the mailbox changes): asked of the list itself, a listing of n ids made n * n / 2
    comparisons (50,000 reports, 1.25e9: minutes of a check worker per read)."""
    n = 4000
    progress = _Progress("q")
    ids = [_CountedId(f"id-{i:06d}") for i in range(n)]
    _CountedId.compared = 0
    for provider_id in ids:
        progress.add(provider_id)
    for provider_id in ids[: n // 2]:  # a page listed again: nothing added twice
        progress.add(_CountedId(str(provider_id)))
    assert progress.ids == ids
    # A set compares an id with another only when their hashes meet: the ids listed
    # again, and a collision now and then; the list made about n * n / 2 (8 million).
    assert _CountedId.compared <= 2 * n, _CountedId.compared


def test_a_gmail_listing_kept_for_the_next_read_still_knows_its_ids() -> None:
    first = _Progress("q")
    for provider_id in ("a", "b", "c"):
        first.add(provider_id)
    kept = _Progress("q", first.ids, None)  # what a stopped read keeps
    kept.add("b")
    kept.add("d")
    assert kept.ids == ["a", "b", "c", "d"]

"""The decision functions: small exhaustive tables and properties over any policy."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policies.decisions import (
    MAX_RETRY_AFTER,
    Decision,
    after_permanent_rejection,
    after_search,
    after_transient_rejection,
    after_unknown,
    backoff_ceiling,
    before_attempt,
    no_policy,
)
from policies.model import ChannelPolicy

NOW = datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC)


def policy(**overrides: Any) -> ChannelPolicy:
    data: dict[str, Any] = {
        "channel": "receipts",
        "provider": "support",
        "from": "Support <support@example.com>",
        "message_id_domain": "mail.example.com",
    }
    data.update(overrides)
    return ChannelPolicy.model_validate(data)


def secs(seconds: float) -> timedelta:
    return timedelta(seconds=seconds)


# -- Decision --------------------------------------------------------------------------------


def test_decision_is_frozen_and_carries_policy_identity() -> None:
    p = policy()
    d = before_attempt(p, attempts_made=0)
    assert (d.policy, d.fingerprint) == ("receipts", p.fingerprint)
    with pytest.raises(AttributeError):
        d.action = "retry"  # type: ignore[misc]


def test_no_policy_goes_to_review() -> None:
    assert no_policy("gone") == Decision("review", "gone", "", reason="no-policy")


# -- before_attempt --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("max_attempts", "attempts_made", "action", "reason"),
    [
        (1, 0, "send", None),
        (1, 1, "review", "max-attempts"),
        (3, 0, "send", None),
        (3, 1, "send", None),
        (3, 2, "send", None),
        (3, 3, "review", "max-attempts"),
        (3, 4, "review", "max-attempts"),
    ],
)
def test_before_attempt(max_attempts: int, attempts_made: int, action: str, reason: str) -> None:
    d = before_attempt(policy(max_attempts=max_attempts), attempts_made=attempts_made)
    assert (d.action, d.reason, d.due_at) == (action, reason, None)


@pytest.mark.parametrize("bad", [-1, True])
def test_before_attempt_refuses_nonsense(bad: int) -> None:
    with pytest.raises(ValueError):
        before_attempt(policy(), attempts_made=bad)


# -- after_unknown ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("on_unknown", "irreversible", "reliable", "action", "reason"),
    [
        ("retry", False, True, "search", None),
        ("retry", False, False, "review", "handle-unreliable"),
        ("search-then-review", False, True, "search", None),
        ("search-then-review", False, False, "review", "handle-unreliable"),
        ("search-then-review", True, True, "search", None),
        ("search-then-review", True, False, "review", "handle-unreliable"),
        ("review", False, True, "review", "unknown-outcome"),
        ("review", False, False, "review", "unknown-outcome"),
        ("review", True, True, "review", "unknown-outcome"),
        ("review", True, False, "review", "unknown-outcome"),
    ],
)
def test_after_unknown(
    on_unknown: str, irreversible: bool, reliable: bool, action: str, reason: str | None
) -> None:
    p = policy(on_unknown=on_unknown, irreversible=irreversible, search_after="5m")
    d = after_unknown(p, now=NOW, handle_reliable=reliable)
    assert (d.action, d.reason) == (action, reason)
    assert d.due_at == (NOW + secs(300) if action == "search" else None)


def test_after_unknown_search_waits_search_after_not_interval() -> None:
    p = policy(search_after="50ms", search_interval="10s")
    assert after_unknown(p, now=NOW).due_at == NOW + secs(0.05)


def test_naive_now_is_refused() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        after_unknown(policy(), now=datetime(2024, 5, 1, 12, 0, 0))


def test_other_timezones_are_converted_to_utc() -> None:
    plus2 = NOW.astimezone(timezone(timedelta(hours=2)))
    d = after_unknown(policy(search_after="1m"), now=plus2)
    assert d.due_at == NOW + secs(60)
    assert d.due_at is not None and d.due_at.utcoffset() == timedelta(0)


# -- after_search ----------------------------------------------------------------------------

# (on_unknown, irreversible, confirm_misses, hits, misses_before) -> (action, reason, due)
# due: None, "now", or "interval" (now + search_interval)
SEARCH_TABLE: list[tuple[str, bool, int, int, int, str, str | None, str | None]] = []
for _mode, _irr in [
    ("retry", False),
    ("search-then-review", False),
    ("search-then-review", True),
    ("review", False),
    ("review", True),
]:
    _final = ("retry", None, "now") if _mode == "retry" else ("review", "unknown-outcome", None)
    for _confirm in (1, 2, 3):
        for _before in range(0, 4):
            SEARCH_TABLE.append((_mode, _irr, _confirm, 1, _before, "confirm", None, None))
            SEARCH_TABLE.append((_mode, _irr, _confirm, 2, _before, "duplicate", "duplicate", None))
            SEARCH_TABLE.append((_mode, _irr, _confirm, 5, _before, "duplicate", "duplicate", None))
            if _before + 1 < _confirm:
                SEARCH_TABLE.append((_mode, _irr, _confirm, 0, _before, "miss", None, "interval"))
            else:
                SEARCH_TABLE.append((_mode, _irr, _confirm, 0, _before, *_final))


@pytest.mark.parametrize(
    (
        "on_unknown",
        "irreversible",
        "confirm_misses",
        "hits",
        "misses_before",
        "action",
        "reason",
        "due",
    ),
    SEARCH_TABLE,
)
def test_after_search_table(
    on_unknown: str,
    irreversible: bool,
    confirm_misses: int,
    hits: int,
    misses_before: int,
    action: str,
    reason: str | None,
    due: str | None,
) -> None:
    p = policy(
        on_unknown=on_unknown,
        irreversible=irreversible,
        confirm_misses=confirm_misses,
        search_after="5m",
        search_interval="2m",
    )
    d = after_search(p, hits=hits, misses_before=misses_before, now=NOW)
    assert (d.action, d.reason) == (action, reason)
    expected_due = {None: None, "now": NOW, "interval": NOW + secs(120)}[due]
    assert d.due_at == expected_due
    assert (d.policy, d.fingerprint) == (p.name, p.fingerprint)


def test_after_search_miss_uses_default_interval() -> None:
    p = policy(search_after="50ms", confirm_misses=3)
    assert after_search(p, hits=0, misses_before=0, now=NOW).due_at == NOW + secs(0.05)


def test_first_miss_is_never_believed_with_default_policy() -> None:
    p = policy(on_unknown="retry")
    assert after_search(p, hits=0, misses_before=0, now=NOW).action == "miss"
    assert after_search(p, hits=0, misses_before=1, now=NOW).action == "retry"


def test_irreversible_never_retries_even_around_validation() -> None:
    # Invariant 5 holds in the decision itself, not only at load time.
    rogue = ChannelPolicy.model_construct(**{**policy().model_dump(), "on_unknown": "retry"})
    rogue = rogue.model_copy(update={"irreversible": True})
    assert (rogue.on_unknown, rogue.irreversible, rogue.confirm_misses) == ("retry", True, 2)
    d = after_search(rogue, hits=0, misses_before=10, now=NOW)
    assert (d.action, d.reason) == ("review", "unknown-outcome")


@pytest.mark.parametrize(("hits", "misses_before"), [(-1, 0), (0, -1), (True, 0)])
def test_after_search_refuses_nonsense(hits: int, misses_before: int) -> None:
    with pytest.raises(ValueError):
        after_search(policy(), hits=hits, misses_before=misses_before, now=NOW)


# -- rejections ------------------------------------------------------------------------------


def test_permanent_rejection_goes_to_review() -> None:
    p = policy()
    assert after_permanent_rejection(p) == Decision(
        "review", "receipts", p.fingerprint, reason="rejected"
    )


@pytest.mark.parametrize(
    ("attempts_made", "ceiling"),
    [(1, 30.0), (2, 60.0), (3, 120.0), (4, 240.0), (7, 1920.0), (8, 3600.0), (50, 3600.0)],
)
def test_backoff_doubles_up_to_its_maximum(attempts_made: int, ceiling: float) -> None:
    p = policy(retry_backoff="30s", retry_backoff_max="1h", max_attempts=100)
    assert backoff_ceiling(p, attempts_made) == ceiling
    for seed in range(20):
        d = after_transient_rejection(
            p, attempts_made=attempts_made, now=NOW, retry_after=None, rng=random.Random(seed)
        )
        assert d.action == "retry" and d.reason is None
        assert d.due_at is not None
        assert NOW + secs(ceiling / 2) <= d.due_at <= NOW + secs(ceiling)


def test_backoff_with_huge_attempt_count_does_not_overflow() -> None:
    p = policy(max_attempts=10**6)
    assert backoff_ceiling(p, 10**5) == p.retry_backoff_max


def test_jitter_spreads_and_is_reproducible() -> None:
    p = policy(max_attempts=10)
    dues = {
        after_transient_rejection(
            p, attempts_made=3, now=NOW, retry_after=None, rng=random.Random(seed)
        ).due_at
        for seed in range(50)
    }
    assert len(dues) > 40
    a = after_transient_rejection(
        p, attempts_made=2, now=NOW, retry_after=None, rng=random.Random(7)
    )
    b = after_transient_rejection(
        p, attempts_made=2, now=NOW, retry_after=None, rng=random.Random(7)
    )
    assert a == b


@pytest.mark.parametrize(
    ("retry_after", "low", "high"),
    [
        (None, 15.0, 30.0),
        (0.0, 15.0, 30.0),
        (10.0, 15.0, 30.0),
        (120.0, 120.0, 120.0),
        (86400.0 * 30, MAX_RETRY_AFTER, MAX_RETRY_AFTER),
        (-5.0, 15.0, 30.0),
        (float("nan"), 15.0, 30.0),
        (float("inf"), 15.0, 30.0),
    ],
)
def test_retry_after_is_a_floor(retry_after: float | None, low: float, high: float) -> None:
    p = policy(retry_backoff="30s", max_attempts=5)
    d = after_transient_rejection(
        p, attempts_made=1, now=NOW, retry_after=retry_after, rng=random.Random(1)
    )
    assert d.action == "retry"
    assert d.due_at is not None
    assert NOW + secs(low) <= d.due_at <= NOW + secs(high)


@pytest.mark.parametrize(("max_attempts", "attempts_made"), [(1, 1), (3, 3), (3, 9)])
def test_transient_rejection_after_max_attempts_goes_to_review(
    max_attempts: int, attempts_made: int
) -> None:
    d = after_transient_rejection(
        policy(max_attempts=max_attempts),
        attempts_made=attempts_made,
        now=NOW,
        retry_after=5.0,
        rng=random.Random(0),
    )
    assert (d.action, d.reason, d.due_at) == ("review", "max-attempts", None)


def test_transient_rejection_for_irreversible_is_a_retry() -> None:
    # Nothing was sent: a definite rejection is safe to retry even on irreversible channels.
    p = policy(irreversible=True, on_unknown="review")
    d = after_transient_rejection(
        p, attempts_made=1, now=NOW, retry_after=None, rng=random.Random()
    )
    assert d.action == "retry"


# -- properties ------------------------------------------------------------------------------


@st.composite
def policies(draw: st.DrawFn) -> ChannelPolicy:
    irreversible = draw(st.booleans())
    modes = (
        ["search-then-review", "review"]
        if irreversible
        else ["retry", "search-then-review", "review"]
    )
    backoff = draw(st.floats(min_value=0.001, max_value=3600.0))
    return policy(
        channel=draw(st.from_regex(r"[a-z][a-z0-9._-]{0,10}", fullmatch=True)),
        irreversible=irreversible,
        on_unknown=draw(st.sampled_from(modes)),
        search_after=draw(st.floats(min_value=0.001, max_value=86400.0)),
        search_interval=draw(st.floats(min_value=0.001, max_value=86400.0)),
        confirm_misses=draw(st.integers(min_value=1, max_value=6)),
        max_attempts=draw(st.integers(min_value=1, max_value=10)),
        retry_backoff=backoff,
        retry_backoff_max=draw(st.floats(min_value=backoff, max_value=86400.0)),
    )


@settings(max_examples=300, deadline=None)
@given(policies(), st.lists(st.integers(min_value=0, max_value=4), min_size=1, max_size=12))
def test_search_sequences_never_resend_unsafely(p: ChannelPolicy, results: list[int]) -> None:
    """Run a sweeper over any sequence of search results, as the daemon would."""
    misses = 0
    now = NOW
    for hits in results:
        d = after_search(p, hits=hits, misses_before=misses, now=now)
        assert (d.policy, d.fingerprint) == (p.name, p.fingerprint)
        if hits >= 2:
            assert (d.action, d.reason) == ("duplicate", "duplicate")
        if hits == 1:
            assert d.action == "confirm"
        if d.action == "retry":
            assert p.on_unknown == "retry"
            assert not p.irreversible
            assert misses + 1 >= p.confirm_misses
            assert hits == 0
        if p.irreversible or p.on_unknown != "retry":
            assert d.action != "retry"
        if d.action == "miss":
            assert misses + 1 < p.confirm_misses
            assert d.due_at == now + secs(p.effective_search_interval)
            misses += 1
            now = d.due_at
            continue
        break  # any other decision ends the search phase
    assert misses < p.confirm_misses


@settings(max_examples=300, deadline=None)
@given(
    policies(),
    st.integers(min_value=0, max_value=50),
    st.integers(min_value=0, max_value=50),
)
def test_after_search_properties(p: ChannelPolicy, hits: int, misses_before: int) -> None:
    d = after_search(p, hits=hits, misses_before=misses_before, now=NOW)
    if hits >= 2:
        assert d.action == "duplicate"
    elif hits == 1:
        assert d.action == "confirm"
    elif misses_before + 1 < p.confirm_misses:
        assert d.action == "miss"
    elif p.on_unknown == "retry" and not p.irreversible:
        assert (d.action, d.due_at) == ("retry", NOW)
    else:
        assert (d.action, d.reason) == ("review", "unknown-outcome")


@settings(max_examples=200, deadline=None)
@given(
    policies(),
    st.integers(min_value=1, max_value=12),
    st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True)),
    st.integers(min_value=0, max_value=2**32),
)
def test_transient_rejection_properties(
    p: ChannelPolicy, attempts_made: int, retry_after: float | None, seed: int
) -> None:
    d = after_transient_rejection(
        p, attempts_made=attempts_made, now=NOW, retry_after=retry_after, rng=random.Random(seed)
    )
    if attempts_made >= p.max_attempts:
        assert (d.action, d.reason) == ("review", "max-attempts")
        return
    assert d.action == "retry"
    assert d.due_at is not None
    ceiling = backoff_ceiling(p, attempts_made)
    assert ceiling <= p.retry_backoff_max
    wait = (d.due_at - NOW).total_seconds()
    assert wait >= ceiling / 2 - 1e-6
    assert wait <= max(ceiling, MAX_RETRY_AFTER) + 1e-6
    if retry_after is not None and 0 < retry_after <= MAX_RETRY_AFTER:
        assert wait >= retry_after - 1e-6

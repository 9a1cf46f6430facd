"""The decision functions: small exhaustive tables and properties over any policy.

Each function returns one of the closed set of typed decisions in ``ledger.decision_types``,
carrying the policy's :class:`PolicyRef`; the tables compare whole decisions.
"""

from __future__ import annotations

import dataclasses
import operator
import random
import string
from datetime import UTC, datetime, timedelta, timezone, tzinfo
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.decision_types import (
    AfterRejection,
    AfterSearch,
    AfterUnknown,
    AfterVerification,
    Confirm,
    Decision,
    Duplicate,
    ResendAt,
    RetryAt,
    Review,
    SearchAgainAt,
    SearchAt,
    Send,
    StopVerifying,
)
from ledger.vocabulary import EscalationReason, PolicyRef
from policies import decisions
from policies.decisions import (
    MAX_RETRY_AFTER,
    after_permanent_rejection,
    after_response,
    after_search,
    after_transient_rejection,
    after_unknown,
    after_verification,
    backoff_ceiling,
    before_attempt,
    before_search,
    cannot_build,
    no_policy,
)
from policies.model import ChannelPolicy

NOW = datetime(2024, 5, 1, 12, 0, 0, tzinfo=UTC)
NAIVE = datetime(2024, 5, 1, 12, 0, 0)
PLUS2 = timezone(timedelta(hours=2))


def policy(**overrides: Any) -> ChannelPolicy:
    data: dict[str, Any] = {
        "channel": "receipts",
        "provider": "support",
        "from": "Support <support@example.com>",
        "message_id_domain": "mail.example.com",
    }
    data.update(overrides)
    return ChannelPolicy.model_validate(data)


#: The From of `policy()`'s jobs, as intake records it (display name and case kept).
OURS = "Support <Support@Example.com>"


def rogue(**overrides: Any) -> ChannelPolicy:
    """A policy built around validation: irreversible, and yet on_unknown = "retry"."""
    fields = {**policy().model_dump(), "on_unknown": "retry", "irreversible": True}
    fields.update(overrides)
    built = ChannelPolicy.model_construct(**fields)
    assert (built.on_unknown, built.irreversible) == ("retry", True)
    return built


def secs(seconds: float) -> timedelta:
    return timedelta(seconds=seconds)


def due_time(decision: Decision) -> datetime | None:
    """The time a decision schedules something at, if any."""
    if isinstance(decision, SearchAt | SearchAgainAt | ResendAt | RetryAt):
        return decision.at
    if isinstance(decision, Confirm):
        return decision.verify_at
    return None


# -- the decision types ----------------------------------------------------------------------


def test_decisions_are_frozen_and_carry_the_policy_ref() -> None:
    p = policy()
    d = before_attempt(p, attempts_made=0, from_addr=OURS)
    assert d == Send(p.ref)
    assert d.policy == PolicyRef("receipts", p.fingerprint)
    with pytest.raises(dataclasses.FrozenInstanceError):
        d.policy = PolicyRef("other", "")  # type: ignore[misc]


def test_no_policy_goes_to_review() -> None:
    d = no_policy("gone")
    assert d == Review(PolicyRef.missing("gone"), EscalationReason.NO_POLICY)
    assert (d.policy.name, d.policy.fingerprint, d.reason) == ("gone", "", "no-policy")


def test_a_message_that_cannot_be_built_goes_to_review() -> None:
    p = policy()
    assert cannot_build(p) == Review(p.ref, EscalationReason.REJECTED)


# -- before_attempt --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("max_attempts", "attempts_made", "sends"),
    [
        (1, 0, True),
        (1, 1, False),
        (3, 0, True),
        (3, 1, True),
        (3, 2, True),
        (3, 3, False),
        (3, 4, False),
    ],
)
def test_before_attempt(max_attempts: int, attempts_made: int, sends: bool) -> None:
    p = policy(max_attempts=max_attempts)
    expected = Send(p.ref) if sends else Review(p.ref, EscalationReason.MAX_ATTEMPTS)
    assert before_attempt(p, attempts_made=attempts_made, from_addr=OURS) == expected


@pytest.mark.parametrize(
    ("allowed_from", "from_addr", "sends"),
    [
        ((), OURS, True),
        ((), "support@example.com", True),
        ((), "Sales <sales@example.com>", False),  # allowed once, not by this policy
        (("*@example.com",), "Sales <SALES@example.com>", True),
        (("billing@example.com",), "sales@example.com", False),
        (("*@example.com",), "sales@example.com.evil.test", False),
        ((), "not an address", False),
    ],
)
def test_a_call_sends_only_as_a_from_the_policy_in_force_allows(
    allowed_from: tuple[str, ...], from_addr: str, sends: bool
) -> None:
    """A job accepted under an `allowed_from` that a reload then narrowed is not sent as
    the withdrawn sender: the check at intake was made on another policy."""
    p = policy(allowed_from=list(allowed_from), max_attempts=1)
    expected = Send(p.ref) if sends else Review(p.ref, EscalationReason.SENDER_NOT_ALLOWED)
    assert before_attempt(p, attempts_made=0, from_addr=from_addr) == expected
    # Withdrawn is said before max_attempts: the person learns why it can never be sent.
    if not sends:
        assert before_attempt(p, attempts_made=5, from_addr=from_addr) == expected


@pytest.mark.parametrize("bad", [-1, True])
def test_before_attempt_refuses_nonsense(bad: int) -> None:
    with pytest.raises(ValueError, match="attempts_made"):
        before_attempt(policy(), attempts_made=bad, from_addr=OURS)


# -- after_unknown and before_search ---------------------------------------------------------


@pytest.mark.parametrize(
    ("on_unknown", "irreversible", "reliable", "reason"),
    [
        ("retry", False, True, None),
        ("retry", False, False, EscalationReason.HANDLE_UNRELIABLE),
        ("search-then-review", False, True, None),
        ("search-then-review", False, False, EscalationReason.HANDLE_UNRELIABLE),
        ("search-then-review", True, True, None),
        ("search-then-review", True, False, EscalationReason.HANDLE_UNRELIABLE),
        ("review", False, True, EscalationReason.UNKNOWN_OUTCOME),
        ("review", False, False, EscalationReason.UNKNOWN_OUTCOME),
        ("review", True, True, EscalationReason.UNKNOWN_OUTCOME),
        ("review", True, False, EscalationReason.UNKNOWN_OUTCOME),
    ],
)
def test_after_unknown(
    on_unknown: str, irreversible: bool, reliable: bool, reason: EscalationReason | None
) -> None:
    p = policy(on_unknown=on_unknown, irreversible=irreversible, search_after="5m")
    expected = SearchAt(p.ref, NOW + secs(300)) if reason is None else Review(p.ref, reason)
    assert after_unknown(p, now=NOW, handle_reliable=reliable) == expected


def test_after_unknown_assumes_a_reliable_handle_by_default() -> None:
    p = policy(search_after="1m")
    assert after_unknown(p, now=NOW) == SearchAt(p.ref, NOW + secs(60))


@pytest.mark.parametrize("on_unknown", ["retry", "search-then-review", "review"])
def test_before_search(on_unknown: str) -> None:
    # A provider that replaces our Message-ID makes every search miss a sent copy.
    p = policy(on_unknown=on_unknown)
    assert before_search(p, handle_reliable=True) is None
    assert before_search(p, handle_reliable=False) == Review(
        p.ref, EscalationReason.HANDLE_UNRELIABLE
    )


def test_after_unknown_search_waits_search_after_not_interval() -> None:
    p = policy(search_after="50ms", search_interval="10s")
    assert after_unknown(p, now=NOW) == SearchAt(p.ref, NOW + secs(0.05))


def test_other_timezones_are_converted_to_utc() -> None:
    p = policy(search_after="1m", search_interval="2m", confirm_misses=3, max_attempts=5)
    plus2 = NOW.astimezone(PLUS2)
    unknown = after_unknown(p, now=plus2)
    again = after_search(p, hits=0, misses_before=0, resent=False, now=plus2)
    retry = after_transient_rejection(
        p, attempts_made=1, now=plus2, retry_after=600.0, rng=random.Random(0)
    )
    confirm = after_response(p, resent=True, now=plus2)
    assert isinstance(unknown, SearchAt) and unknown.at == NOW + secs(60)
    assert isinstance(again, SearchAgainAt) and again.at == NOW + secs(120)
    assert isinstance(retry, RetryAt) and retry.at == NOW + secs(600)
    assert confirm.verify_at == NOW + secs(3600)
    for at in (unknown.at, again.at, retry.at, confirm.verify_at):
        # UTC itself, not the machine's own zone (which may be UTC too).
        assert at is not None and at.tzinfo is UTC


@pytest.mark.parametrize(
    "call",
    [
        lambda p: after_unknown(p, now=NAIVE),
        lambda p: after_unknown(p, now=NAIVE, handle_reliable=False),
        lambda p: after_search(p, hits=0, misses_before=0, resent=False, now=NAIVE),
        lambda p: after_search(p, hits=1, misses_before=0, resent=False, now=NAIVE),
        lambda p: after_search(p, hits=2, misses_before=0, resent=False, now=NAIVE),
        lambda p: after_search(p, hits=0, misses_before=5, resent=False, now=NAIVE),
        lambda p: after_response(p, resent=True, now=NAIVE),
        lambda p: after_verification(p, hits=0, verifications_before=0, now=NAIVE),
        lambda p: after_verification(p, hits=1, verifications_before=0, now=NAIVE),
        lambda p: after_verification(p, hits=3, verifications_before=5, now=NAIVE),
        lambda p: after_transient_rejection(
            p, attempts_made=1, now=NAIVE, retry_after=None, rng=random.Random(0)
        ),
    ],
)
def test_naive_now_is_refused(call: Any) -> None:
    with pytest.raises(ValueError, match=r"^now must be a timezone-aware datetime \(UTC\)$"):
        call(policy(on_unknown="retry"))


class NoOffset(tzinfo):
    """A time zone that knows no offset: aware in form, not in fact."""

    def utcoffset(self, dt: datetime | None) -> timedelta | None:
        return None

    def tzname(self, dt: datetime | None) -> str | None:
        raise NotImplementedError  # as tzinfo's own: a zone that says nothing

    def dst(self, dt: datetime | None) -> timedelta | None:
        raise NotImplementedError


def test_a_time_zone_without_an_offset_is_refused() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        after_unknown(policy(), now=datetime(2024, 5, 1, 12, tzinfo=NoOffset()))


# -- after_search ----------------------------------------------------------------------------

# (on_unknown, irreversible, confirm_misses, hits, misses_before, expected kind)
# kind: "confirm", "duplicate", "again" (SearchAgainAt after search_interval), "final"
# (what believed misses lead to: a resend for "retry", a review otherwise).
SEARCH_TABLE: list[tuple[str, bool, int, int, int, str]] = []
for _mode, _irr in [
    ("retry", False),
    ("search-then-review", False),
    ("search-then-review", True),
    ("review", False),
    ("review", True),
]:
    for _confirm in (1, 2, 3):
        for _before in range(0, 4):
            SEARCH_TABLE.append((_mode, _irr, _confirm, 1, _before, "confirm"))
            SEARCH_TABLE.append((_mode, _irr, _confirm, 2, _before, "duplicate"))
            SEARCH_TABLE.append((_mode, _irr, _confirm, 5, _before, "duplicate"))
            _empty = "again" if _before + 1 < _confirm else "final"
            SEARCH_TABLE.append((_mode, _irr, _confirm, 0, _before, _empty))


@pytest.mark.parametrize("resent", [False, True])
@pytest.mark.parametrize(
    ("on_unknown", "irreversible", "confirm_misses", "hits", "misses_before", "kind"),
    SEARCH_TABLE,
)
def test_after_search_table(
    on_unknown: str,
    irreversible: bool,
    confirm_misses: int,
    hits: int,
    misses_before: int,
    kind: str,
    resent: bool,
) -> None:
    p = policy(
        on_unknown=on_unknown,
        irreversible=irreversible,
        confirm_misses=confirm_misses,
        search_after="5m",
        search_interval="2m",
        verify_after="30m",
    )
    final: Decision = (
        ResendAt(p.ref, NOW, misses_required=confirm_misses)
        if on_unknown == "retry"
        else Review(p.ref, EscalationReason.UNKNOWN_OUTCOME)
    )
    table: dict[str, Decision] = {
        "confirm": Confirm(p.ref, verify_at=NOW + secs(1800) if resent else None),
        "duplicate": Duplicate(p.ref),
        "again": SearchAgainAt(p.ref, NOW + secs(120)),
        "final": final,
    }
    expected = table[kind]
    d = after_search(p, hits=hits, misses_before=misses_before, resent=resent, now=NOW)
    assert d == expected
    assert d.policy == p.ref


def test_after_search_miss_uses_default_interval() -> None:
    p = policy(search_after="50ms", confirm_misses=3)
    d = after_search(p, hits=0, misses_before=0, resent=False, now=NOW)
    assert d == SearchAgainAt(p.ref, NOW + secs(0.05))


def test_first_miss_is_never_believed_with_default_policy() -> None:
    p = policy(on_unknown="retry")
    assert p.confirm_misses == 2
    first = after_search(p, hits=0, misses_before=0, resent=False, now=NOW)
    assert first == SearchAgainAt(p.ref, NOW + secs(p.effective_search_interval))
    second = after_search(p, hits=0, misses_before=1, resent=False, now=NOW)
    assert second == ResendAt(p.ref, NOW, misses_required=2)


@pytest.mark.parametrize("resent", [False, True])
@pytest.mark.parametrize("misses_before", [1, 10])
def test_irreversible_never_resends_even_around_validation(
    resent: bool, misses_before: int
) -> None:
    # Invariant 5 holds in the decision itself, not only at load time.
    p = rogue()
    assert p.confirm_misses == 2
    d = after_search(p, hits=0, misses_before=misses_before, resent=resent, now=NOW)
    assert d == Review(p.ref, EscalationReason.UNKNOWN_OUTCOME)


def test_a_policy_built_around_validation_cannot_be_loaded() -> None:
    # ... and the loader's validation refuses the same combination outright.
    with pytest.raises(ValueError, match="irreversible"):
        policy(on_unknown="retry", irreversible=True)


@pytest.mark.parametrize(("hits", "misses_before"), [(-1, 0), (0, -1), (True, 0), (0, True)])
def test_after_search_refuses_nonsense(hits: int, misses_before: int) -> None:
    with pytest.raises(ValueError, match="must be an int >= 0"):
        after_search(policy(), hits=hits, misses_before=misses_before, resent=False, now=NOW)


@pytest.mark.parametrize("on_unknown", ["retry", "search-then-review", "review"])
@pytest.mark.parametrize("hits", [1, 2, 25])
def test_copies_only_in_the_trash_go_to_review_on_every_channel(on_unknown: str, hits: int) -> None:
    # A received message deleted lies in the trash as a sent copy deleted does: neither
    # a confirmation, a duplicate, nor a miss (docs/how-it-works.md "Counting copies").
    p = policy(on_unknown=on_unknown)
    for misses_before in (0, 1, 5):
        for resent in (False, True):
            d = after_search(
                p, hits=hits, misses_before=misses_before, resent=resent, now=NOW,
                only_in_trash=True,
            )  # fmt: skip
            assert d == Review(p.ref, EscalationReason.ONLY_IN_TRASH)
    counted = after_search(p, hits=hits, misses_before=0, resent=False, now=NOW)
    assert isinstance(counted, Confirm if hits == 1 else Duplicate)


@pytest.mark.parametrize(("hits", "match"), [(0, "and none found"), (-1, "must be an int")])
def test_copies_only_in_the_trash_need_one_copy_found(hits: int, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        after_search(
            policy(), hits=hits, misses_before=0, resent=False, now=NOW, only_in_trash=True
        )


# -- after_response and verification ---------------------------------------------------------


def test_after_response_verifies_only_after_a_resend() -> None:
    p = policy(verify_after="30m")
    assert after_response(p, resent=False, now=NOW) == Confirm(p.ref)
    assert after_response(p, resent=False, now=NOW).verify_at is None
    assert after_response(p, resent=True, now=NOW) == Confirm(p.ref, verify_at=NOW + secs(1800))


# (confirm_misses, hits, verifications_before, kind)
VERIFY_TABLE: list[tuple[int, int, int, str]] = []
for _confirm in (1, 2, 3):
    for _before in range(0, 4):
        VERIFY_TABLE.append((_confirm, 1, _before, "confirm"))
        VERIFY_TABLE.append((_confirm, 2, _before, "duplicate"))
        VERIFY_TABLE.append((_confirm, 7, _before, "duplicate"))
        VERIFY_TABLE.append((_confirm, 0, _before, "again" if _before + 1 < _confirm else "stop"))


@pytest.mark.parametrize(("confirm_misses", "hits", "verifications_before", "kind"), VERIFY_TABLE)
def test_after_verification_table(
    confirm_misses: int, hits: int, verifications_before: int, kind: str
) -> None:
    p = policy(confirm_misses=confirm_misses, search_interval="2m", verify_after="30m")
    table: dict[str, Decision] = {
        "confirm": Confirm(p.ref),  # verified: nothing more to count
        "duplicate": Duplicate(p.ref),
        "again": SearchAgainAt(p.ref, NOW + secs(120)),
        "stop": StopVerifying(p.ref),
    }
    expected = table[kind]
    d = after_verification(p, hits=hits, verifications_before=verifications_before, now=NOW)
    assert d == expected


@pytest.mark.parametrize("bad", [-1, True])
def test_after_verification_refuses_nonsense_hits(bad: int) -> None:
    with pytest.raises(ValueError, match="hits"):
        after_verification(policy(), hits=bad, verifications_before=0, now=NOW)


# -- rejections ------------------------------------------------------------------------------


def test_permanent_rejection_goes_to_review() -> None:
    p = policy()
    assert after_permanent_rejection(p) == Review(p.ref, EscalationReason.REJECTED)


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
        assert isinstance(d, RetryAt) and d.policy == p.ref
        assert NOW + secs(ceiling / 2) <= d.at <= NOW + secs(ceiling)


def test_backoff_with_huge_attempt_count_does_not_overflow() -> None:
    p = policy(max_attempts=1000)
    assert backoff_ceiling(p, 10**5) == p.retry_backoff_max


def test_jitter_spreads_and_is_reproducible() -> None:
    p = policy(max_attempts=10)

    def retry(attempts_made: int, seed: int) -> RetryAt:
        d = after_transient_rejection(
            p, attempts_made=attempts_made, now=NOW, retry_after=None, rng=random.Random(seed)
        )
        assert isinstance(d, RetryAt)
        return d

    assert len({retry(3, seed).at for seed in range(50)}) > 40
    assert retry(2, 7) == retry(2, 7)


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
    assert isinstance(d, RetryAt)
    assert NOW + secs(low) <= d.at <= NOW + secs(high)


@pytest.mark.parametrize(("max_attempts", "attempts_made"), [(1, 1), (3, 3), (3, 9)])
def test_transient_rejection_after_max_attempts_goes_to_review(
    max_attempts: int, attempts_made: int
) -> None:
    p = policy(max_attempts=max_attempts)
    d = after_transient_rejection(
        p, attempts_made=attempts_made, now=NOW, retry_after=5.0, rng=random.Random(0)
    )
    assert d == Review(p.ref, EscalationReason.MAX_ATTEMPTS)


@pytest.mark.parametrize("bad", [-1, True])
def test_transient_rejection_refuses_nonsense(bad: int) -> None:
    with pytest.raises(ValueError, match="attempts_made"):
        after_transient_rejection(
            policy(), attempts_made=bad, now=NOW, retry_after=None, rng=random.Random(0)
        )


@pytest.mark.parametrize("p", [policy(irreversible=True, on_unknown="review"), rogue()])
def test_transient_rejection_for_irreversible_is_a_retry(p: ChannelPolicy) -> None:
    # Nothing was sent: a definite rejection is safe to retry even on irreversible channels.
    d = after_transient_rejection(
        p, attempts_made=1, now=NOW, retry_after=None, rng=random.Random()
    )
    assert isinstance(d, RetryAt) and d.policy == p.ref


# -- properties ------------------------------------------------------------------------------


#: The channel names of `[a-z][a-z0-9._-]{0,10}`: a letter, then up to ten of the others
#: (every such name and no other, as st.from_regex(..., fullmatch=True) draws them, at
#: less than half its cost per draw: 2.1 against 4.7 ms).
channels = st.builds(
    operator.add,
    st.sampled_from(string.ascii_lowercase),
    st.text(alphabet=string.ascii_lowercase + string.digits + "._-", max_size=10),
)


@st.composite
def valid_policies(draw: st.DrawFn) -> ChannelPolicy:
    irreversible = draw(st.booleans())
    modes = (
        ["search-then-review", "review"]
        if irreversible
        else ["retry", "search-then-review", "review"]
    )
    backoff = draw(st.floats(min_value=0.001, max_value=3600.0))
    return policy(
        channel=draw(channels),
        irreversible=irreversible,
        on_unknown=draw(st.sampled_from(modes)),
        search_after=draw(st.floats(min_value=0.001, max_value=86400.0)),
        search_interval=draw(st.floats(min_value=0.001, max_value=86400.0)),
        confirm_misses=draw(st.integers(min_value=1, max_value=6)),
        max_attempts=draw(st.integers(min_value=1, max_value=10)),
        retry_backoff=backoff,
        retry_backoff_max=draw(st.floats(min_value=backoff, max_value=86400.0)),
        verify_after=draw(st.floats(min_value=0.001, max_value=86400.0)),
    )


@st.composite
def rogue_policies(draw: st.DrawFn) -> ChannelPolicy:
    """Valid values, then irreversible with "retry" forced in around validation."""
    base = draw(valid_policies())
    return ChannelPolicy.model_construct(
        **{**base.model_dump(), "on_unknown": "retry", "irreversible": True}
    )


policies = st.one_of(valid_policies(), rogue_policies())
nows = st.datetimes(
    min_value=datetime(2000, 1, 1),
    max_value=datetime(2100, 1, 1),
    timezones=st.sampled_from([UTC, PLUS2, timezone(timedelta(hours=-7, minutes=-30))]),
)
counts = st.integers(min_value=0, max_value=50)


def never_resends_unsafely(p: ChannelPolicy, d: Decision) -> None:
    if p.irreversible or p.on_unknown != "retry":
        assert not isinstance(d, ResendAt)


def due_not_before(d: Decision, now: datetime) -> None:
    at = due_time(d)
    assert at is None or at >= now


@settings(max_examples=300, deadline=None)
@given(policies, counts, nows)
def test_before_attempt_properties(p: ChannelPolicy, attempts_made: int, now: datetime) -> None:
    d = before_attempt(p, attempts_made=attempts_made, from_addr=OURS)
    assert isinstance(d, Send | Review)
    assert d.policy == p.ref
    assert isinstance(d, Review) == (attempts_made >= p.max_attempts)


@settings(max_examples=300, deadline=None)
@given(policies, st.booleans(), nows)
def test_after_unknown_properties(p: ChannelPolicy, reliable: bool, now: datetime) -> None:
    d = after_unknown(p, now=now, handle_reliable=reliable)
    assert isinstance(d, AfterUnknown)
    assert d.policy == p.ref
    due_not_before(d, now)
    if isinstance(d, SearchAt):
        # never a search before the index lag has passed
        assert d.at == now + secs(p.search_after)
    else:
        assert p.on_unknown == "review" or not reliable
    refused = before_search(p, handle_reliable=reliable)
    assert refused is None or (isinstance(refused, Review) and refused.policy == p.ref)
    assert (refused is None) == reliable


@settings(max_examples=500, deadline=None)
@given(policies, counts, counts, st.booleans(), nows)
def test_after_search_properties(
    p: ChannelPolicy, hits: int, misses_before: int, resent: bool, now: datetime
) -> None:
    d = after_search(p, hits=hits, misses_before=misses_before, resent=resent, now=now)
    assert isinstance(d, AfterSearch)
    assert d.policy == p.ref
    due_not_before(d, now)
    never_resends_unsafely(p, d)
    if hits >= 2:
        assert d == Duplicate(p.ref)
    elif hits == 1:
        assert isinstance(d, Confirm)
        assert (d.verify_at is not None) == resent
    elif misses_before + 1 < p.confirm_misses:
        assert d == SearchAgainAt(p.ref, now + secs(p.effective_search_interval))
    elif p.on_unknown == "retry" and not p.irreversible:
        assert d == ResendAt(p.ref, now, misses_required=p.confirm_misses)
    else:
        assert d == Review(p.ref, EscalationReason.UNKNOWN_OUTCOME)


@settings(max_examples=300, deadline=None)
@given(policies, st.lists(st.integers(min_value=0, max_value=4), min_size=1, max_size=12), nows)
def test_search_sequences_never_resend_unsafely(
    p: ChannelPolicy, results: list[int], start: datetime
) -> None:
    """Run a sweeper over any sequence of search results, as the daemon would."""
    misses = 0
    now = start
    for hits in results:
        d = after_search(p, hits=hits, misses_before=misses, resent=False, now=now)
        assert isinstance(d, AfterSearch) and d.policy == p.ref
        due_not_before(d, now)
        never_resends_unsafely(p, d)
        if hits >= 2:
            assert isinstance(d, Duplicate)
        if hits == 1:
            assert d == Confirm(p.ref)
        if isinstance(d, ResendAt):
            assert p.on_unknown == "retry" and not p.irreversible
            assert misses + 1 >= p.confirm_misses == d.misses_required
            assert hits == 0
        if isinstance(d, SearchAgainAt):
            assert misses + 1 < p.confirm_misses
            assert d.at == now + secs(p.effective_search_interval)
            misses += 1
            now = d.at
            continue
        break  # any other decision ends the search phase
    assert misses < p.confirm_misses


@settings(max_examples=300, deadline=None)
@given(policies, st.booleans(), nows)
def test_after_response_properties(p: ChannelPolicy, resent: bool, now: datetime) -> None:
    d = after_response(p, resent=resent, now=now)
    assert isinstance(d, Confirm) and d.policy == p.ref
    due_not_before(d, now)
    assert d.verify_at == (now + secs(p.verify_after) if resent else None)


@settings(max_examples=300, deadline=None)
@given(policies, counts, counts, nows)
def test_after_verification_properties(
    p: ChannelPolicy, hits: int, verifications_before: int, now: datetime
) -> None:
    d = after_verification(p, hits=hits, verifications_before=verifications_before, now=now)
    assert isinstance(d, AfterVerification)
    assert d.policy == p.ref
    due_not_before(d, now)
    if hits >= 2:
        assert d == Duplicate(p.ref)
    elif hits == 1:
        assert d == Confirm(p.ref)  # no further verification
    elif verifications_before + 1 < p.confirm_misses:
        assert d == SearchAgainAt(p.ref, now + secs(p.effective_search_interval))
    else:
        assert d == StopVerifying(p.ref)


@settings(max_examples=300, deadline=None)
@given(policies, st.lists(st.integers(min_value=0, max_value=3), min_size=1, max_size=12), nows)
def test_verification_sequences_end(p: ChannelPolicy, results: list[int], start: datetime) -> None:
    """A verifier over any sequence of counts looks at most ``confirm_misses`` times."""
    done = 0
    now = start
    for hits in results:
        d = after_verification(p, hits=hits, verifications_before=done, now=now)
        done += 1
        if isinstance(d, SearchAgainAt):
            assert d.at >= now
            now = d.at
            continue
        assert isinstance(d, Confirm | Duplicate | StopVerifying)
        break
    assert done <= p.confirm_misses


@settings(max_examples=300, deadline=None)
@given(
    policies,
    st.integers(min_value=1, max_value=12),
    st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True)),
    st.integers(min_value=0, max_value=2**32),
    nows,
)
def test_transient_rejection_properties(
    p: ChannelPolicy, attempts_made: int, retry_after: float | None, seed: int, now: datetime
) -> None:
    d = after_transient_rejection(
        p, attempts_made=attempts_made, now=now, retry_after=retry_after, rng=random.Random(seed)
    )
    assert isinstance(d, AfterRejection)
    assert d.policy == p.ref
    due_not_before(d, now)
    if attempts_made >= p.max_attempts:
        assert d == Review(p.ref, EscalationReason.MAX_ATTEMPTS)
        return
    assert isinstance(d, RetryAt)
    ceiling = backoff_ceiling(p, attempts_made)
    assert ceiling <= p.retry_backoff_max
    wait = (d.at - now).total_seconds()
    assert wait >= ceiling / 2 - 1e-6
    assert wait <= max(ceiling, MAX_RETRY_AFTER) + 1e-6
    if retry_after is not None and 0 < retry_after <= MAX_RETRY_AFTER:
        assert wait >= retry_after - 1e-6


@settings(max_examples=100, deadline=None)
@given(policies, channels)
def test_reviews_without_inputs_properties(p: ChannelPolicy, channel: str) -> None:
    for d in (after_permanent_rejection(p), cannot_build(p)):
        assert d == Review(p.ref, EscalationReason.REJECTED)
    assert no_policy(channel) == Review(PolicyRef(channel, ""), EscalationReason.NO_POLICY)


# -- an unavailable provider: waited out, reviewed only after give_up_after --------------


def test_an_unavailable_provider_is_waited_out_whatever_the_attempts() -> None:
    start = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
    now = start + timedelta(days=3)
    decision = decisions.after_unavailable(
        policy(max_attempts=1), waiting_since=start, now=now, wait=1.0, retry_after=None
    )
    assert isinstance(decision, RetryAt) and decision.at == now + timedelta(seconds=1)
    later = decisions.after_unavailable(
        policy(), waiting_since=start, now=now, wait=1.0, retry_after=45.0
    )
    assert isinstance(later, RetryAt) and later.at == now + timedelta(seconds=45)


@settings(deadline=None)
@given(waited=st.integers(0, 1000), limit=st.integers(1, 500), retry_after=st.floats(0, 2000))
def test_give_up_after_bounds_the_wait(waited: int, limit: int, retry_after: float) -> None:
    start = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
    now = start + timedelta(seconds=waited)
    chosen = policy(give_up_after=limit)
    decision = decisions.after_unavailable(
        chosen, waiting_since=start, now=now, wait=1.0, retry_after=retry_after
    )
    if waited > limit:
        assert isinstance(decision, Review)
        assert decision.reason == EscalationReason.PROVIDER_UNAVAILABLE
    else:
        # Due again, never after the give-up time (unless that is now).
        assert isinstance(decision, RetryAt)
        assert now <= decision.at <= max(now, start + timedelta(seconds=limit))
    assert decisions.waited_too_long(policy(), waiting_since=start, now=now) is None


def test_give_up_after_keeps_old_fingerprints_and_parses_durations() -> None:
    assert policy().fingerprint == policy(give_up_after=None).fingerprint
    assert policy(give_up_after="10m").give_up_after == 600.0
    assert policy(give_up_after="10m").fingerprint != policy().fingerprint


# -- what mutation testing found untested (issue 28, `make mutation`) -------------------


def test_the_wait_after_an_unavailable_call_is_exactly_the_longer_of_wait_and_retry_after() -> None:
    start = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
    now = start + timedelta(minutes=5)
    chosen = policy(give_up_after=3600)
    for wait, retry_after, due in [
        (0.0, None, now),  # no floor of its own: due now
        (-5.0, None, now),  # a negative wait is none
        (0.0, 0.5, now + secs(0.5)),  # a Retry-After under a second still counts
        (0.0, 0.0, now),
        (2.0, None, now + secs(2)),
        (2.0, 30.0, now + secs(30)),
        (0.0, float("inf"), now),  # not finite: ignored
        (0.0, float("nan"), now),
        (0.0, -3.0, now),
    ]:
        decision = decisions.after_unavailable(
            chosen, waiting_since=start, now=now, wait=wait, retry_after=retry_after
        )
        assert decision == RetryAt(chosen.ref, due), (wait, retry_after)
    # Capped at the give-up time, never before now.
    capped = decisions.after_unavailable(
        chosen, waiting_since=start, now=now, wait=0.0, retry_after=86400.0
    )
    assert capped == RetryAt(chosen.ref, start + secs(3600))


def test_a_transient_rejection_takes_a_retry_after_under_a_second() -> None:
    chosen = policy(retry_backoff=1, retry_backoff_max=1)
    delay = random.Random(0).uniform(0.5, 1)  # the jittered backoff of this rng
    assert delay < 0.99
    decision = after_transient_rejection(
        chosen, attempts_made=1, now=NOW, retry_after=0.99, rng=random.Random(0)
    )
    assert decision == RetryAt(chosen.ref, NOW + secs(0.99))
    for retry_after in (None, 0.0, -1.0, float("inf"), float("nan")):
        decision = after_transient_rejection(
            chosen, attempts_made=1, now=NOW, retry_after=retry_after, rng=random.Random(0)
        )
        assert decision == RetryAt(chosen.ref, NOW + secs(random.Random(0).uniform(0.5, 1)))


@pytest.mark.parametrize(
    "call",
    [
        lambda: after_transient_rejection(
            policy(), attempts_made=-1, now=NOW, retry_after=None, rng=random.Random(0)
        ),
        lambda: decisions.after_draft_pending(policy(), attempts_made=-1, now=NOW),
        lambda: before_attempt(policy(), attempts_made=-1, from_addr=OURS),
    ],
)
def test_a_negative_attempt_count_is_refused_naming_it(call: Any) -> None:
    with pytest.raises(ValueError, match=r"^attempts_made must be an int >= 0, got -1$"):
        call()


@pytest.mark.parametrize(
    ("name", "call"),
    [
        ("hits", lambda: after_search(policy(), hits=-1, misses_before=0, resent=False, now=NOW)),
        (
            "misses_before",
            lambda: after_search(policy(), hits=0, misses_before=-1, resent=False, now=NOW),
        ),
        (
            "verifications_before",
            lambda: after_verification(policy(), hits=0, verifications_before=-1, now=NOW),
        ),
    ],
)
def test_a_negative_count_is_refused_naming_it(name: str, call: Any) -> None:
    with pytest.raises(ValueError, match=rf"^{name} must be an int >= 0, got -1$"):
        call()


def test_a_pending_draft_decision_carries_the_policy_ref() -> None:
    for chosen, attempts in [
        (policy(pending_draft="review"), 0),
        (policy(pending_draft="send", max_attempts=2), 2),
        (policy(pending_draft="send", max_attempts=2), 1),
    ]:
        decision = decisions.after_draft_pending(chosen, attempts_made=attempts, now=NOW)
        assert decision.policy == chosen.ref

"""The calls a worker makes under its claim after the send, the read-back of a confirmed
send's Message-ID and the draft's check after an unknown one, end within the claim's lease
as last written, as the send does (docs/architecture.md "Leases"). Before, only the send
was told its lease (`providers.base.call_time_left`): the read-back and the check waited
their own `timeout` however long ago the lease had ended, while another daemon recovered
the claim. Renewals that land move their bound on, as they move the send's."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from tests.unit.engine_rig import TIMEOUT, EngineRig, policy

from daemon.doubles.fake_drafts import FakeDraftsProvider
from daemon.doubles.fake_provider import Scripted
from daemon.providers.base import SendOutcome, call_time_left
from daemon.providers.draft_handle import Draft, DraftCheck

LEGAL = policy("legal", on_unknown="review", pending_draft="review", search_after="60s")


def _no_renewal_lands(rig: EngineRig) -> None:
    """The store lost: no renewal lands (the lease as last written is the claim's)."""
    rig.engine.leases.renew_due = lambda: 0  # type: ignore[method-assign]


def _renewals_land_while(rig: EngineRig, told: list[float | None]) -> Callable[[], None]:
    """A slow call: two `timeout`s of the rig's time pass in it, a renewal landing every
    third of one; what the call is told it has left is noted at each step."""

    def slow() -> None:
        for _ in range(6):
            rig.clock.advance(TIMEOUT / 3)
            rig.engine.renew_leases()
            told.append(call_time_left())

    return slow


def _read_back_told(rig: EngineRig, during: Callable[[], None] | None = None) -> list[float | None]:
    """What the read-back of the next confirmed send is told it has left (`during`: what
    happens in it, after that)."""
    told: list[float | None] = []
    read = rig.provider.read_message_id

    def reading(provider_message_id: str) -> str | None:
        told.append(call_time_left())
        if during is not None:
            during()
        return read(provider_message_id)

    rig.provider.read_message_id = reading  # type: ignore[method-assign]
    return told


def test_the_read_back_after_a_send_ends_with_the_claims_lease() -> None:
    """A send that took half a `timeout`, its renewal not landing (the store lost): the
    read-back after it has the other half, not a whole `timeout` of its own (before: told
    nothing, `None`)."""
    rig = EngineRig(LEGAL)
    try:
        _no_renewal_lands(rig)
        told = _read_back_told(rig)
        rig.provider.during_send = lambda: rig.clock.advance(TIMEOUT / 2)
        rig.submit("legal", "k1")
        rig.tick()
    finally:
        rig.close()
    assert told == [pytest.approx(TIMEOUT / 2)]
    assert rig.events("k1")[-1] == "Confirmed"


def test_a_slow_read_back_whose_renewals_land_is_never_told_its_lease_ended() -> None:
    """Renewals cover the read-back as they cover the send: two `timeout`s of it, and
    what it has left never reaches 0; the send stays confirmed."""
    rig = EngineRig(LEGAL)
    told: list[float | None] = []
    try:
        _read_back_told(rig, _renewals_land_while(rig, told))
        rig.submit("legal", "k1")
        rig.tick()
    finally:
        rig.close()
    assert len(told) == 6 and all(left is not None and left > 0 for left in told), told
    assert rig.events("k1")[-1] == "Confirmed"
    assert "Unknown" not in rig.events("k1")


@pytest.fixture
def drafts_rig() -> EngineRig:
    """The rig on a provider that sends through drafts (Gmail's `send_via = "drafts"`)."""
    return EngineRig(LEGAL, provider=lambda clock: FakeDraftsProvider("fake", clock=clock))


def _check_told(rig: EngineRig, during: Callable[[], None] | None = None) -> list[float | None]:
    """What the draft's check after the next unknown send is told it has left."""
    told: list[float | None] = []
    provider = rig.provider
    assert isinstance(provider, FakeDraftsProvider)
    check = provider.check_draft

    def checking(draft: Draft) -> DraftCheck:
        told.append(call_time_left())
        if during is not None:
            during()
        return check(draft)

    provider.check_draft = checking  # type: ignore[method-assign]
    return told


def _draft_sends_take(rig: EngineRig, seconds: float) -> None:
    """Each draft's send takes `seconds` of the rig's time."""
    provider = rig.provider
    assert isinstance(provider, FakeDraftsProvider)
    send = provider.send_draft

    def slow(draft: Draft) -> SendOutcome:
        rig.clock.advance(seconds)
        return send(draft)

    provider.send_draft = slow  # type: ignore[method-assign]


def test_the_draft_check_after_an_unknown_send_ends_with_the_claims_lease(
    drafts_rig: EngineRig,
) -> None:
    """An unknown send (its answer dropped) that took half a `timeout`, its renewal not
    landing: the draft's check after it has the other half (before: told nothing)."""
    rig = drafts_rig
    try:
        _no_renewal_lands(rig)
        told = _check_told(rig)
        rig.provider.script(Scripted.dropped_response())
        _draft_sends_take(rig, TIMEOUT / 2)
        rig.submit("legal", "k1")
        rig.tick()
    finally:
        rig.close()
    assert told == [pytest.approx(TIMEOUT / 2)]
    assert "Unknown" in rig.events("k1")


def test_a_slow_draft_check_whose_renewals_land_is_never_told_its_lease_ended(
    drafts_rig: EngineRig,
) -> None:
    rig = drafts_rig
    told: list[float | None] = []
    try:
        _check_told(rig, _renewals_land_while(rig, told))
        rig.provider.script(Scripted.dropped_response())
        rig.submit("legal", "k1")
        rig.tick()
    finally:
        rig.close()
    assert len(told) == 6 and all(left is not None and left > 0 for left in told), told
    assert rig.events("k1").count("LeaseRenewed") >= 5


def test_no_read_back_starts_once_the_claims_lease_has_ended() -> None:
    """A send answered as its lease ended, no renewal landing: the send is confirmed (an
    answer that came is read), but a read-back begun then would be cut at once, a hang
    for the circuit the provider never showed, made while another daemon may recover the
    claim. It is not made (before: made, told 0 s left)."""
    rig = EngineRig(LEGAL)
    try:
        _no_renewal_lands(rig)
        told = _read_back_told(rig)
        rig.provider.during_send = lambda: rig.clock.advance(TIMEOUT)
        rig.submit("legal", "k1")
        rig.tick()
    finally:
        rig.close()
    assert told == []
    assert rig.events("k1")[-1] == "Confirmed"


def test_no_draft_check_starts_once_the_claims_lease_has_ended(drafts_rig: EngineRig) -> None:
    """As the read-back: the unknown send's draft is asked once the Unknown is recorded,
    by the work on unknown outcomes (no claim, no lease: told None), not under the ended
    lease (before: checked there first, told 0 s left)."""
    rig = drafts_rig
    try:
        _no_renewal_lands(rig)
        told = _check_told(rig)
        rig.provider.script(Scripted.dropped_response())
        _draft_sends_take(rig, TIMEOUT)
        rig.submit("legal", "k1")
        rig.tick()
    finally:
        rig.close()
    assert told and all(left is None for left in told), told
    assert "Unknown" in rig.events("k1")

"""A front end that takes every send and closes the connection with no response, on the
real stacks: the Google client, the Gmail emulator behind the fault relay's
`drop-response`, SQLite and PostgreSQL stores; and SMTP to Postfix through the SMTP fault
relay, searched in Dovecot. Sends are counted at the relays, copies at the emulator and in
the sender's Sent folder (docs/operations.md "Outages and quotas": sends closed unanswered in a
row pause the scope's sends; its searches go on)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import cast

import pytest
from tests.integration.conftest import GmailProviderFactory, RawFactory
from tests.integration.mailservers import SENDER, MailServers, mail_servers
from tests.integration.test_engine import (  # noqa: F401  (fixtures used by name)
    Rig,
    RigFactory,
    emulator,
    make_rig,
)
from tests.integration.test_smtp_imap_provider import provider_for
from tests.unit.engine_rig import EngineRig, policy

from daemon.doubles.fake_provider import FakeProvider
from daemon.providers.base import SendKind
from ledger.job import JobState
from testkit.gmail_emulator import GmailEmulator
from testkit.relay import FaultPlan, FaultRelay
from testkit.smtp_relay import SmtpFaultRelay

JOBS = 12
PAUSE_AFTER = 3
CONCURRENCY = 4  # the rig's (tests/integration/test_engine.py)
SMTP_JOBS = 8


@pytest.fixture(scope="module")
def servers() -> Iterator[MailServers]:
    with mail_servers() as running:
        yield running


def settled(rig: Rig, keys: list[str]) -> None:
    """Ticks 0.1 s apart (less than any probe's wait) until every job is confirmed."""
    for _ in range(10):
        rig.tick()
        if all(rig.state(key) is JobState.CONFIRMED for key in keys):
            break
        rig.clock.advance(0.1)
    for key in keys:
        assert rig.state(key) is JobState.CONFIRMED, rig.names(key)


def test_sends_closed_unanswered_pause_at_the_relay_and_searches_settle_them(
    make_rig: RigFactory,  # noqa: F811
    relay: FaultRelay,
    emulator: GmailEmulator,  # noqa: F811
) -> None:
    """Before: all twelve due jobs went through the relay into the close (twelve Unknowns,
    twelve searches, twelve reviews had the searches missed). Now the third unanswered
    send pauses the scope: at most the sends already in flight beside it follow. The
    searches of those sent are made while the pause lasts and confirm them (the front end
    had passed them on), a probe into the close doubles the wait, and once the front end
    answers the probe ends the pause and the rest go, each job one copy."""
    rig = make_rig({"receipts": {"pause_after_unanswered": PAUSE_AFTER}})
    relay.set_plan(FaultPlan(send="drop-response"))
    keys = [f"unanswered-{n}" for n in range(JOBS)]
    message_ids = dict(zip(keys, (rig.submit("receipts", key) for key in keys), strict=True))
    rig.tick()
    first = rig.sends()
    assert PAUSE_AFTER <= first <= PAUSE_AFTER + CONCURRENCY - 1, first
    [paused] = rig.engine.open_circuits()
    assert paused.sends_only and paused.failures == 0 and paused.unanswered >= PAUSE_AFTER
    sent = [key for key in keys if rig.state(key) is JobState.UNKNOWN]
    assert len(sent) == first
    assert all(rig.state(key) is JobState.REQUESTED for key in keys if key not in sent)

    rig.clock.advance(300)  # search_after: the searches go; so does one probe, unanswered
    settled(rig, sent)
    for key in sent:
        assert rig.of(key, "Confirmed")[0].via == "search"
    assert rig.sends() == first + 1  # the probe, and nothing else
    assert [c.sends_only for c in rig.engine.open_circuits()] == [True]

    relay.set_plan(FaultPlan())  # the front end answers again
    rig.clock.advance(2)
    rig.tick()  # the probe's time: answered, the pause ends, the rest go
    assert rig.engine.open_circuits() == []
    rig.clock.advance(300)  # the unanswered probe's own search
    settled(rig, keys)
    assert all(emulator.copies(message_ids[key]) == 1 for key in keys)
    assert rig.sends() == JOBS  # each job sent once, the unanswered probe's job too


@pytest.mark.xdist_group("mailservers")
def test_smtp_sends_closed_after_the_final_dot_pause_at_postfix(servers: MailServers) -> None:
    """The same through SMTP: the relay forwards each message to Postfix and closes the
    client's connection instead of the reply after the final dot (`drop-response`). Before,
    all eight jobs reached Postfix into the close; now the third pauses the sends, a probe
    answered ends the pause, and the searches (Dovecot) confirm the ones sent, one copy
    each, counted in the sender's Sent folder."""
    with SmtpFaultRelay("127.0.0.1", servers.smtp_port, hang_seconds=30.0) as relay:
        relay.set_modes(["drop-response"] * SMTP_JOBS)
        mail = provider_for(servers, relay.port, name="fake", timeout=5.0)
        with EngineRig(
            policy("receipts", **{"from": SENDER}, pause_after_unanswered=PAUSE_AFTER),
            provider=lambda clock: cast(FakeProvider, mail),
        ) as rig:
            try:
                ids = [rig.submit("receipts", f"smtp-{n}") for n in range(SMTP_JOBS)]
                rig.tick()
                first = len(relay.applied)
                assert PAUSE_AFTER <= first <= PAUSE_AFTER + 1, first  # the rig's 2 workers
                assert [c.sends_only for c in rig.engine.open_circuits()] == [True]
                relay.set_modes([])  # Postfix's replies pass again
                rig.advance_and_tick(1)  # the probe, answered: the rest go
                assert rig.engine.open_circuits() == []
                assert len(relay.applied) == SMTP_JOBS
                for mid in ids:  # Postfix delivers to the Sent folder on its own time
                    servers.wait_copies(mid, 1)
                rig.clock.advance(60)  # search_after: the first ones are confirmed
                for _ in range(10):
                    rig.advance_and_tick(1)
                for n in range(SMTP_JOBS):
                    assert rig.job(f"smtp-{n}").state is JobState.CONFIRMED, rig.events(f"smtp-{n}")
                assert all(servers.copies(mid) == 1 for mid in ids)
            finally:
                mail.close()


@pytest.mark.parametrize(
    ("plan", "unanswered"),
    [
        (FaultPlan(send="drop-response"), True),
        (FaultPlan(send="fail-before-forward"), True),
        (FaultPlan(send="500-after-forward"), False),  # an answer
    ],
)
def test_a_front_end_resetting_each_send_is_unanswered_too(
    gmail_provider: GmailProviderFactory,
    emulator: GmailEmulator,  # noqa: F811
    make_raw: RawFactory,
    plan: FaultPlan,
    unanswered: bool,
) -> None:
    """A front end that ends each send's connection with a reset (SO_LINGER 0, as many
    proxies and load balancers do) rather than a close: before, only http.client's
    `RemoteDisconnected` was marked, so every send went into the reset and nothing paused
    (an SMTP reset already counted). Still Unknown for the job, one copy at most."""
    with FaultRelay(emulator.url, plan=plan, hang_seconds=1.5, reset=True) as relay:
        outcome = gmail_provider(relay.url).send_raw(make_raw("<reset-1@sendledger.test>"))
        assert outcome.kind is SendKind.UNKNOWN, outcome
        assert outcome.unanswered is unanswered, outcome
        assert sum(1 for entry in relay.log if entry["kind"] == "send") == 1

"""Policies reloaded while jobs are on their way (docs/policies.md "Broken policy files and
reloads"): what a job's attempt did is judged where it was done."""

from __future__ import annotations

from tests.unit.engine_rig import EngineRig, policy

from daemon.doubles.fake_drafts import FakeDraftsProvider
from daemon.doubles.fake_provider import Scripted
from daemon.engine.circuit import CircuitSettings
from ledger.content import parse_job
from ledger.vocabulary import JobState, Resolution
from policies.loader import PolicySet


def test_an_unknown_outcome_is_searched_where_it_was_sent_after_the_channel_moves() -> None:
    """A tired operator moves a channel to another provider (SIGHUP) while one of its
    jobs is Unknown on the first: the searches must look in the mailbox the attempt was
    made in, not the new one, or its misses are believed and the job is sent twice."""
    rig = EngineRig(policy("receipts", on_unknown="retry"))
    other = rig.add_provider("other")
    try:
        message_id = rig.submit("receipts", "k1")
        rig.provider.script(Scripted.dropped_response())  # sent, answer lost
        assert rig.tick().unknown == 1
        rig.policies = PolicySet(
            {"receipts": policy("receipts", on_unknown="retry", provider="other")}
        )
        assert rig.holder.reload()
        for _ in range(6):
            rig.advance_and_tick(60)
        job = rig.job("k1")
        copies = rig.provider.copies_of(message_id) + other.copies_of(message_id)
        assert copies == 1, (copies, rig.events("k1"))
        assert job.state is JobState.CONFIRMED
    finally:
        rig.close()


def test_a_sender_withdrawn_by_a_reload_is_not_sent_as_by_jobs_accepted_before() -> None:
    """An operator narrows `allowed_from` (a mailbox compromised, a brand retired) and
    reloads: jobs accepted while it was allowed still wait in the queue. None of them may
    send as it; each goes to review saying why, and sends once it is allowed again and
    a person resends it."""
    rig = EngineRig(policy("receipts", allowed_from=["*@example.com"]))
    try:
        base = {"channel": "receipts", "to": "c@example.net", "subject": "s", "body": "b"}
        withdrawn = parse_job({**base, "key": "k1", "from": "Sales <sales@example.com>"})
        rig.ledger.submit(withdrawn, rig.policies["receipts"].sender_for(withdrawn.sender))
        rig.submit("receipts", "k2")  # the policy's own from: still allowed
        rig.policies = PolicySet({"receipts": policy("receipts", allowed_from=["b@example.com"])})
        assert rig.holder.reload()
        assert rig.tick().sent == 1
        job = rig.job("k1")
        assert (job.state, job.reason) == (JobState.REVIEW, "sender-not-allowed")
        assert "Attempted" not in rig.events("k1")
        assert rig.provider.sends == 1 and rig.copies("k1") == 0
        rig.policies = PolicySet({"receipts": policy("receipts", allowed_from=["*@example.com"])})
        assert rig.holder.reload()
        rig.ledger.update(
            "k1", lambda j: j.resolve(Resolution.RESEND, note="allowed", by="op", at=rig.clock())
        )
        assert rig.tick().sent == 1
        assert rig.job("k1").state is JobState.CONFIRMED
    finally:
        rig.close()


def test_a_draft_sent_before_the_provider_left_drafts_mode_is_never_searched_and_resent() -> None:
    """The daemon dies while its drafts.send is out; the operator switches the provider
    to `send_via = "messages"` and starts it again. The job's attempt was made through its
    recorded draft, which the provider can now neither ask nor delete (the fence): a
    search at once, before the index shows the copy, must not be believed and the job
    sent a second time."""
    rig = EngineRig(
        policy("receipts", on_unknown="retry", provider="fake"),
        provider=lambda clock: FakeDraftsProvider("fake", clock=clock, index_lag=55),
    )
    try:
        message_id = rig.submit("receipts", "k1")
        rig.provider.script(Scripted.crash_during_call(stored=True))
        rig.tick(errors=1)
        assert rig.job("k1").draft_id is not None
        provider = rig.provider
        assert isinstance(provider, FakeDraftsProvider)
        provider.send_via = "messages"  # the restart's settings: no drafts any more
        provider.leaves_drafts = False
        rig.restart()
        rig.engine.recover_own_claims()
        rig.tick()
        for _ in range(6):
            rig.advance_and_tick(30)
        job = rig.job("k1")
        assert provider.copies_of(message_id) == 1, rig.events("k1")
        assert (job.state, job.reason) == (JobState.REVIEW, "unknown-outcome")
        assert "Searched" not in " ".join(rig.events("k1"))
    finally:
        rig.close()


def test_a_job_queued_behind_an_open_circuit_is_sent_under_the_policy_reloaded_meanwhile() -> None:
    """A job loaded into a send worker's queue waits there, in memory, while its
    provider's circuit is open (an outage: minutes, hours). The operator narrows
    `allowed_from` and reloads during the outage: when the circuit lets the job through,
    it must be judged by the policy in force then, not the one it was loaded under, or it
    goes out as the withdrawn sender."""
    rig = EngineRig(policy("receipts", allowed_from=["*@example.com"]))
    rig.engine.circuits.settings = CircuitSettings(failures=1, probe_after=60, probe_max=60)
    try:
        rig.provider.script(Scripted.unavailable())  # the outage: the circuit opens
        rig.submit("receipts", "first")
        rig.tick()
        assert [c.failures for c in rig.engine.open_circuits()] == [1]
        base = {"channel": "receipts", "to": "c@example.net", "subject": "s", "body": "b"}
        withdrawn = parse_job({**base, "key": "k1", "from": "Sales <sales@example.com>"})
        rig.ledger.submit(withdrawn, rig.policies["receipts"].sender_for(withdrawn.sender))
        rig.tick()  # k1 loaded and queued behind the open circuit
        assert "Attempted" not in rig.events("k1")
        rig.policies = PolicySet({"receipts": policy("receipts", allowed_from=["b@example.com"])})
        assert rig.holder.reload()
        for _ in range(6):
            rig.advance_and_tick(30)
        job = rig.job("k1")
        assert (job.state, job.reason) == (JobState.REVIEW, "sender-not-allowed"), rig.events("k1")
        assert "Attempted" not in rig.events("k1")
        assert rig.copies("k1") == 0
        assert rig.job("first").state is JobState.CONFIRMED
    finally:
        rig.close()

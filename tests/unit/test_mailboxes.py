"""A job's own `from` (allowed by the policy's `allowed_from`), its `thread_id`, and the
per-mailbox quota gate of the Gmail provider with `user = "{from}"` (docs/providers.md, "Providers",
docs/cli.md "Message fields")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.unit.engine_rig import EngineRig, policy

from daemon.doubles.fake_provider import FakeProvider
from daemon.doubles.fake_time import FakeTime
from daemon.engine import Engine
from daemon.providers.base import Provider, ProviderBase, SearchResult, SendOutcome
from daemon.providers.gmail import GmailProvider
from daemon.providers.gmail_drafts import DRAFT_STEP_UNITS
from daemon.providers.quota import GMAIL_LIST_UNITS, GMAIL_SEND_UNITS
from daemon.service_layer.intake import IntakeError, parse_jobs, senders_for
from ledger.content import JobInputError, parse_job
from policies.loader import PolicySet
from policies.senders import SenderRefused, allowed, pattern_problem
from testkit.credentials import write_service_account

BASE = {"channel": "receipts", "key": "k1", "to": "c@example.net", "subject": "s", "body": "b"}
LOCAL = st.from_regex(r"[a-z0-9+][a-z0-9+-]{0,7}(\.[a-z0-9+-]{1,8}){0,2}", fullmatch=True)
DOMAIN = st.from_regex(r"[a-z]{1,8}\.(com|org|net)", fullmatch=True)


def policies(**fields: object) -> PolicySet:
    return PolicySet({"receipts": policy("receipts", **fields)})


def test_a_job_without_the_new_fields_keeps_its_hash() -> None:
    plain = parse_job(BASE)
    assert "sender" not in plain.canonical() and "thread_id" not in plain.canonical()
    with_from = parse_job({**BASE, "from": "Bob <bob@example.com>"})
    with_thread = parse_job({**BASE, "thread_id": "18c2f0a1b2"})
    assert len({plain.content_hash, with_from.content_hash, with_thread.content_hash}) == 3


@pytest.mark.parametrize(
    ("field", "value"),
    [("from", "not an address"), ("from", 3), ("thread_id", ""), ("thread_id", "a b")],
)
def test_bad_values_name_the_field(field: str, value: object) -> None:
    with pytest.raises(JobInputError) as caught:
        parse_job({**BASE, field: value})
    assert caught.value.field == field


@given(local=LOCAL, domain=DOMAIN, other=DOMAIN)
def test_allowed_from_matches_the_domain_case_insensitively(
    local: str, domain: str, other: str
) -> None:
    patterns = [f"*@{domain}"]
    assert allowed(f"{local}@{domain.upper()}", patterns)
    assert allowed(f"Name <{local.upper()}@{domain}>", patterns)
    assert allowed(f"{local}@{other}", patterns) == (other == domain)


@given(local=LOCAL, domain=DOMAIN)
def test_from_outside_allowed_from_is_refused_naming_from(local: str, domain: str) -> None:
    jobs = parse_jobs({**BASE, "from": f"{local}@{domain}"})
    allowed_set = policies(allowed_from=["*@example.com"])
    if domain == "example.com":
        (sender,) = senders_for(allowed_set, jobs, batch=False)
        assert sender.from_addr == f"{local}@{domain}"
        return
    for policy_set in (allowed_set, policies()):
        with pytest.raises(IntakeError) as caught:
            senders_for(policy_set, jobs, batch=False)
        assert caught.value.problems[0].field == "from"


def test_thread_id_only_for_gmail_providers() -> None:
    jobs = parse_jobs({**BASE, "thread_id": "18c2f0a1b2"})
    with pytest.raises(IntakeError) as caught:
        senders_for(policies(), jobs, batch=False, thread_providers=())
    assert caught.value.problems[0].field == "thread_id"
    provider = policy("receipts").provider
    assert senders_for(policies(), jobs, batch=False, thread_providers={provider})


@given(st.text(max_size=30))
def test_pattern_check_never_raises(pattern: str) -> None:
    problem = pattern_problem(pattern)
    assert problem is None or isinstance(problem, str)
    if problem is None:
        assert "@" in pattern


def test_bad_pattern_names_allowed_from() -> None:
    with pytest.raises(ValueError, match="allowed_from"):
        policy("receipts", allowed_from=["sales@[ab].com"])
    with pytest.raises(SenderRefused):
        policy("receipts").sender_for("x@example.com")


def delegated(tmp_path: Path, clock: FakeTime, **fields: Any) -> GmailProvider:
    """A Gmail provider with user = "{from}" on time `clock`; nothing listens on its ports."""
    sa = write_service_account(tmp_path / "sa.json", token_uri="http://127.0.0.1:9/token")
    return GmailProvider(
        "gmail",
        credentials_file=sa,
        user="{from}",
        api_endpoint="http://127.0.0.1:9",
        clock=clock,
        sleep=clock.sleep,
        **fields,
    )


def test_one_bucket_per_mailbox_and_a_reservation_never_waits(tmp_path: Path) -> None:
    clock = FakeTime(0.0)  # exact sums: the refill lands on the reservation's wait
    provider = delegated(tmp_path, clock, quota_units_per_second=250.0)
    alice, again = (
        provider.mailbox("Alice <alice@example.com>"),
        provider.mailbox("ALICE@example.com"),
    )
    bob = provider.mailbox("bob@example.com")
    assert alice is again and alice is not bob
    assert alice.credentials is not bob.credentials
    # A mailbox's bucket holds one send, not a second's worth (docs/performance.md
    # "Performance and scaling": "It now holds one send (and its draft step)").
    assert alice.bucket.capacity == GMAIL_SEND_UNITS < 250.0
    alice.bucket.acquire(alice.bucket.capacity)  # alice is out of quota, bob is not
    wait = alice.reserve_send()
    assert 0.0 < wait <= 100.0 / 250.0 + 1e-9 and bob.reserve_send() == 0.0
    assert alice.bucket.available < 100.0  # nothing taken by the refused reservation
    clock.now += wait
    assert alice.reserve_send() == 0.0  # refilled: taken, and the send will not wait
    before = clock.now
    alice.pay_send()
    assert clock.now == before  # paid by the reservation
    alice.pay_send()
    assert clock.now > before  # no reservation left: it waited for the quota
    provider.close()


def test_in_drafts_mode_the_reservation_pays_the_draft_step_too(tmp_path: Path) -> None:
    """send_via = "drafts": the calls before the claim (drafts.list, drafts.create) are
    paid by the send's reservation, so a job is taken for its draft step only when the
    mailbox has the quota for all of it (docs/operations.md "Outages and quotas")."""
    clock = FakeTime(0.0)
    # A quota below one send and its draft step: the bucket still holds both.
    provider = delegated(tmp_path, clock, quota_units_per_second=100.0, send_via="drafts")
    alice = provider.mailbox("alice@example.com")
    assert alice.bucket.capacity == GMAIL_SEND_UNITS + DRAFT_STEP_UNITS
    alice.bucket.acquire(alice.bucket.available - 100.0)  # one bare send's worth left
    assert alice.reserve_send() > 0.0  # not enough for the draft step as well
    clock.now += DRAFT_STEP_UNITS / 100.0
    assert alice.reserve_send() == 0.0
    before = clock.now
    alice.pay_draft(GMAIL_LIST_UNITS)
    alice.pay_draft(DRAFT_STEP_UNITS - GMAIL_LIST_UNITS)
    alice.pay_send()
    assert clock.now == before  # the whole step paid by the reservation
    alice.pay_draft(GMAIL_LIST_UNITS)
    assert clock.now > before  # nothing reserved for this one: it waited
    provider.close()


class PerMailboxFake(ProviderBase):
    """The fake provider acting per mailbox, as Gmail with user = "{from}" does: each
    job's calls go through `for_job`; one mailbox is out of quota."""

    def __init__(self, inner: FakeProvider, blocked: str) -> None:
        self.inner = inner
        self.name = inner.name
        self.response_ids_readable = inner.response_ids_readable
        self.blocked = blocked
        self.sent_as: list[tuple[str, str | None]] = []

    def for_job(self, from_addr: str, thread_id: str | None) -> Provider:
        return MailboxView(self, from_addr, thread_id)

    def send_raw(self, raw: bytes) -> SendOutcome:
        raise AssertionError("every job's send goes through its mailbox")

    def search(self, message_id: str) -> SearchResult:
        raise AssertionError("every job's search goes through its mailbox")

    def read_message_id(self, provider_message_id: str) -> str | None:
        return self.inner.read_message_id(provider_message_id)

    def close(self) -> None:
        self.inner.close()


class MailboxView(ProviderBase):
    def __init__(self, owner: PerMailboxFake, from_addr: str, thread_id: str | None) -> None:
        self.owner, self.from_addr, self.thread_id = owner, from_addr, thread_id
        self.name = owner.name
        self.response_ids_readable = owner.response_ids_readable

    def scope(self) -> str:
        return f"{self.name}/{self.from_addr}"

    def reserve_send(self) -> float:
        return 1.0 if self.owner.blocked in self.from_addr else 0.0

    def send_raw(self, raw: bytes) -> SendOutcome:
        self.owner.sent_as.append((self.from_addr, self.thread_id))
        return self.owner.inner.send_raw(raw)

    def search(self, message_id: str) -> SearchResult:
        return self.owner.inner.search(message_id)

    def read_message_id(self, provider_message_id: str) -> str | None:
        return self.owner.inner.read_message_id(provider_message_id)

    def close(self) -> None:
        pass


def per_mailbox_engine(
    *, blocked: str, concurrency: int
) -> tuple[EngineRig, PerMailboxFake, Engine]:
    """An engine whose provider acts per mailbox; `blocked`'s mailbox is out of quota."""
    rig = EngineRig(policy("receipts", allowed_from=["*@example.com"]))
    routed = PerMailboxFake(rig.provider, blocked=blocked)
    engine = Engine(
        rig.ledger,
        rig.holder,
        {"fake": routed},
        provider_timeouts={"fake": 10.0},
        clock=rig.clock,
        elapsed=rig.clock.elapsed,
        concurrency=concurrency,
    )
    return rig, routed, engine


def test_engine_sends_as_each_jobs_mailbox_and_skips_a_gated_one() -> None:
    rig, routed, engine = per_mailbox_engine(blocked="slow@example.com", concurrency=2)
    try:
        for key, sender, thread in [
            ("a", "Shop <fast@example.com>", "t1"),
            ("b", "slow@example.com", None),
            ("c", None, None),
        ]:
            document = {**BASE, "key": key, "thread_id": thread}
            if sender is not None:
                document["from"] = sender
            content = parse_job(document)
            rig.ledger.submit(content, rig.policies["receipts"].sender_for(content.sender))
        report = engine.tick()
        assert report.sent == 2, report
        assert sorted(routed.sent_as, key=str) == sorted(
            [("Shop <fast@example.com>", "t1"), ("Support <support@example.com>", None)],
            key=str,
        )
        assert rig.job("b").state.value == "requested"  # left due, never claimed
        assert "Attempted" not in rig.events("b")
        routed.blocked = "nobody"
        assert engine.tick().sent == 1
        assert routed.sent_as[-1] == ("slow@example.com", None)
    finally:
        engine.close()
        rig.close()


def test_mailboxes_are_served_in_turn_and_a_quota_wait_holds_no_worker() -> None:
    """One worker; a big backlog of one mailbox submitted first, then a few jobs of two
    others, one of which is out of quota: the others' jobs go out interleaved with the big
    one's (no starvation), and the throttled one's wait for its quota holds no worker."""
    rig, routed, engine = per_mailbox_engine(blocked="throttled@example.com", concurrency=1)
    try:
        senders = ["big@example.com"] * 20 + ["small@example.com"] * 3
        senders += ["throttled@example.com"] * 2
        for n, sender in enumerate(senders):
            content = parse_job({**BASE, "key": f"k{n}", "from": sender})
            rig.ledger.submit(content, rig.policies["receipts"].sender_for(content.sender))
        report = engine.tick()
        assert report.sent == 23, report
        order = [sender for sender, _thread in routed.sent_as]
        assert [n for n, sender in enumerate(order) if sender == "small@example.com"] == [1, 3, 5]
        assert "throttled@example.com" not in order  # parked, never claimed
        assert all(rig.job(f"k{n}").state.value == "requested" for n in (23, 24))
        routed.blocked = "nobody"
        assert engine.tick().sent == 2
    finally:
        engine.close()
        rig.close()

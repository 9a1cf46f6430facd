"""What a confirmed send does beside its call and its commits (its job's load, its claim,
its outcome), counted (issue 30 (a), docs/performance.md "Performance and scaling"):
each count is CPU on every job, and a count does not depend on the machine's load as a
timing does.

Engine runs use the fake provider on a memory store with injected time (engine_rig.py).
"""

from __future__ import annotations

import dataclasses
import sys
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from types import FrameType

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tests.unit.engine_rig import EngineRig, policy

import daemon.engine.dispatch as dispatching
from daemon.providers.base import calls_end_in
from ledger.content import JobContent, parse_job
from ledger.job import JOB_NAMESPACE, job_id_for
from ledger.vocabulary import PolicyRef
from policies.model import ChannelPolicy


@pytest.fixture
def rig() -> Iterator[EngineRig]:
    with EngineRig(policy("receipts")) as made:
        # One read back (the first send always is), then none: the sends of a running
        # daemon past its first ones.
        made.provider.readback_first = 1
        made.provider.readback_rate = 0.0
        _send(made, 1)
        assert made.engine.health.readbacks == 1
        yield made


def _send(rig: EngineRig, count: int, counting: Callable[[], None] = lambda: None) -> None:
    """`count` jobs submitted, then `counting()` (what the test counts begins) and a tick
    that sends them."""
    sent = rig.provider.sends
    for i in range(sent, sent + count):
        rig.submit("receipts", f"job-{i:03d}")
    counting()
    rig.tick()
    assert rig.provider.sends == sent + count


def test_a_confirmed_send_not_read_back_bounds_its_one_call(
    rig: EngineRig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lease's bound on the calls made under a claim (`calls_end_in`) is entered for
    the send, and for the read-back only when one is made: before, every confirmed send
    entered it a second time around the sampler's no."""
    entered: list[object] = []

    def counted(left: Callable[[], float] | None) -> AbstractContextManager[None]:
        entered.append(left)
        return calls_end_in(left)

    monkeypatch.setattr(dispatching, "calls_end_in", counted)
    _send(rig, 5)
    assert rig.engine.health.readbacks == 1
    assert len(entered) == 5


def test_a_confirmed_send_makes_its_policys_ref_once_for_its_confirmation(
    rig: EngineRig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The policy's `ref` (its fingerprint looked up by the model's hash, then a
    PolicyRef) is made for the decisions a job's events record: one, its Confirmed.
    Before, the claim's question whether the policy still lets the job send built a
    `Send` with its own `ref` too, dropped at once: two a job."""
    made: list[PolicyRef] = []
    ref = ChannelPolicy.ref

    def counted(policy: ChannelPolicy) -> PolicyRef:
        made.append(ref.__get__(policy))
        return made[-1]

    _send(rig, 5, lambda: monkeypatch.setattr(ChannelPolicy, "ref", property(counted)))
    assert len(made) == 5


def _inits_of(kind: type, action: Callable[[], object]) -> int:
    """How many objects of `kind` `action` makes through their `__init__`, in this
    thread (`sys.setprofile`)."""
    inits = 0

    def note(frame: FrameType, event: str, _arg: object) -> None:
        nonlocal inits
        if event == "call" and frame.f_code.co_name == "__init__":
            inits += type(frame.f_locals.get("self")) is kind

    sys.setprofile(note)
    try:
        action()
    finally:
        sys.setprofile(None)
    return inits


FULL = parse_job(
    {
        "channel": "receipts",
        "key": "full-1",
        "to": ["a@example.net", "b@example.net"],
        "cc": "c@example.net",
        "bcc": "d@example.net",
        "reply_to": "r@example.net",
        "subject": "Receipt",
        "body": "Thanks.\n",
        "html": "<p>Thanks.</p>",
        "headers": {"X-Campaign": "c1", "X-Batch": "b7"},
        "in_reply_to": "<p@example.net>",
        "references": ["<o@example.net>", "<p@example.net>"],
        "send_at": "2026-12-06T08:00:00Z",
        "attachments": [
            {"filename": "a.txt", "content_type": "text/plain", "content_base64": "aGk="}
        ],
        "from": "Sales <sales@example.com>",
        "thread_id": "t1",
    }
)


@pytest.mark.parametrize(
    "content",
    [
        FULL,
        parse_job({"channel": "c", "key": "k", "to": "a@example.net", "subject": "s", "body": "b"}),
    ],
    ids=["every-field", "fewest"],
)
def test_a_loaded_jobs_content_is_the_stored_one_made_without_its_init(
    content: JobContent,
) -> None:
    """Every load of a job rebuilds its content from the Requested event: set as the
    mapper sets a stored event's, not by the frozen dataclass's `__init__`, whose
    `object.__setattr__` per field was half the call's CPU. What it holds is what the
    intake stored, every field (one added to `JobContent` must be to `from_canonical`)."""
    stored = content.stored()
    rebuilt = JobContent.from_canonical(stored)
    assert rebuilt == content
    assert rebuilt.stored() == stored
    assert hash(rebuilt) == hash(content)
    assert set(vars(rebuilt)) == {field.name for field in dataclasses.fields(JobContent)}
    assert _inits_of(JobContent, lambda: JobContent.from_canonical(stored)) == 0


@given(st.text(max_size=300))
def test_a_jobs_id_is_its_keys_uuid5_as_every_release_stored_it(key: str) -> None:
    """The id every release stored a job under: `uuid5(JOB_NAMESPACE, key)`, whatever the
    key (a load or a new job that worked out another would miss the stored job)."""
    assert job_id_for(key) == uuid.uuid5(JOB_NAMESPACE, key)
    assert job_id_for(key).version == 5


def test_a_jobs_id_is_worked_out_without_uuid5(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every load and every new job asks its id: `uuid5` imports `sha1` at each call and
    makes its UUID from bytes and a version, nearly twice the CPU of one made from its
    integer (1 call a job before, none now)."""
    expected = uuid.uuid5(JOB_NAMESPACE, "receipt-1")
    calls: list[str] = []

    def counted(namespace: uuid.UUID, name: str) -> uuid.UUID:
        calls.append(name)
        return expected

    monkeypatch.setattr(uuid, "uuid5", counted)
    assert job_id_for("receipt-1") == expected
    assert calls == []

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
from ledger.attachments import Attachment
from ledger.content import LATER_FIELDS, JobContent, parse_job
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


_TEXT = st.text(max_size=20)
_OPTIONAL = st.none() | _TEXT
_TEXTS = st.lists(_TEXT, max_size=3).map(tuple)
_HEADERS = st.dictionaries(_TEXT, _TEXT, max_size=3).map(lambda h: tuple(sorted(h.items())))
_ATTACHMENTS = st.lists(st.builds(Attachment, _TEXT, _TEXT, _TEXT), max_size=2).map(tuple)
_CONTENTS = st.builds(
    JobContent,
    channel=_TEXT,
    key=_TEXT,
    to=_TEXTS,
    subject=_TEXT,
    body=_TEXT,
    html=_OPTIONAL,
    cc=_TEXTS,
    reply_to=_OPTIONAL,
    bcc=_TEXTS,
    headers=_HEADERS,
    in_reply_to=_OPTIONAL,
    references=_TEXTS,
    send_at=_OPTIONAL,
    attachments=_ATTACHMENTS,
    sender=_OPTIONAL,
    thread_id=_OPTIONAL,
)
#: The later fields each event format lacked (docs/changes.md: v3 added the message
#: fields, v4 `sender` and `thread_id`), left out of a stored event an older release wrote.
_LACKED = {
    "v1-v2": tuple(LATER_FIELDS),
    "v3": ("sender", "thread_id"),
    "v4-v5": (),
}


@given(_CONTENTS, st.sampled_from(sorted(_LACKED)), st.booleans())
def test_a_content_stored_in_any_releases_shape_loads_as_its_init_made_it(
    content: JobContent, release: str, nulls: bool
) -> None:
    """What `__init__` made, stored, loads back the same without it: every attribute set,
    in the order `__init__` sets them, of the same types (tuples, sorted headers,
    `Attachment`s), equal and hashed alike; from a stored event of a release that lacked
    the later fields (an unset one left out, or null), as from this release's."""
    stored = content.stored()
    for name, empty in LATER_FIELDS.items():
        if stored[name] != empty:
            continue  # set: a release that lacked the field could not have stored the job
        if name in _LACKED[release]:
            del stored[name]
        elif nulls:
            stored[name] = None
    rebuilt = JobContent.from_canonical(stored)
    assert list(vars(rebuilt).items()) == list(vars(content).items())
    assert [type(v) for v in vars(rebuilt).values()] == [type(v) for v in vars(content).values()]
    assert rebuilt == content
    assert hash(rebuilt) == hash(content)
    assert rebuilt.content_hash == content.content_hash


#: Any str: hypothesis's text leaves lone surrogates out, so they are mixed in here.
_ANY_STR = st.lists(st.characters() | st.integers(0xD800, 0xDFFF).map(chr), max_size=40).map(
    "".join
)


@given(_ANY_STR)
def test_a_jobs_id_is_uuid5s_for_any_str_key_surrogates_included(key: str) -> None:
    """uuid5 encodes a str key as UTF-8, strictly: a lone surrogate (a command line that is
    not UTF-8 gives them) is refused as uuid5 refuses it, UnicodeEncodeError, and every
    other key has uuid5's id."""
    try:
        expected = uuid.uuid5(JOB_NAMESPACE, key)
    except UnicodeEncodeError:
        with pytest.raises(UnicodeEncodeError):
            job_id_for(key)
        return
    assert job_id_for(key) == expected


@pytest.mark.parametrize(
    "key", ["", "\ud800", "a\udcff", "\U0010ffff", "é" * 100_000, "key-" * 25_000], ids=len
)
def test_a_jobs_id_is_uuid5s_for_an_empty_a_surrogate_or_a_very_long_key(key: str) -> None:
    try:
        expected: uuid.UUID | type[UnicodeEncodeError] = uuid.uuid5(JOB_NAMESPACE, key)
    except UnicodeEncodeError:
        expected = UnicodeEncodeError
    try:
        got: uuid.UUID | type[UnicodeEncodeError] = job_id_for(key)
    except UnicodeEncodeError:
        got = UnicodeEncodeError
    assert got == expected

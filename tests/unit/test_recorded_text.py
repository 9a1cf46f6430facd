"""Another's words are bounded where they are recorded and served (docs/how-it-works.md
"Another's words"): a provider answering with a 10 MB error body leaves events, a
history, a webhook payload and an API error body of bounded length, measured as each
reader gets them (JSON's escapes can make a character 12 long)."""

from __future__ import annotations

import json
import time
import unicodedata
from collections.abc import Iterator, Mapping
from json.encoder import encode_basestring_ascii
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import given
from hypothesis import strategies as st
from tests.unit.engine_rig import EngineRig, policy
from tests.unit.test_api_routes import AUTH, api_context, job

from daemon.api.app import create_app
from daemon.doubles.fake_provider import Scripted
from daemon.providers.outcomes import SearchResult, SendKind, SendOutcome
from daemon.service_layer.problems import ServiceError
from daemon.service_layer.services import ChannelPolicies, Services
from daemon.webhooks.delivery import Outcome
from daemon.webhooks.worker import Deliverer, Hook
from ledger.characters import MAX_RECORDED, recorded, storable
from ledger.exceptions import Refusal
from ledger.job import SendJob, job_id_for

#: A provider's answer of 10 million characters, each as long as JSON can write one: a
#: control character (6), a quote and a backslash (2), an accented letter written as a
#: letter and a combining accent, a thumbs-up with its skin tone (12 each), a NUL.
HOSTILE = '550 n\u00f6 \x01"\\ e\u0301 \U0001f44d\U0001f3fd \x00 ' * 500_000
#: The most a served record holds besides the words it quotes (key, moments, ids, ...).
FIELDS = 2_000


def _json_length(text: str) -> int:
    """As long as the longest JSON writes it: every character outside ASCII escaped."""
    return len(encode_basestring_ascii(text)) - 2


def _cut_properly(original: str, out: str, limit: int) -> None:
    assert _json_length(out) <= limit
    out.encode("utf-8")  # no lone surrogate: every store and door can write it
    whole = storable(original)
    if out == whole:
        return
    kept, mark, cut = out.rpartition("... [")
    assert mark and cut == f"{len(original) - len(kept)} more characters]"
    assert whole.startswith(kept)
    # The start ends before a combining sequence, never inside one, unless it is all one.
    if _joins(whole, len(kept)):
        assert all(_joins(whole, at) for at in range(1, len(kept)))


def _joins(text: str, at: int) -> bool:
    """Whether text[at] belongs to the sequence of the character before it."""
    char = text[at]
    return at > 0 and (
        unicodedata.category(char).startswith("M")
        or "\u200d" in (char, text[at - 1])
        or 0x1F3FB <= ord(char) <= 0x1F3FF
    )


_TRICKY = st.sampled_from(
    ["e", "\u0301", "\u20dd", "\u200d", "\ufe0f", "\U0001f44d", "\U0001f3fd", "\x00", "\x01",
     "\ud800", "\udc00", '"', "\\", "\n", "\u00e9", "\u4e2d", "\u2028", "\x7f", " "]
)  # fmt: skip
_TEXT = st.text(st.one_of(_TRICKY, st.characters(exclude_categories=())), max_size=300)


@given(_TEXT, st.integers(40, 600))
def test_a_cut_fits_its_limit_as_json_and_never_splits_a_sequence(text: str, limit: int) -> None:
    _cut_properly(text, recorded(text, limit), limit)


@given(st.text(_TRICKY, min_size=1, max_size=40), st.integers(1, 400))
def test_a_repeated_sequence_is_cut_before_one(unit: str, times: int) -> None:
    text = unit * times
    _cut_properly(text, recorded(text, 60), 60)


def test_a_short_answer_is_recorded_as_it_came_and_a_long_one_says_how_much_is_cut() -> None:
    assert recorded("550 mailbox full") == "550 mailbox full"
    assert recorded("bad \x00 byte \ud800") == "bad \ufffd byte \ufffd"  # as storable
    assert recorded("x" * MAX_RECORDED) == "x" * MAX_RECORDED
    cut = recorded("x" * (MAX_RECORDED + 1))
    # The mark's room is kept for the longest count it could need (2001: 4 digits).
    assert cut == "x" * 1974 + "... [27 more characters]" and len(cut) <= MAX_RECORDED
    # A character JSON writes 12 long counts 12: 164 fit, with the mark.
    assert recorded("\U0001f44d" * 200).startswith("\U0001f44d" * 164 + "... [36 more")


def test_a_10_mb_answer_is_cut_in_milliseconds() -> None:
    started = time.perf_counter()
    out = recorded(HOSTILE)
    assert time.perf_counter() - started < 0.05
    _cut_properly(HOSTILE, out, MAX_RECORDED)


@pytest.fixture
def rig() -> Iterator[EngineRig]:
    rig = EngineRig(policy("receipts", on_unknown="review"))
    yield rig
    rig.close()


def _quoting(records: list[dict[str, Any]]) -> list[str]:
    """The provider's words in the records' reasons and details (not the review's code)."""
    fields = [r.get(name) for r in records for name in ("reason", "detail")]
    return [words for words in fields if isinstance(words, str) and words.startswith("550 n")]


#: The two outcomes that record the provider's words, then escalate with them; and plain
#: ASCII, the most characters a record keeps.
_FATES = {
    "rejected": Scripted.rejected(transient=False, reason=HOSTILE),
    "unknown": Scripted(SendOutcome(SendKind.UNKNOWN, HOSTILE), stored=False),
    "plain": Scripted.rejected(transient=False, reason="550 n" + "o" * 10_000_000),
}


@pytest.mark.parametrize("fate", list(_FATES.values()), ids=list(_FATES))
def test_a_10_mb_provider_answer_is_stored_and_served_bounded(
    rig: EngineRig, fate: Scripted
) -> None:
    """Rejected (or Unknown) and Escalated stored the whole answer each, served whole by
    the history (`history --json`, `GET /v1/jobs/{key}/events`) and the review page."""
    with TestClient(create_app(api_context(rig))) as client:
        assert client.post("/v1/jobs", json=job("k1", "receipts"), headers=AUTH).status_code == 201
        rig.provider.script(fate)
        rig.tick()
        assert rig.job("k1").state.value == "review"
        stored = rig.ledger.recorder.select_events(job_id_for("k1"))
        quoting = [e for e in stored if b"550 n" in e.state]
        assert len(quoting) == 2  # the outcome, then the escalation
        for event in quoting:  # docs/how-it-works.md: "under 2.5 KB"
            assert len(event.state) < 2_500, len(event.state)
        history = client.get("/v1/jobs/k1/events", headers=AUTH)
        assert len(history.content) <= len(stored) * FIELDS + 2 * MAX_RECORDED
        served = _quoting(history.json())
        assert len(served) == 2
        for words in served:
            _cut_properly(fate.outcome.reason, words, MAX_RECORDED)
        # The review page writes both: 8.7 KB with a short answer, and an escape of HTML's
        # is at most 5 times JSON's (`&amp;` for `&`).
        page = client.get("/ui/jobs/k1", headers=AUTH)
        assert page.status_code == 200 and "more characters]" in page.text
        assert len(page.content) < 8_700 + 2 * 5 * MAX_RECORDED, len(page.content)


def test_a_webhooks_detail_carries_the_bounded_answer(rig: EngineRig) -> None:
    rig.submit("receipts", "k1")
    rig.provider.script(Scripted.rejected(transient=False, reason=HOSTILE))
    rig.tick()
    bodies: list[bytes] = []

    def receives(url: str, body: bytes, headers: Mapping[str, str], timeout: float) -> Outcome:
        bodies.append(body)
        return Outcome(True, 200)

    hook = Hook("crm", "https://hooks.example.com/x", "whsec_" + "A" * 32, frozenset({"rejected"}))
    Deliverer(rig.ledger, hook, owner="a", poster=receives, clock=time.time).pass_once()
    [body] = bodies
    assert len(body) <= MAX_RECORDED + FIELDS, len(body)
    _cut_properly(HOSTILE, json.loads(body)["detail"], MAX_RECORDED)


def test_a_search_failing_with_a_10_mb_error_answers_a_bounded_refusal(rig: EngineRig) -> None:
    """`provider NAME cannot be used: ERROR` quoted the provider's whole error: the API's
    503 body (and the command line's, the review page's) was 10 MB."""

    def fails(message_id: str) -> SearchResult:
        raise RuntimeError(HOSTILE)

    with TestClient(create_app(api_context(rig))) as client:
        assert client.post("/v1/jobs", json=job("k1", "receipts"), headers=AUTH).status_code == 201
        rig.provider.script(Scripted.lost_request())
        rig.tick()
        rig.provider.search = fails  # type: ignore[method-assign]
        answer = client.post("/v1/review/k1/check", headers=AUTH)
    assert answer.status_code == 503
    assert len(answer.content) <= MAX_RECORDED + len('{"error":""}'), len(answer.content)
    error = answer.json()["error"]
    assert error.startswith("provider 'fake' cannot be used: 550 n")
    assert _json_length(error) <= MAX_RECORDED and error.endswith(" more characters]")


def test_a_service_error_is_bounded_wherever_it_is_raised() -> None:
    error = ServiceError(Refusal.UNAVAILABLE, "x" * 10_000_000)
    assert str(error) == error.message and _json_length(error.message) <= MAX_RECORDED


def test_an_event_stored_before_with_a_long_reason_still_loads_and_shows_whole(
    rig: EngineRig,
) -> None:
    """Reading is unchanged: no upcaster cuts what an earlier release stored."""
    long = "550 n" + "o" * 100_000
    rig.submit("receipts", "k1")

    def as_before(job: SendJob) -> None:  # the Rejected an earlier release recorded
        job.trigger_event(
            job.Rejected, timestamp=rig.clock(), attempt=1, transient=False, reason=long,
            status=550, retry_at=None, policy="receipts", fingerprint="f" * 16,
        )  # fmt: skip

    rig.ledger.update("k1", as_before)
    services = Services(rig.ledger, lambda: ChannelPolicies(rig.policies, {}))
    assert rig.job("k1").reason == long
    assert services.history("k1")[-1]["reason"] == long

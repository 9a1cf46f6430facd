"""Another's words are bounded where they are served, not only where they are recorded
(docs/review.md "Check", docs/http-api.md, docs/how-it-works.md "Another's words"): a
copy's Date, To and Subject as the mailbox holds them are written by whoever put a
message with the job's Message-ID there (or sent one with a huge Subject), and a check
served them whole to the API, the review page and the command line. Each is measured
as its reader gets it: the API's JSON, the page's HTML (an escape of HTML's is at most 5
times JSON's: `&amp;` for `&`), the command line's escaped line."""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import nullcontext
from datetime import timedelta
from json.encoder import encode_basestring_ascii
from typing import TypeVar

import pytest
from fastapi.testclient import TestClient
from tests.unit.engine_rig import EngineRig, policy
from tests.unit.test_api_routes import AUTH, api_context, job

from daemon.api.app import create_app
from daemon.cli import service as cli_service
from daemon.doubles.fake_provider import Copy, Scripted
from daemon.service_layer.services import ChannelPolicies, Services
from daemon.webhooks.delivery import Outcome
from daemon.webhooks.worker import Deliverer, Hook
from ledger.application import WriteFailure
from ledger.characters import MAX_RECORDED

T = TypeVar("T")

#: A megabyte of a header's words from a hostile mailbox message: control characters
#: (a terminal's escape, a forged line), a forged HTML tag and `&` (5 long in HTML).
HOSTILE = "Re: invoice \x1b[2J\r\nX-Forged: 1 <img src=x onerror=alert(1)> & \x00 " * 20_000
#: The most a served answer holds besides the copies' words (key, query, advice, ...).
FIELDS = 2_000
#: The review page of a job with one copy checked, besides the copy's words.
PAGE = 9_000


def _json_length(text: str) -> int:
    return len(encode_basestring_ascii(text)) - 2


def _bounded(words: str) -> None:
    assert _json_length(words) <= MAX_RECORDED, _json_length(words)
    assert words.startswith("Re: invoice ") and words.endswith(" more characters]")


@pytest.fixture
def rig() -> Iterator[EngineRig]:
    rig = EngineRig(policy("receipts", on_unknown="review"))
    yield rig
    rig.close()


@pytest.fixture
def client(rig: EngineRig) -> Iterator[TestClient]:
    with TestClient(create_app(api_context(rig))) as client:
        yield client


def _hostile_copy_of(rig: EngineRig, client: TestClient, key: str) -> None:
    """Job `key` in review, no copy of its own sent; then a message with its Message-ID
    and hostile headers lands in the mailbox."""
    assert client.post("/v1/jobs", json=job(key, "receipts"), headers=AUTH).status_code == 201
    rig.provider.script(Scripted.lost_request())
    rig.tick()
    assert rig.job(key).state.value == "review"
    at = rig.clock() - timedelta(hours=1)  # long visible to a search
    hostile = Copy("fake-hostile", rig.job(key).message_id, at, to=HOSTILE, subject=HOSTILE)
    rig.provider.copies.append(hostile)


def test_the_api_serves_a_hostile_copys_headers_bounded(rig: EngineRig, client: TestClient) -> None:
    _hostile_copy_of(rig, client, "k1")
    answer = client.post("/v1/review/k1/check", headers=AUTH)
    assert answer.status_code == 200
    # Before: 2,880,499 bytes (the To and the Subject whole, each 1.26 million long).
    assert len(answer.content) <= FIELDS + 2 * MAX_RECORDED, len(answer.content)
    [copy] = answer.json()["copies"]
    _bounded(copy["subject"])
    _bounded(copy["to"])


def test_the_review_page_serves_a_hostile_copys_headers_bounded_and_escaped(
    rig: EngineRig, client: TestClient
) -> None:
    _hostile_copy_of(rig, client, "k1")
    page = client.post("/ui/jobs/k1/check", headers=AUTH)
    assert page.status_code == 200 and "1 copy found" in page.text
    # Before: 3,369,334 bytes.
    assert len(page.content) < PAGE + 2 * 5 * MAX_RECORDED, len(page.content)
    assert "more characters]" in page.text
    assert "<img" not in page.text and "&lt;img src=x" in page.text
    assert "\x1b" not in page.text and "\x00" not in page.text


def test_the_review_page_shows_the_names_in_a_list_as_typed(
    rig: EngineRig, client: TestClient
) -> None:
    # The timeline's lists were ASCII-only JSON made printable: \\u674e\\u96f7 for 李雷.
    sent = job("k1", "receipts", to=["李雷 <lilei@example.com>"])
    assert client.post("/v1/jobs", json=sent, headers=AUTH).status_code == 201
    page = client.get("/ui/jobs/k1", headers=AUTH)
    assert page.status_code == 200
    assert "[&#34;李雷 &lt;lilei@example.com&gt;&#34;]" in page.text
    assert "\\u674e" not in page.text


def _served_by(rig: EngineRig) -> Callable[[argparse.Namespace, Callable[[Services], T]], T]:
    """The command's `served`, on the rig's store and provider instead of a config's."""
    services = Services(
        rig.ledger,
        lambda: ChannelPolicies(rig.policies, {}),
        providers=lambda name: nullcontext(rig.provider),
    )

    def served(args: argparse.Namespace, call: Callable[[Services], T]) -> T:
        return call(services)

    return served


def cli_check(
    rig: EngineRig,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    key: str,
    as_json: bool,
) -> str:
    """What `review check KEY [--json]` prints, on the rig's store and provider."""
    monkeypatch.setattr(cli_service, "served", _served_by(rig))
    args = argparse.Namespace(config=None, key=key, by="op", json=as_json)
    assert cli_service.cmd_review_check(args) == 0
    return capsys.readouterr().out


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_the_command_line_prints_a_hostile_copys_headers_bounded(
    rig: EngineRig,
    client: TestClient,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    as_json: bool,
) -> None:
    _hostile_copy_of(rig, client, "k1")
    out = cli_check(rig, monkeypatch, capsys, "k1", as_json)
    assert "\x1b" not in out and "\r" not in out
    if as_json:
        [copy] = json.loads(out)["copies"]
        _bounded(copy["subject"])
        _bounded(copy["to"])
    else:
        # The copy's line: its id, date, To and Subject, each at most MAX_RECORDED
        # (before: 2,880,045 characters).
        [line] = [line for line in out.splitlines() if "fake-hostile" in line]
        assert len(line) <= 100 + 2 * MAX_RECORDED, len(line)
        assert line.count(" more characters]") == 2
    assert len(out) <= FIELDS + 2 * MAX_RECORDED, len(out)


def test_a_webhooks_error_is_stored_bounded_whatever_the_poster(rig: EngineRig) -> None:
    """Only tests hand a Deliverer another poster than `delivery.post` (which keeps 200
    bytes of an answer): its error was stored whole in the position's `last_error`."""
    rig.submit("receipts", "k1")
    rig.provider.script(Scripted.rejected(transient=False, reason="550 no such user"))
    rig.tick()

    def refuses(url: str, body: bytes, headers: Mapping[str, str], timeout: float) -> Outcome:
        return Outcome(False, 500, "HTTP 500: " + HOSTILE)

    hook = Hook("crm", "https://hooks.example.com/x", "whsec_" + "A" * 32, frozenset({"rejected"}))
    Deliverer(rig.ledger, hook, owner="a", poster=refuses, clock=time.time).pass_once()
    [row] = [row for row in rig.ledger.positions().read_all() if row.name == "crm"]
    assert row.failures == 1 and row.last_error is not None
    assert _json_length(row.last_error) <= MAX_RECORDED, len(row.last_error)
    assert row.last_error.startswith("HTTP 500: Re: invoice ")


def test_healthz_serves_the_stores_the_writes_and_the_reloads_errors_bounded(
    rig: EngineRig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`/healthz` serves the store's driver's words and the operator's policy files'
    errors: each came whole into every probe's answer (a megabyte each, before)."""
    words = HOSTILE.replace("\r\n", " ")  # a driver's one line: the store's error's first
    failed_at = rig.clock()
    rig.ledger.write_failure = WriteFailure(at=failed_at, error=words)
    ctx = api_context(rig, policy_error=words)
    ctx.health.scope_failure = lambda: words
    ctx.health.clock_failure = lambda: (3.5, words)
    with TestClient(create_app(ctx)) as client:
        answer = client.get("/healthz", headers=AUTH)
        assert answer.status_code == 503
        store = answer.json()["checks"]["store"]
        for served in (store["write_error"], store["scope_leases_error"], store["clock_error"]):
            _bounded(served)
        _bounded(answer.json()["checks"]["policies"]["last_reload_error"])
        assert len(answer.json()["reasons"]) == 4
        for reason in answer.json()["reasons"]:
            assert _json_length(reason) <= MAX_RECORDED, _json_length(reason)
        # Before: 11,520,439 bytes (four texts, each in its check and in the reasons); 15,716 now.
        assert len(answer.content) <= FIELDS + 8 * MAX_RECORDED, len(answer.content)

        def unreachable(states: object) -> object:
            raise OSError(words)

        monkeypatch.setattr(rig.ledger, "counts", unreachable)
        down = client.get("/healthz", headers=AUTH)
        assert down.status_code == 503
        error = down.json()["checks"]["store"]["error"]
        assert error.startswith("store unreachable: OSError: Re: invoice ")
        assert _json_length(error) <= MAX_RECORDED, _json_length(error)
        assert len(down.content) <= FIELDS + 4 * MAX_RECORDED, len(down.content)

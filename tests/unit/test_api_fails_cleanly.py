"""The HTTP layer fails cleanly (docs/http-api.md "HTTP API", "Errors and statuses"): every error
is `{"error"}` with a documented status, bodies are decoded off the loop with limits, a
422 lists at most 100 errors, redirects never use the Host header, HEAD works where GET
does, every key is addressable, /healthz shows details only with a token, the sign-in
form has a CSRF token and a rate limit, and the docs page loads nothing from elsewhere."""

from __future__ import annotations

import contextlib
import json
import re
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import quote

import anyio.to_thread
import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.unit.engine_rig import EngineRig, policy
from tests.unit.test_api_routes import AUTH, TOKEN, api_context, job

from daemon.api.app import create_app
from daemon.api.auth import (
    MAX_SESSIONS_PER_NAME,
    SESSION_SECONDS,
    Identity,
    Role,
    Sessions,
    TokenBook,
)
from daemon.api.bodies import decode_body
from daemon.api.paths import canonical_path, key_segment
from daemon.api.signin_limit import FAILURES, WINDOW, SignInLimit
from daemon.config.settings import ConfigError, settings_from_dict
from daemon.doubles.fake_provider import Scripted
from daemon.service_layer.intake import IntakeError
from daemon.service_layer.problems import MAX_LISTED, FieldProblem
from ledger.keys import identifier_problem
from sendledger.client import Invalid

SUBMIT_ONLY = "submit-only-token-0123456789"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def rig() -> Iterator[EngineRig]:
    rig = EngineRig(policy("legal", on_unknown="review"))
    yield rig
    rig.close()


def make_client(rig: EngineRig, **changes: Any) -> TestClient:
    return TestClient(create_app(api_context(rig, max_body=20_000_000, **changes)))


@pytest.fixture
def client(rig: EngineRig) -> Iterator[TestClient]:
    with make_client(rig) as client:
        yield client


def test_unknown_routes_and_methods_answer_error_not_detail(client: TestClient) -> None:
    for method, path, status in [
        ("GET", "/nope", 404),
        ("GET", "/v1/jobs/", 404),
        ("DELETE", "/v1/jobs", 405),
        ("PUT", "/healthz", 405),
    ]:
        answer = client.request(method, path, headers=AUTH)
        assert answer.status_code == status, (method, path, answer.text)
        assert list(answer.json()) == ["error"], answer.text


DEEP = b"[" * 100_000 + b"]" * 100_000
HUGE_INT = b'{"as": "sent", "note": ' + b"9" * 5000 + b"}"


@pytest.mark.parametrize("body", [b"{", DEEP, HUGE_INT, b'{"as": "sent", "as": "abandon"}'])
def test_a_bad_resolve_body_is_422_error_never_400_or_500(client: TestClient, body: bytes) -> None:
    client.post("/v1/jobs", json=job("k1"), headers=AUTH)
    headers = {**AUTH, "content-type": "application/json"}
    answer = client.post("/v1/review/k1/resolve", content=body, headers=headers)
    assert answer.status_code == 422, answer.text
    assert set(answer.json()) == {"error", "errors", "count"}
    assert answer.json()["errors"][0]["field"] == "body"


@pytest.mark.parametrize("body", [DEEP, b'{"key": ' + b"1" * 5000 + b"}", b"\xff"])
def test_a_submit_that_is_not_json_is_422(client: TestClient, body: bytes) -> None:
    answer = client.post("/v1/jobs", content=body, headers=AUTH)
    assert answer.status_code == 422, answer.text
    assert answer.json()["error"].startswith("job: not valid JSON")


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-8-sig"])
def test_a_body_in_another_encoding_than_utf8_is_refused(client: TestClient, encoding: str) -> None:
    """`json.loads` guesses UTF-16 and UTF-32 from bytes, and passes over a UTF-8 byte
    order mark: such a body was taken (201), while a proxy or a policy check in front, which
    reads JSON as UTF-8 (RFC 8259), saw no job in it, or another. Refused as not UTF-8, on
    every route that takes a body, as `submit` refuses it from a file."""
    headers = {**AUTH, "content-type": "application/json"}
    body = json.dumps(job("k-" + encoding)).encode(encoding)
    answer = client.post("/v1/jobs", content=body, headers=headers)
    assert answer.status_code == 422, answer.text
    assert answer.json()["error"].startswith("job: not valid JSON"), answer.text
    assert client.get(f"/v1/jobs/k-{encoding}", headers=AUTH).status_code == 404
    client.post("/v1/jobs", json=job("k1"), headers=AUTH)
    cancel = json.dumps({"note": "n"}).encode(encoding)
    answer = client.post("/v1/jobs/k1/cancel", content=cancel, headers=headers)
    assert answer.status_code == 422 and answer.json()["errors"][0]["field"] == "body"
    assert client.get("/v1/jobs/k1", headers=AUTH).json()["state"] != "cancelled"


def test_a_422_lists_at_most_100_errors_each_naming_its_job(client: TestClient) -> None:
    answer = client.post("/v1/jobs", json=[{}] * 2500, headers=AUTH)
    assert answer.status_code == 422
    body = answer.json()
    assert body["count"] == 2500 * 5  # every job misses each of the five required fields
    assert len(body["errors"]) == MAX_LISTED
    assert [e["index"] for e in body["errors"]] == [n // 5 for n in range(MAX_LISTED)]
    assert body["error"] == "job[0].channel: is required"
    assert len(answer.content) < 20_000  # was one error per item: 155 MB for 8 MB


def test_the_cli_sentence_names_the_job_and_counts_the_rest() -> None:
    error = IntakeError([FieldProblem(1, "channel", "required"), FieldProblem(3, "to", "bad")])
    assert str(error) == "job[1].channel: required (and 1 more)"
    many = IntakeError([FieldProblem(i, "key", "x") for i in range(300)])
    assert (len(many.problems), many.total) == (MAX_LISTED, 300)


def test_redirects_never_use_the_host_header(client: TestClient) -> None:
    evil = {"host": "evil.example"}
    for path in ["/ui//", "/v1/review/", "/v1/jobs/", "/ui"]:
        answer = client.get(path, headers=evil, follow_redirects=False)
        assert "evil.example" not in answer.headers.get("location", ""), path
    assert client.get("/ui", follow_redirects=False).headers["location"] == "/ui/"


def test_trusted_hosts_refuse_another_host(rig: EngineRig) -> None:
    with make_client(rig, trusted_hosts=["api.example.com", "*.internal"]) as client:
        refused = client.get("/healthz", headers={"host": "evil.example"})
        assert refused.status_code == 400
        assert refused.json() == {"error": "Host not in api.trusted_hosts"}
        for host in ["api.example.com:8025", "API.example.com", "box.internal"]:
            assert client.get("/healthz", headers={"host": host}).status_code == 200, host


def test_head_works_where_get_does(client: TestClient) -> None:
    client.post("/v1/jobs", json=job("k1"), headers=AUTH)
    for path in ["/healthz", "/metrics", "/ui/", "/v1/jobs/k1", "/v1/docs", "/v1/openapi.json"]:
        get = client.get(path, headers=AUTH)
        head = client.head(path, headers=AUTH)
        assert head.status_code == get.status_code == 200, path
        assert head.content == b""
        assert head.headers["content-type"] == get.headers["content-type"]


def test_healthz_details_need_a_token(rig: EngineRig) -> None:
    secret = "/etc/sendledger/policies/legal.toml: from: 'ops@example.com' not allowed"
    with make_client(rig, policy_error=secret) as client:
        brief = client.get("/healthz")
        assert brief.status_code == 503
        assert brief.json() == {
            "ok": False,
            "checks": {"store": True, "scheduler": True, "policies": False, "providers": True},
        }
        assert "example.com" not in brief.text and "/etc" not in brief.text
        detailed = client.get("/healthz", headers=AUTH)
        assert detailed.json()["checks"]["policies"]["last_reload_error"] == secret


# -- every key addressable ---------------------------------------------------------------

key_text = st.lists(
    st.sampled_from([*"ab.-_ %~?#&+é日", "/", "%2F", "/events", "/cancel", "events", ".."]),
    min_size=1,
    max_size=6,
).map("".join)
keys = key_text.filter(lambda key: identifier_problem(key) is None and key.strip() == key)


@given(key=keys)
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_every_key_reaches_its_own_job_and_events(client: TestClient, key: str) -> None:
    answer = client.post("/v1/jobs", json=job(key), headers=AUTH)
    assert answer.status_code in (200, 201), (key, answer.text)
    path = key_segment(key)
    assert path == quote(key, safe="") or key in (".", "..")
    status = client.get(f"/v1/jobs/{path}", headers=AUTH)
    assert status.status_code == 200, (key, status.text)
    assert status.json()["key"] == key
    events = client.get(f"/v1/jobs/{path}/events", headers=AUTH)
    assert events.status_code == 200, (key, events.text)
    assert events.json()[0]["type"] == "Requested"
    assert events.json()[0]["key"] == key


def test_a_key_ending_in_events_is_its_own_job(client: TestClient) -> None:
    for key in ["amb", "amb/events", "solo/events"]:
        assert client.post("/v1/jobs", json=job(key), headers=AUTH).status_code == 201
    # The documented form keeps working for keys that do not end in /events.
    assert client.get("/v1/jobs/amb/events", headers=AUTH).json()[0]["key"] == "amb"
    assert client.get("/v1/jobs/amb%2Fevents", headers=AUTH).json()["key"] == "amb/events"
    assert client.get("/v1/jobs/solo%2Fevents", headers=AUTH).json()["key"] == "solo/events"
    events = client.get("/v1/jobs/solo%2Fevents/events", headers=AUTH).json()
    assert events[0]["key"] == "solo/events"
    # A literal slash still reads a key where it cannot be an action.
    assert client.get("/v1/jobs/amb/events%2F", headers=AUTH).status_code == 404
    page = client.get("/ui/jobs/solo%2Fevents", headers=AUTH)
    assert page.status_code == 200 and "solo/events" in page.text


#: Bytes that are not UTF-8 text: a Latin-1 `é`, a lone continuation byte, a lead byte
#: cut short, an overlong `/`, a surrogate's encoding.
not_utf8 = st.tuples(
    st.text("ab", max_size=3),
    st.sampled_from([b"\xe9", b"\xff", b"\x80", b"\xc3", b"\xc0\xaf", b"\xed\xa0\x80"]),
    st.text("ab", max_size=3),
).map(lambda parts: parts[0].encode() + parts[1] + parts[2].encode())


#: The keyed routes, each with a key in its path (`{k}`).
KEYED_ROUTES = [
    ("GET", "/v1/jobs/{k}"),
    ("GET", "/v1/jobs/{k}/events"),
    ("POST", "/v1/jobs/{k}/cancel"),
    ("POST", "/v1/review/{k}/check"),
    ("POST", "/v1/review/{k}/resolve"),
    ("GET", "/ui/jobs/{k}"),
    ("POST", "/ui/jobs/{k}/cancel"),
]


@given(raw=not_utf8, route=st.sampled_from(KEYED_ROUTES))
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_a_key_in_a_path_that_is_not_utf8_names_no_job(
    client: TestClient, raw: bytes, route: tuple[str, str]
) -> None:
    """A key's bytes in a path were decoded with U+FFFD for what is not UTF-8: `caf%E9` (a
    Latin-1 client's `café`), `caf%FF` and `caf%C3` all named job `caf\ufffd`, and a
    cancel or a resolution acted on that job. Refused, 422 naming `key`, nothing done."""
    replaced = raw.decode("utf-8", "replace")
    client.post("/v1/jobs", json=job(replaced), headers=AUTH)
    method, path = route
    url = path.replace("{k}", quote(raw, safe=""))
    body = {"as": "sent", "expected_version": 1} if url.endswith("/resolve") else {}
    answer = client.request(method, url, headers=AUTH, json=body)
    assert answer.status_code == 422, (url, answer.text)
    assert answer.json()["errors"][0]["field"] == "key", answer.text
    assert "not UTF-8" in answer.json()["error"]
    assert client.get(f"/v1/jobs/{key_segment(replaced)}", headers=AUTH).json()["state"] != (
        "cancelled"
    )


def test_canonical_paths() -> None:
    assert canonical_path(b"/v1/jobs/a%2Fb/events", "GET") == "/v1/jobs/a%2Fb/events"
    assert canonical_path(b"/v1/jobs/a/b", "GET") == "/v1/jobs/a%2Fb"
    assert canonical_path(b"/v1/jobs/a/cancel", "GET") == "/v1/jobs/a%2Fcancel"
    assert canonical_path(b"/v1/jobs/a/cancel", "POST") == "/v1/jobs/a/cancel"
    assert canonical_path(b"/v1/review/triage", "POST") == "/v1/review/triage"
    assert canonical_path(b"/v1/jobs/", "GET") is None
    assert canonical_path(b"/healthz", "GET") is None


# -- the sign-in form ---------------------------------------------------------------------


def _sign_in_form(client: TestClient) -> str:
    page = client.get("/ui/")
    found = re.search(r'name="csrf" value="([^"]+)"', page.text)
    assert found, page.text
    return found.group(1)


def test_sign_in_needs_the_forms_csrf_token(client: TestClient) -> None:
    csrf = _sign_in_form(client)
    assert client.post("/ui/sign-in", data={"token": TOKEN}).status_code == 403
    # Not ASCII: refused, not a TypeError from compare_digest (a 500).
    assert client.post("/ui/sign-in", data={"token": TOKEN, "csrf": "é"}).status_code == 403
    other = TestClient(client.app)  # another site's form: no sign-in cookie of ours
    forged = other.post("/ui/sign-in", data={"token": TOKEN, "csrf": csrf})
    assert forged.status_code == 403
    signed = client.post("/ui/sign-in", data={"token": TOKEN, "csrf": csrf}, follow_redirects=False)
    assert signed.status_code == 303
    cookie = [v for k, v in signed.headers.multi_items() if k == "set-cookie" and "session" in v]
    assert cookie and "HttpOnly" in cookie[0] and "SameSite=strict" in cookie[0]
    assert "Secure" not in cookie[0]  # plain http, no https public_url


HTTPS_WAYS = [("https://testserver", ""), ("http://testserver", "https://mail.example.com")]


def test_signing_out_ends_the_session_on_the_server_without_the_forms_csrf_token(
    client: TestClient,
) -> None:
    """A sign-out whose form carried no valid CSRF token (a form kept open, a page of
    another process) deleted the cookie in that browser only: the session stayed valid on
    the server for its 8 hours, for any copy of the cookie. The cookie is SameSite=Strict,
    so only a page of ours can send it: ending its session is all such a form can do."""
    csrf = _sign_in_form(client)
    client.post("/ui/sign-in", data={"token": TOKEN, "csrf": csrf})
    session = client.cookies["sendledger_session"]
    assert "<title>Sign in" not in client.get("/ui/").text
    out = client.post("/ui/sign-out", data={"csrf": "stale"}, follow_redirects=False)
    assert out.status_code == 303
    copy = TestClient(client.app)
    copy.cookies.set("sendledger_session", session, path="/ui")
    assert "<title>Sign in" in copy.get("/ui/").text  # the form: no session any more


def test_signing_in_again_ends_the_browsers_previous_session(client: TestClient) -> None:
    """A browser signed in again (another token on a shared desk) got a new cookie, and
    its previous session stayed valid on the server for any copy of the old cookie."""
    client.post("/ui/sign-in", data={"token": TOKEN, "csrf": _sign_in_form(client)})
    first = client.cookies["sendledger_session"]
    nonce = TestClient(client.app).get("/ui/")  # a sign-in form, as a signed-in browser
    client.cookies.set("sendledger_sign_in", nonce.cookies["sendledger_sign_in"], path="/ui")
    csrf = re.search(r'name="csrf" value="([^"]+)"', nonce.text)
    assert csrf
    again = client.post("/ui/sign-in", data={"token": TOKEN, "csrf": csrf.group(1)})
    assert again.status_code == 200 and client.cookies["sendledger_session"] != first
    copy = TestClient(client.app)
    copy.cookies.set("sendledger_session", first, path="/ui")
    assert "<title>Sign in" in copy.get("/ui/").text


def test_expired_sessions_are_pruned_and_each_name_holds_a_bounded_number() -> None:
    """Sessions were forgotten only when looked up after they expired: a browser that
    never came back (or a script signing in in a loop) left its session in memory for
    good. Expired ones are now dropped at each sign-in, and a name keeps its newest
    MAX_SESSIONS_PER_NAME (one token holder cannot grow memory, nor sign others out)."""
    clock = Clock()
    sessions = Sessions(clock=clock)
    old = [sessions.open("alice") for _ in range(3)]
    clock.now += SESSION_SECONDS + 1
    bob = sessions.open("bob")
    assert len(sessions._sessions) == 1 and sessions.who(old[0]) is None
    alice = [sessions.open("alice") for _ in range(MAX_SESSIONS_PER_NAME + 5)]
    assert len(sessions._sessions) == MAX_SESSIONS_PER_NAME + 1
    assert [sessions.who(s) for s in alice[:5]] == [None] * 5
    assert sessions.who(alice[-1]) == "alice" and sessions.who(bob) == "bob"


@pytest.mark.parametrize(("base", "public_url"), HTTPS_WAYS)
def test_the_session_cookie_is_secure_over_https(
    rig: EngineRig, base: str, public_url: str
) -> None:
    with make_client(rig, public_url=public_url) as client:
        client.base_url = client.base_url.copy_with(scheme=base.split(":")[0])
        csrf = _sign_in_form(client)
        nonce = client.cookies["sendledger_sign_in"]
        client.cookies.clear()  # a Secure cookie is not sent over plain http: sent by hand
        signed = client.post(
            "/ui/sign-in",
            data={"token": TOKEN, "csrf": csrf},
            headers={"cookie": f"sendledger_sign_in={nonce}"},
            follow_redirects=False,
        )
        assert signed.status_code == 303
        assert "Secure" in signed.headers["set-cookie"]


def test_sign_in_is_limited_per_address(rig: EngineRig) -> None:
    clock = Clock()
    with make_client(rig, signin_limit=SignInLimit(clock=clock)) as client:
        for _ in range(FAILURES):
            csrf = _sign_in_form(client)
            wrong = client.post("/ui/sign-in", data={"token": "x" * 20, "csrf": csrf})
            assert wrong.status_code == 401
        csrf = _sign_in_form(client)
        limited = client.post("/ui/sign-in", data={"token": TOKEN, "csrf": csrf})
        assert limited.status_code == 429
        assert int(limited.headers["retry-after"]) == int(WINDOW)
        clock.now += WINDOW + 1
        allowed = client.post(
            "/ui/sign-in", data={"token": TOKEN, "csrf": csrf}, follow_redirects=False
        )
        assert allowed.status_code == 303


@pytest.mark.parametrize("version", [True, "1"])
def test_an_expected_version_that_is_not_a_json_integer_is_refused(
    client: TestClient, version: object
) -> None:
    """A decision holds for the version a person saw: `true` (or `"1"`) is no version,
    yet pydantic's lax mode read it as 1 and cancelled a job at version 1."""
    client.post("/v1/jobs", json=job("k1"), headers=AUTH)
    for path, body in [
        ("/v1/jobs/k1/cancel", {"expected_version": version}),
        ("/v1/review/k1/resolve", {"as": "abandon", "expected_version": version}),
    ]:
        refused = client.post(path, json=body, headers=AUTH)
        assert refused.status_code == 422, refused.text
        assert refused.json()["errors"][0]["field"] == "expected_version"
    assert client.get("/v1/jobs/k1", headers=AUTH).json()["state"] == "requested"


def test_healthz_and_metrics_answer_while_every_worker_thread_waits_on_a_mailbox(
    rig: EngineRig,
) -> None:
    """Checks, resends and triage wait on the mailbox in the worker threads the routes
    share (40); a slow provider, healthy, can hold them all. `/healthz` and `/metrics`
    then waited behind them: a liveness probe failing, a restart, while nothing was
    wrong with this process. Two threads here stand for the 40."""
    release = threading.Event()

    def slow_mailbox() -> None:
        release.wait(10)

    with make_client(rig) as client:
        portal = client.portal
        assert portal is not None

        def shrink() -> None:
            anyio.to_thread.current_default_thread_limiter().total_tokens = 2

        portal.call(shrink)
        for key in ("k1", "k2"):
            client.post("/v1/jobs", json=job(key), headers=AUTH)
            rig.provider.script(Scripted.lost_request())
            rig.tick()
        rig.provider.during_search = slow_mailbox
        with ThreadPoolExecutor(4) as pool:
            checks = [
                pool.submit(client.post, f"/v1/review/{key}/check", headers=AUTH)
                for key in ("k1", "k2")
            ]
            while rig.provider.searches < 2:
                release.wait(0.01)
            health = pool.submit(client.get, "/healthz")
            metrics = pool.submit(client.get, "/metrics")
            try:
                assert health.result(timeout=3).status_code == 200
                assert metrics.result(timeout=3).status_code == 200
            finally:
                release.set()
            assert [check.result(timeout=10).status_code for check in checks] == [200, 200]


class SlowTokenBook(TokenBook):
    """A token book whose look-up waits until `together` of them are under way at once
    (or a second has passed): sign-ins sent at the same moment, each still being
    judged when the next asks whether its address may try."""

    def __init__(self, together: int) -> None:
        super().__init__({TOKEN: "alice"})
        self._barrier = threading.Barrier(together, timeout=1.0)

    def identity(self, token: str | None) -> Identity | None:
        if token is None:  # the page asking for a header's token: none sent
            return None
        with contextlib.suppress(threading.BrokenBarrierError):  # fewer came at once
            self._barrier.wait()
        return super().identity(token)


def test_sign_ins_sent_at_once_are_limited_as_one_after_the_other(rig: EngineRig) -> None:
    """The limit was asked before a guess was judged and told after: guesses sent at once
    (up to the server's worker threads, 40) all passed the question, `FAILURES` (5) a
    window being the documented most."""
    guesses = 3 * FAILURES
    limit = SignInLimit(clock=Clock())
    with make_client(rig, signin_limit=limit, tokens=SlowTokenBook(guesses)) as client:
        csrf = _sign_in_form(client)

        def guess(number: int) -> int:
            wrong = {"token": f"wrong-token-{number:08d}", "csrf": csrf}
            return int(client.post("/ui/sign-in", data=wrong).status_code)

        with ThreadPoolExecutor(guesses) as pool:
            codes = sorted(pool.map(guess, range(guesses)))
    assert codes == [401] * FAILURES + [429] * (guesses - FAILURES), codes


def test_ipv6_sign_ins_are_limited_per_64_prefix(rig: EngineRig) -> None:
    """One IPv6 host has a /64 to itself (2^64 addresses, SLAAC privacy addresses): limited
    per address, each guess came from a fresh one and the limit never met a second."""
    app = create_app(api_context(rig, max_body=20_000_000, signin_limit=SignInLimit(clock=Clock())))

    def guess(address: str, token: str = "x" * 20) -> int:
        with TestClient(app, client=(address, 50000)) as client:
            csrf = _sign_in_form(client)
            answer = client.post("/ui/sign-in", data={"token": token, "csrf": csrf})
            return int(answer.status_code)

    codes = [guess(f"2001:db8:1:2::{n:x}") for n in range(1, FAILURES + 2)]
    assert codes == [401] * FAILURES + [429], codes
    assert guess("2001:db8:1:2:ffff:ffff:ffff:ffff", TOKEN) == 429  # the same /64
    assert guess("2001:db8:1:3::1") == 401  # another /64: another host
    assert guess("192.0.2.7") == 401  # IPv4: per address, as before


def test_a_valid_token_without_the_role_resets_no_failure(rig: EngineRig) -> None:
    # 127b519: a sign-in with a submit-only token (403) cleared the count, so four wrong
    # tokens and one such sign-in, repeated, never met the documented 429.
    clock = Clock()
    tokens = TokenBook({TOKEN: "alice", SUBMIT_ONLY: Identity("bot", frozenset({Role.SUBMIT}))})
    limit = SignInLimit(clock=clock)
    with make_client(rig, signin_limit=limit, tokens=tokens) as client:
        statuses = []
        for _ in range(3):
            for token in ["x" * 20] * (FAILURES - 1) + [SUBMIT_ONLY]:
                csrf = _sign_in_form(client)
                statuses.append(client.post("/ui/sign-in", data={"token": token, "csrf": csrf}))
        codes = [answer.status_code for answer in statuses]
        assert codes[:FAILURES] == [401] * (FAILURES - 1) + [403]
        assert codes[FAILURES] == 401 and codes[FAILURES + 1] == 429, codes
        # Neither does a sign-in with the role: only time clears the failures.
        csrf = _sign_in_form(client)
        assert client.post("/ui/sign-in", data={"token": TOKEN, "csrf": csrf}).status_code == 429
        clock.now += WINDOW + 1
        signed = client.post(
            "/ui/sign-in", data={"token": TOKEN, "csrf": csrf}, follow_redirects=False
        )
        assert signed.status_code == 303


def test_page_forms_that_change_state_carry_the_csrf_token(client: TestClient) -> None:
    client.post("/v1/jobs", json=job("k1"), headers=AUTH)
    csrf = _sign_in_form(client)
    client.post("/ui/sign-in", data={"token": TOKEN, "csrf": csrf})
    page = client.get("/ui/jobs/k1")
    assert 'name="csrf"' in page.text
    refused = client.post("/ui/jobs/k1/cancel", data={"csrf": "forged"})
    assert refused.status_code == 403
    assert client.get("/v1/jobs/k1", headers=AUTH).json()["state"] == "requested"


def test_a_form_another_site_posts_with_a_bearer_header_is_refused(client: TestClient) -> None:
    """A proxy that adds `Authorization: Bearer` to every request it forwards (the page's
    "scripts and proxies") makes that header as ambient as a cookie: a form on another
    site that the browser posts through the proxy would act, with no CSRF token to stop
    it. A browser says where a form came from (`Sec-Fetch-Site`, `Origin`); a script
    (curl, the tests) sends neither."""
    for key in ("k1", "k2"):
        client.post("/v1/jobs", json=job(key), headers=AUTH)
    for other_site in (
        {"Sec-Fetch-Site": "cross-site"},
        {"Sec-Fetch-Site": "same-site"},
        {"Origin": "https://evil.example"},
        {"Origin": "null"},
    ):
        refused = client.post("/ui/jobs/k1/cancel", data={}, headers={**AUTH, **other_site})
        assert refused.status_code == 403, (other_site, refused.text)
        assert client.get("/v1/jobs/k1", headers=AUTH).json()["state"] == "requested"
    same = {"Sec-Fetch-Site": "same-origin", "Origin": "http://testserver"}
    done = client.post(
        "/ui/jobs/k2/cancel", data={}, headers={**AUTH, **same}, follow_redirects=False
    )
    assert (
        done.status_code == 303
        and client.get("/v1/jobs/k2", headers=AUTH).json()["state"] == "cancelled"
    )
    script = client.post("/ui/jobs/k1/cancel", data={}, headers=AUTH, follow_redirects=False)
    assert script.status_code == 303


# -- the docs page ------------------------------------------------------------------------


def test_the_docs_page_loads_nothing_from_another_host(client: TestClient) -> None:
    page = client.get("/v1/docs")
    assert page.status_code == 200
    assert not re.search(r"(https?:)?//[a-z]", page.text.replace("://testserver", "")), page.text
    for asset in re.findall(r'(?:src|href)="([^"]+)"', page.text):
        assert asset.startswith("/v1/"), asset
        assert client.get(asset).status_code == 200, asset


# -- the two [api] settings ---------------------------------------------------------------


def _api_settings(**api: Any) -> Any:
    return settings_from_dict({"store": {"url": "sqlite:///x.sqlite"}, "api": api}).api


def test_trusted_hosts_and_public_url_settings() -> None:
    api = _api_settings(
        trusted_hosts=["mail.example.com", "*.internal"], public_url="https://m.example.com/"
    )
    assert api.trusted_hosts == ["mail.example.com", "*.internal"]
    assert api.public_url == "https://m.example.com"
    assert _api_settings().trusted_hosts == [] and _api_settings().public_url == ""
    refused_settings: list[dict[str, Any]] = [
        {"trusted_hosts": ["evil example"]}, {"trusted_hosts": [""]},
        {"public_url": "ftp://x"}, {"public_url": "mail.example.com"}]  # fmt: skip
    for bad in refused_settings:
        with pytest.raises(ConfigError) as refused:
            _api_settings(**bad)
        assert f"api.{next(iter(bad))}" in str(refused.value)


# -- the pages never answer 5xx ------------------------------------------------------------

page_text = st.text(max_size=12) | st.sampled_from(["\x00", "9" * 30, "-1", "resolve", "sent"])
PAGE_STATUSES = {200, 303, 401, 403, 404, 409, 422, 429, 503}


@given(
    route=st.sampled_from(
        [
            ("GET", "/ui/", ["channel", "reason", "sort", "page"]),
            ("GET", "/ui/search", ["q"]),
            ("GET", "/ui/jobs/{key}", ["done"]),
            ("GET", "/ui/triage", []),
            ("GET", "/ui/overview", []),
            ("POST", "/ui/jobs/{key}/resolve", ["as", "note", "csrf"]),
            ("POST", "/ui/jobs/{key}/check", ["csrf"]),
            ("POST", "/ui/jobs/{key}/cancel", ["note", "csrf"]),
            ("POST", "/ui/triage", ["channel", "reason", "mode", "csrf"]),
            ("POST", "/ui/sign-in", ["token", "csrf"]),
            ("POST", "/ui/sign-out", ["csrf"]),
        ]
    ),
    key=keys | st.sampled_from(["k1", "k1/events", "%", ".."]),
    values=st.dictionaries(
        st.sampled_from(
            ["channel", "q", "page", "as", "note", "mode", "csrf", "token", "done", "sort"]
        ),
        page_text,
    ),
    signed=st.booleans(),
)
@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_pages_answer_only_page_statuses(
    client: TestClient,
    route: tuple[str, str, list[str]],
    key: str,
    values: dict[str, str],
    signed: bool,
) -> None:
    client.post("/v1/jobs", json=job("k1"), headers=AUTH)  # a job to act on (then 200)
    method, path, _ = route
    url = path.replace("{key}", key_segment(key))
    headers = AUTH if signed else {}
    if method == "GET":
        answer = client.get(url, params=values, headers=headers, follow_redirects=False)
    else:
        answer = client.post(url, data=values, headers=headers, follow_redirects=False)
    assert answer.status_code in PAGE_STATUSES, (method, url, values, answer.text[:300])


# -- bodies and 422s as docs/http-api.md gives them ----------------------------------------


def test_the_decoder_s_limits_are_the_page_s() -> None:
    """A body nests about 1,000 levels at most and holds integers of up to 4,300 digits."""
    assert sys.get_int_max_str_digits() == 4300
    assert decode_body(b'{"n": ' + b"9" * 4300 + b"}")["n"] > 0
    deep = sys.getrecursionlimit()
    assert 900 <= deep <= 1100
    nested, depth = decode_body(b"[" * 400 + b"]" * 400), 1
    while nested:
        nested, depth = nested[0], depth + 1
    assert depth == 400
    for refused in (b'{"n": ' + b"9" * 4301 + b"}", b"[" * (deep + 1) + b"]" * (deep + 1)):
        with pytest.raises(json.JSONDecodeError):
            decode_body(refused)
    with pytest.raises(json.JSONDecodeError, match="twice"):
        decode_body(b'{"as": "sent", "as": "abandon"}')


def test_invalid_counts_what_the_server_counted(rig: EngineRig) -> None:
    """A 422 lists at most 100 errors; `Invalid.total` is how many there were (the body's
    `count`: five required fields missing in each of 250 jobs), not how many were listed."""
    with TestClient(create_app(api_context(rig))) as client:
        answer = client.post("/v1/jobs", json=[{}] * 250, headers=AUTH)
    assert answer.status_code == 422
    refused = Invalid(422, answer.json()["error"], answer.json())
    assert len(refused.errors) == MAX_LISTED
    assert refused.total == 250 * 5
    assert refused.errors[0].index == 0 and refused.errors[0].field == "channel"


def test_forwarded_headers_are_read_from_a_proxy_on_the_same_host_only() -> None:
    """uvicorn reads X-Forwarded-Proto (and -For) only from loopback: a proxy on the same
    host. Its scheme then makes the cookies Secure (`daemon.api.ui.secure_cookies`)."""
    from fastapi import FastAPI

    from daemon.api.server import ApiServer

    config = ApiServer(FastAPI(), "127.0.0.1", 0).server.config
    assert config.proxy_headers is True
    assert set(str(config.forwarded_allow_ips).split(",")) <= {"127.0.0.1", "::1"}

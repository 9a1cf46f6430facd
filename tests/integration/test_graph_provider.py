"""GraphProvider on the real client stack (msal + httplib2) -> FaultRelay (TLS) ->
GraphEmulator (TLS, throw-away CA trusted through REQUESTS_CA_BUNDLE).

Effects are counted where they happen: in the emulator's acceptance log (one JSON line per
message actually sent). Requests that reached the relay are counted in `relay.log`, so a
re-send by any layer shows up even when the relay answers without forwarding. These are
emulator results, not a Microsoft guarantee.

What every provider must do is the provider contract (tests/provider_contract.py), which
`TestGraphContract` runs here; the rest of this file is what is Graph's own.
"""

from __future__ import annotations

import concurrent.futures
import datetime as dt
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from email.message import EmailMessage
from pathlib import Path
from typing import Any, cast
from urllib.parse import quote

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID
from tests.integration.bounce_checks import (
    Mailboxes,
    run_bounce_checks,
    run_report_at_the_watch_s_end_check,
    run_report_before_send_check,
)
from tests.integration.conftest import asked_at_most
from tests.provider_contract import (
    THROTTLED,
    DraftsSubject,
    Expect,
    HttpRelaySubject,
    LeavesDraftsContract,
    ReadBackContract,
    RewritingSubject,
    SearchFaultContract,
    SendContract,
)

import daemon.providers.graph as graph_module
from daemon.providers.base import (
    Provider,
    ProviderError,
    ScopeLost,
    SendKind,
    SendOutcome,
    calls_while,
    fence_job,
    for_job,
    search_job,
)
from daemon.providers.graph import GraphProvider, GraphTokens, trusted_ca_bundle
from daemon.providers.graph_credentials import read_certificate
from daemon.providers.outcomes import SEARCH_STOPS_AT
from ledger.copies import COPIES_KEPT
from policies.model import ChannelPolicy
from testkit.dsn import rfc3464_report
from testkit.graph_emulator import (
    DEFAULT_CLIENT_ID,
    DEFAULT_CLIENT_SECRET,
    DEFAULT_TENANT,
    NDR_CLASS,
    GraphEmulator,
)
from testkit.relay import FaultPlan, FaultRelay, Mode
from testkit.tls import TlsFiles, make_loopback_tls

MAILBOX = "support@example.com"
MID = "<job-00112233445566778899aabbccddeeff@mail.example.com>"
TIMEOUT = 2.0  # generous: TLS handshakes on a loaded machine
HANG = 3.0  # past TIMEOUT: the client gives up first

ProviderFactory = Callable[..., GraphProvider]


def raw_message(message_id: str = MID, sender: str = MAILBOX) -> bytes:
    msg = EmailMessage()
    msg["From"] = sender
    msg["To"] = "customer@example.net"
    msg["Subject"] = "Your receipt"
    msg["Message-ID"] = message_id
    msg.set_content("Thanks.")
    return msg.as_bytes()


def logged_copies(log: Path, message_id: str = MID) -> int:
    if not log.exists():
        return 0
    lines = log.read_text(encoding="utf-8").splitlines()
    return sum(1 for line in lines if json.loads(line)["message_id"] == message_id)


def relay_sends(relay: FaultRelay) -> int:
    return sum(1 for entry in relay.log if entry["kind"] == "send")


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return make_loopback_tls(tmp_path_factory.mktemp("graph-tls"))


@pytest.fixture(autouse=True)
def trust_ca(tls: TlsFiles, monkeypatch: pytest.MonkeyPatch) -> None:
    # How an operator trusts a private CA: requests (so msal) reads REQUESTS_CA_BUNDLE.
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(tls.ca_file))


@pytest.fixture
def accept_log(tmp_path: Path) -> Path:
    return tmp_path / "graph-accepted.jsonl"


@pytest.fixture
def graph(tls: TlsFiles, accept_log: Path) -> Iterator[GraphEmulator]:
    with GraphEmulator(tls=tls, acceptance_log=accept_log) as emulator:
        yield emulator


@pytest.fixture
def relay(graph: GraphEmulator, tls: TlsFiles) -> Iterator[FaultRelay]:
    with FaultRelay(
        graph.url,
        tls=tls,
        upstream_ca=str(tls.ca_file),
        hang_seconds=HANG,
        retry_after=1.0,
    ) as rel:
        yield rel


@pytest.fixture
def provider(relay: FaultRelay) -> Iterator[ProviderFactory]:
    made: list[GraphProvider] = []

    def make(
        *,
        user: str = MAILBOX,
        secret: str | dict[str, str] = DEFAULT_CLIENT_SECRET,
        authority: str | None = None,
        api: str | None = None,
        kind: type[GraphProvider] = GraphProvider,
        **overrides: Any,
    ) -> GraphProvider:
        tokens = GraphTokens(
            authority=authority or relay.url,
            tenant_id=DEFAULT_TENANT,
            client_id=DEFAULT_CLIENT_ID,
            credential=secret,
            timeout=5.0,
        )
        options: dict[str, Any] = {"timeout": TIMEOUT, "confirm_wait": 1.0, **overrides}
        made.append(
            kind(
                "graph",
                tokens=tokens,
                user=user,
                api_endpoint=api or relay.url + "/v1.0",
                ca_certs=trusted_ca_bundle(),
                **options,
            )
        )
        return made[-1]

    yield make
    for one in made:
        one.close()


@pytest.fixture
def unused_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"


# -- the provider contract, counted at the emulator -----------------------------------------


class GraphSubject(HttpRelaySubject, RewritingSubject, DraftsSubject):
    """A GraphProvider on msal + httplib2 through the TLS relay; copies counted in the
    emulator's acceptance log, drafts in its drafts folder."""

    sender = MAILBOX
    recipient = "customer@example.net"
    hang_seconds = HANG
    missing_id = "AAkALgAAAAAAHYQDEapmEc2byACqAC-EWg0AnoSuchMessage"

    def __init__(
        self, make: ProviderFactory, relay: FaultRelay, graph: GraphEmulator, log: Path, dead: str
    ) -> None:
        self.make, self.relay, self.graph, self.log = make, relay, graph, log
        self.dead = dead.replace("http://", "https://") + "/v1.0"
        super().__init__(make())

    def restarted(self) -> Provider:
        return self.make()

    def unreachable(self) -> Provider:
        return self.make(api=self.dead)

    def refused_for_good(self, message_id: str) -> bytes:
        self.graph.mailboxes = {"other@example.com"}  # the app's access policy: not ours
        return self.raw(message_id)

    def rewrite_message_ids(self) -> None:
        self.graph.rewrite_message_id = True

    def drafts_left(self, message_id: str) -> int:
        drafts = self.graph.folder(MAILBOX, "drafts")
        return sum(1 for draft in drafts if draft["internetMessageId"] == message_id)

    def leave_draft(self, message_id: str) -> None:
        self.fault("fail-before-forward")  # created, then the send never reached Graph
        assert self.provider.send_raw(self.raw(message_id)).kind is SendKind.UNKNOWN


class TestGraphContract(SendContract, ReadBackContract, SearchFaultContract, LeavesDraftsContract):
    # A 503 with Retry-After is Graph's "not sent, wait" (docs/providers.md "What each kind
    # does"); a 5xx without one is Unknown.
    EXTRA_FAULTS = {
        "hang-before-forward": Expect(SendKind.UNKNOWN, 0, timed_out=True),
        "500-after-forward": Expect(SendKind.UNKNOWN, 1, status=500),
        "503": Expect(**{**vars(THROTTLED), "status": 503}),
        "429": Expect(**{**vars(THROTTLED), "status": 429}),
    }
    SEARCH_FAULTS = {
        "503": (True, 1.0),
        "429": (True, 1.0),
        "500-after-forward": (False, None),
        "drop-response": (False, None),
    }
    QUERY = "internetMessageId eq '{id}'"
    subject: GraphSubject

    @pytest.fixture(name="subject")
    def graph_subject(
        self,
        provider: ProviderFactory,
        relay: FaultRelay,
        graph: GraphEmulator,
        accept_log: Path,
        unused_url: str,
    ) -> GraphSubject:
        return GraphSubject(provider, relay, graph, accept_log, unused_url)


# -- what is Graph's own ----------------------------------------------------------------------


# mode -> (outcome kind of the send, copies sent)
def test_a_dropped_response_on_a_reused_connection_is_one_copy(
    provider: ProviderFactory, relay: FaultRelay, accept_log: Path
) -> None:
    graph_provider = provider()
    assert graph_provider.send_raw(raw_message("<warm@x>")).kind is SendKind.CONFIRMED
    relay.set_plan(FaultPlan(send=["drop-response"]))
    assert graph_provider.send_raw(raw_message()).kind is SendKind.UNKNOWN
    assert logged_copies(accept_log) == 1
    assert relay_sends(relay) == 2


def test_create_faults_are_never_sent(
    provider: ProviderFactory, relay: FaultRelay, graph: GraphEmulator, accept_log: Path
) -> None:
    graph_provider = provider()
    graph_provider.search("<warm-up@x>")  # token and discovery first: "other" is the create
    for mode in ("drop-response", "500-after-forward", "fail-before-forward", "429"):
        relay.set_plan(FaultPlan(other=[mode]))
        outcome = graph_provider.send_raw(raw_message())
        assert outcome.kind is SendKind.REJECTED and outcome.transient, (mode, outcome)
    assert relay_sends(relay) == 0
    assert logged_copies(accept_log) == 0
    # A draft the server made before the answer was lost is found and fenced.
    restarted = provider()
    assert restarted.search(MID).hits == ()
    assert restarted.delete_drafts(MID) != []
    assert graph.folder(MAILBOX, "drafts") == []


# -- 202 is not yet a copy ----------------------------------------------------------------


def test_a_late_filed_copy_is_unknown_then_found_by_id_before_the_index(
    provider: ProviderFactory, graph: GraphEmulator, accept_log: Path
) -> None:
    graph.set_file_delay(0.6)
    graph.set_lag(30.0)
    graph_provider = provider(confirm_wait=0.1)
    outcome = graph_provider.send_raw(raw_message())
    assert outcome.kind is SendKind.UNKNOWN and "not seen" in outcome.reason
    assert graph_provider.search(MID).hits == ()  # in transit: no copy anywhere yet
    time.sleep(0.7)
    # Filed: the immutable id finds it at once; the $filter index does not yet.
    [hit] = graph_provider.search(MID).hits
    assert hit.labels == ("sentitems",)
    assert provider().search(MID).hits == ()
    assert logged_copies(accept_log) == 1


def test_confirm_wait_covers_the_filing_delay(
    provider: ProviderFactory, graph: GraphEmulator
) -> None:
    graph.set_file_delay(0.3)
    outcome = provider(confirm_wait=2.0).send_raw(raw_message())
    assert outcome.kind is SendKind.CONFIRMED
    [copy] = graph.folder(MAILBOX, "sentitems")
    assert outcome.provider_message_id == copy["id"]


def test_search_follows_pages(
    provider: ProviderFactory, relay: FaultRelay, monkeypatch: pytest.MonkeyPatch
) -> None:
    graph_provider = provider()
    for _ in range(3):
        graph_provider.send_raw(raw_message())
    monkeypatch.setattr(graph_module, "PAGE_SIZE", 2)
    assert len(provider().search(MID).hits) == 3
    pages = [e for e in relay.log if "sentitems" in e["path"] and e["method"] == "GET"]
    assert len(pages) == 2


def test_a_search_of_more_copies_than_its_pages_hold_stops_reading_once_it_has_decided(
    provider: ProviderFactory, relay: FaultRelay, monkeypatch: pytest.MonkeyPatch
) -> None:
    """More copies than MAX_PAGES pages hold (5,000 at Graph's defaults): the search read
    every page up to that bound, then failed ("more than 50 pages"), every time: such a
    job never had an answer. It now stops once it has SEARCH_STOPS_AT copies: a duplicate
    of at least that many, COPIES_KEPT kept."""
    graph_provider = provider()
    for _ in range(30):
        graph_provider.send_raw(raw_message())
    monkeypatch.setattr(graph_module, "PAGE_SIZE", 5)
    monkeypatch.setattr(graph_module, "MAX_PAGES", 5)  # 25 listed at most: 30 copies
    result = provider().search(MID)
    assert result.count == SEARCH_STOPS_AT and not result.complete
    assert len(result.copies) == COPIES_KEPT
    pages = [e for e in relay.log if "sentitems" in e["path"] and e["method"] == "GET"]
    assert len(pages) == 5  # the 21st copy is on the fifth page; no sixth is asked for


def test_a_sent_copy_its_sender_deleted_is_still_a_copy(
    provider: ProviderFactory, graph: GraphEmulator
) -> None:
    # Moved to Deleted Items before the search: the message was sent, and a miss would
    # have the job sent again. Counted once, whatever folder its immutable id is in.
    graph_provider = provider()
    assert graph_provider.send_raw(raw_message()).kind is SendKind.CONFIRMED
    sent = [item for item in graph.folder(MAILBOX, "sentitems")
            if item["internetMessageId"] == MID]  # fmt: skip
    assert len(sent) == 1
    graph.move(MAILBOX, sent[0]["id"], "deleteditems")
    found = graph_provider.search(MID)
    assert len(found.hits) == 1 and "deleteditems" in found.query


def test_a_message_to_its_own_mailbox_whose_received_copy_was_deleted_is_one_copy(
    provider: ProviderFactory, graph: GraphEmulator
) -> None:
    # Exchange files a message sent to its own mailbox twice: the Sent Items copy and
    # the received one, same internetMessageId. The person deletes the received copy:
    # beside a sent copy it is no second send (counted, it made a false duplicate).
    graph_provider = provider()
    assert graph_provider.send_raw(raw_message()).kind is SendKind.CONFIRMED
    received = graph.inject(raw_message(), user=MAILBOX)
    graph.move(MAILBOX, received, "deleteditems")
    assert len(graph.folder(MAILBOX, "deleteditems")) == 1
    found = graph_provider.search(MID)
    assert len(found.hits) == 1 and "deleteditems" not in found.query, found


class _LostRequests(GraphProvider):
    """Searches the emulator; every send is a request that never reached Graph (a timeout
    before the connection was made), Unknown to the daemon and sent to nobody."""

    def send_raw(self, raw: bytes) -> SendOutcome:
        return SendOutcome(SendKind.UNKNOWN, "timed out before Graph answered")

    def send_made_in(self, *args: Any) -> SendOutcome:  # the engine's send of its draft
        return self.send_raw(b"")


def test_a_received_message_moved_to_deleted_items_sends_an_unknown_job_to_review(
    provider: ProviderFactory, graph: GraphEmulator
) -> None:
    """The job's send never reached Graph (Unknown); a message from someone else with
    its Message-ID (computable from the job's key) was received and deleted. Before, the
    search counted it in Deleted Items as the job's copy and the job was Confirmed, never
    sent. Now a copy only in Deleted Items sends the job to review (`only-in-trash`)."""
    from tests.unit.engine_rig import EngineRig, policy

    from daemon.doubles.fake_provider import FakeProvider
    from ledger.vocabulary import EscalationReason, JobState

    searched = provider(kind=_LostRequests)
    # The rig takes a FakeProvider's maker; this test uses only the port's calls.
    with EngineRig(
        policy("receipts", on_unknown="retry"), provider=lambda clock: cast(FakeProvider, searched)
    ) as rig:
        message_id = rig.submit("receipts", "k1")
        assert rig.tick().unknown == 1
        forged = raw_message(message_id, sender="mallory@evil.example")
        received = graph.inject(forged, user=MAILBOX)
        graph.move(MAILBOX, received, "deleteditems")
        found = searched.search(message_id)
        assert found.only_in_trash and "deleteditems" in found.query
        report = rig.advance_and_tick(60)  # search_after
        job = rig.job("k1")
        assert (report.searched, report.confirmed) == (1, 0)
        assert (job.state, job.reason) == (JobState.REVIEW, EscalationReason.ONLY_IN_TRASH)
        assert rig.events("k1")[-1] == "Escalated"
    assert graph.folder(MAILBOX, "sentitems") == []


def test_a_sent_copy_is_not_marked_in_the_trash_and_one_in_deleted_items_is(
    provider: ProviderFactory, graph: GraphEmulator
) -> None:
    graph_provider = provider()
    assert graph_provider.send_raw(raw_message()).kind is SendKind.CONFIRMED
    found = graph_provider.search(MID)
    assert [hit.in_trash for hit in found.hits] == [False] and not found.only_in_trash
    (sent,) = graph.folder(MAILBOX, "sentitems")
    graph.move(MAILBOX, sent["id"], "deleteditems")
    # Moved by its sender, the copy this process sent is still found by its draft's id
    # (ours, wherever it is); another process finds it only in Deleted Items.
    other = provider()
    found = other.search(MID)
    assert [hit.in_trash for hit in found.hits] == [True] and found.only_in_trash


# -- ids, Message-IDs, mailboxes --------------------------------------------------------


def test_from_placeholder_sends_as_each_jobs_mailbox(
    provider: ProviderFactory, graph: GraphEmulator
) -> None:
    graph_provider = provider(user="{from}")
    for sender in ("a@example.com", "B@Example.com"):
        view = for_job(graph_provider, f"Shop <{sender}>", None)
        outcome = view.send_raw(raw_message(f"<m-{sender.lower()}>", sender))
        assert outcome.kind is SendKind.CONFIRMED
        assert len(view.search(f"<m-{sender.lower()}>").hits) == 1
    assert [entry["user"] for entry in graph.accepted()] == ["a@example.com", "b@example.com"]


# -- tokens ---------------------------------------------------------------------------------


def test_a_wrong_secret_is_a_permanent_refusal_and_nothing_is_asked_of_graph(
    provider: ProviderFactory, graph: GraphEmulator
) -> None:
    outcome = provider(secret="wrong").send_raw(raw_message())
    assert outcome.kind is SendKind.REJECTED and not outcome.transient
    assert "invalid_client" in outcome.reason
    assert graph.requests == []


def test_an_unreachable_authority_is_transient(
    provider: ProviderFactory, graph: GraphEmulator, unused_url: str
) -> None:
    authority = unused_url.replace("http://", "https://")
    outcome = provider(authority=authority).send_raw(raw_message())
    assert outcome.kind is SendKind.REJECTED and outcome.transient
    assert graph.requests == []


def test_a_refused_token_is_dropped_and_the_next_send_gets_a_new_one(
    provider: ProviderFactory, graph: GraphEmulator, accept_log: Path
) -> None:
    graph_provider = provider()
    assert graph_provider.send_raw(raw_message("<first@x>")).kind is SendKind.CONFIRMED
    graph.expire_tokens()
    outcome = graph_provider.send_raw(raw_message())
    assert outcome.kind is SendKind.REJECTED and outcome.transient and outcome.status == 401
    assert graph_provider.send_raw(raw_message()).kind is SendKind.CONFIRMED
    assert logged_copies(accept_log) == 1
    assert [r["status"] for r in graph.token_requests] == [200, 200]


def test_a_certificate_credential_gets_a_token(
    provider: ProviderFactory, graph: GraphEmulator, tmp_path: Path
) -> None:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "sendledger test app")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + dt.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    pem = tmp_path / "app.pem"
    pem.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        + cert.public_bytes(serialization.Encoding.PEM)
    )
    outcome = provider(secret=read_certificate(pem)).send_raw(raw_message())
    assert outcome.kind is SendKind.CONFIRMED
    assert [r.get("credential") for r in graph.token_requests] == ["assertion"]


def test_remembered_drafts_are_bounded_and_dropped_once_confirmed(
    provider: ProviderFactory, graph: GraphEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    graph_provider = provider(confirm_wait=1.0)
    mailbox = graph_provider.mailbox(MAILBOX)
    assert graph_provider.send_raw(raw_message()).kind is SendKind.CONFIRMED
    assert mailbox.drafts(MID) == []
    monkeypatch.setattr(graph_module, "REMEMBERED_DRAFTS", 1)
    graph.set_file_delay(30)
    unknown = provider(confirm_wait=0.0)
    for message_id in ("<u1@x>", "<u2@x>"):
        assert unknown.send_raw(raw_message(message_id)).kind is SendKind.UNKNOWN
    box = unknown.mailbox(MAILBOX)
    assert box.drafts("<u1@x>") == [] and len(box.drafts("<u2@x>")) == 1


@pytest.mark.parametrize(("limit", "refused"), [(4, False), (8, True)])
def test_max_concurrent_keeps_a_mailbox_within_graphs_limit(
    provider: ProviderFactory, graph: GraphEmulator, accept_log: Path, limit: int, refused: bool
) -> None:
    """Graph answers a fifth request in flight for one mailbox 429 (MailboxConcurrency):
    `max_concurrent = 4` never gets one; 8 does, and each such send is a transient
    rejection, never a copy."""
    graph.latency = 0.15
    graph_provider = provider(max_concurrent=limit, confirm_wait=2.0)
    ids = [f"<c{n}@x>" for n in range(16)]
    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        outcomes = list(pool.map(lambda m: graph_provider.send_raw(raw_message(m)), ids))
    kinds = {outcome.kind for outcome in outcomes}
    assert graph.peak_in_flight[MAILBOX] <= 4
    if refused:
        assert graph.concurrency_refusals > 0 and SendKind.REJECTED in kinds
        assert all(o.transient for o in outcomes if o.kind is SendKind.REJECTED)
    else:
        assert graph.concurrency_refusals == 0 and kinds == {SendKind.CONFIRMED}
    confirmed = {m for m, o in zip(ids, outcomes, strict=True) if o.kind is SendKind.CONFIRMED}
    assert {m for m in ids if logged_copies(accept_log, m) == 1} >= confirmed
    assert all(logged_copies(accept_log, m) <= 1 for m in ids)


def test_a_draft_left_by_a_rejected_send_is_tidied_by_the_next_attempt(
    provider: ProviderFactory, relay: FaultRelay, graph: GraphEmulator, accept_log: Path
) -> None:
    graph_provider = provider()
    graph_provider.search("<warm-up@x>")  # discovery and token first: "other" is ours now
    # The send is throttled and deleting its draft fails: the draft stays behind.
    relay.set_plan(FaultPlan(send=["429"], other=["pass", "fail-before-forward"]))
    outcome = graph_provider.send_raw(raw_message())
    assert outcome.kind is SendKind.REJECTED and outcome.transient
    assert len(graph.folder(MAILBOX, "drafts")) == 1
    relay.set_plan(FaultPlan())
    assert graph_provider.send_raw(raw_message()).kind is SendKind.CONFIRMED
    assert graph.folder(MAILBOX, "drafts") == []
    assert logged_copies(accept_log) == 1


def test_a_draft_a_late_send_takes_while_the_next_attempt_tidies_it_is_no_second_copy(
    provider: ProviderFactory, relay: FaultRelay, graph: GraphEmulator, accept_log: Path
) -> None:
    """The next attempt reads the earlier draft (still a draft) and deletes it; a stalled
    send of that draft lands just before the DELETE. The attempt must not go on to create
    and send another: Unknown, one copy, kept in Sent Items."""
    graph_provider = provider()
    graph_provider.search("<warm-up@x>")  # discovery and token first: "other" is ours now
    relay.set_plan(FaultPlan(send=["429"], other=["pass", "fail-before-forward"]))
    assert graph_provider.send_raw(raw_message()).kind is SendKind.REJECTED
    [draft] = graph.folder(MAILBOX, "drafts")
    relay.set_plan(FaultPlan())
    graph.late_send_on_delete.add(draft["id"])
    outcome = graph_provider.send_raw(raw_message())
    assert outcome.kind is SendKind.UNKNOWN, outcome
    assert logged_copies(accept_log) == 1
    assert [m["id"] for m in graph.folder(MAILBOX, "sentitems")] == [draft["id"]]
    assert graph_provider.search(MID).copies == [draft["id"]]


@pytest.mark.parametrize(("mode", "copies"), [("drop-response", 1), ("fail-before-forward", 0)])
def test_a_reset_instead_of_a_close_is_still_unknown(
    provider: ProviderFactory, relay: FaultRelay, accept_log: Path, mode: Mode, copies: int
) -> None:
    relay.reset = True  # ECONNRESET rather than end-of-stream
    relay.set_plan(FaultPlan(send=[mode]))
    outcome = provider().send_raw(raw_message())
    assert outcome.kind is SendKind.UNKNOWN, outcome
    assert relay_sends(relay) == 1 and logged_copies(accept_log) == copies


def test_ssl_cert_file_alone_is_trusted_by_msal_and_the_graph_calls(
    relay: FaultRelay, tls: TlsFiles, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):  # requests would prefer these
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SSL_CERT_FILE", str(tls.ca_file))
    tokens = GraphTokens(
        authority=relay.url,
        tenant_id=DEFAULT_TENANT,
        client_id=DEFAULT_CLIENT_ID,
        credential=DEFAULT_CLIENT_SECRET,
        timeout=5.0,
        ca_bundle=trusted_ca_bundle(),
    )
    graph_provider = GraphProvider(
        "graph",
        tokens=tokens,
        user=MAILBOX,
        api_endpoint=relay.url + "/v1.0",
        ca_certs=trusted_ca_bundle(),
        timeout=TIMEOUT,
    )
    try:
        assert graph_provider.send_raw(raw_message()).kind is SendKind.CONFIRMED
    finally:
        graph_provider.close()


# -- bounces (docs/providers.md "Bounces") ------------------------------------------------


def test_exchanges_report_is_recorded_once_and_forgeries_on_no_job(
    provider: ProviderFactory, graph: GraphEmulator, tmp_path: Path
) -> None:
    """Exchange's non-delivery report of a bounced recipient lands in the sender's Inbox
    (class REPORT.IPM.Note.NDR); forged reports are filed there as reports too. Two
    mailboxes of one provider (`user = "{from}"`): a report in one naming the other's job
    is refused."""
    graph.bounce = {"@gone.example": "exchange"}
    other = "other@example.com"

    def watching(channel: str, sender: str) -> ChannelPolicy:
        return ChannelPolicy.model_validate(
            {
                "channel": channel,
                "provider": "graph",
                "from": sender,
                "message_id_domain": "mail.example.com",
                "watch_bounces": "1h",
            }
        )

    run_bounce_checks(
        tmp_path,
        Mailboxes(
            providers={"graph": provider(user="{from}", confirm_wait=3.0)},
            policies=[watching("mail", MAILBOX), watching("other", other)],
            mailbox=MAILBOX,
            gone="nobody@gone.example",
            ok="customer@example.net",
            deliver=lambda raw: graph.inject(raw, user=MAILBOX, message_class=NDR_CLASS),
            bounce_arrived=lambda: bool(graph.folder(MAILBOX, "inbox")),
        ),
    )


def test_a_mailbox_with_more_reports_than_one_read_lists_is_read_over_several(
    provider: ProviderFactory, graph: GraphEmulator
) -> None:
    """5,001 non-delivery reports in the window: more pages (of 100) than one listing
    follows. A read lists its pages and says it is incomplete, instead of failing; the
    next goes on from the page where it stopped, and together they list every report once
    (each too large to download here: the listing alone is under test)."""
    reports = 5_001
    report = rfc3464_report(raw_message(), mailbox=MAILBOX, recipient="nobody@gone.example")
    for _ in range(reports):
        graph.inject(report, user=MAILBOX, message_class=NDR_CLASS)
    graph_provider = provider()
    since = dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)
    found: list[str] = []
    for _ in range(3):
        read = graph_provider.read_reports(since, known=found, max_bytes=0, limit=10_000)
        found += [f.provider_id for f in read.found]
        if read.complete:
            break
    assert read.complete
    assert len(found) == len(set(found)) == reports
    assert sorted(read.listed) == sorted(found)


def inject_reports(graph: GraphEmulator, count: int) -> None:
    """`count` non-delivery reports in the mailbox's Inbox, each of another job's copy."""
    for n in range(count):
        report = rfc3464_report(
            raw_message(f"<job-{n:032x}@mail.example.com>"),
            mailbox=MAILBOX,
            recipient="nobody@gone.example",
        )
        graph.inject(report, user=MAILBOX, message_class=NDR_CLASS)


def test_a_report_read_whose_scope_moved_makes_no_further_call_and_goes_on_later(
    provider: ProviderFactory, graph: GraphEmulator, relay: FaultRelay
) -> None:
    """A read asks before each call whether the mailbox's quota scope is still the
    daemon's (`may_go_on`): once it is not, no report is downloaded (two daemons reading
    one mailbox, over its request limit) and the read says it is incomplete; the next
    read goes on with the same listing, not listing again."""
    inject_reports(graph, 3)
    graph_provider = provider()
    since = dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)
    asked = 0

    def ours_for_one_call() -> bool:
        nonlocal asked
        asked += 1
        return asked <= 1

    before = len(relay.log)
    stopped = graph_provider.read_reports(
        since, known=(), max_bytes=2**21, limit=50, may_go_on=ours_for_one_call
    )
    assert not stopped.complete and len(stopped.listed) == 3 and stopped.found == ()
    made = [e["path"] for e in relay.log[before:] if "/users/" in e["path"]]
    assert len(made) == 1 and "/mailFolders/inbox/messages?" in made[0], made
    rest = graph_provider.read_reports(since, known=(), max_bytes=2**21, limit=50)
    assert rest.complete and len(rest.found) == 3
    made = [e["path"] for e in relay.log[before:] if "/users/" in e["path"]]
    assert len(made) == 4 and all("/$value" in p for p in made[1:]), made


def test_a_report_read_refused_after_its_listing_says_it_got_on(
    provider: ProviderFactory, graph: GraphEmulator, relay: FaultRelay
) -> None:
    """A read lists the mailbox, then its first download is refused (429): the listing is
    kept for the next read, and the refusal says the read got on (`progressed`, which the
    engine counts against the watches' unread bound). The next read, refused at its first
    download again, listed and read nothing new: no progress."""
    report = rfc3464_report(raw_message(), mailbox=MAILBOX, recipient="nobody@gone.example")
    graph.inject(report, user=MAILBOX, message_class=NDR_CLASS)
    graph_provider = provider()
    since = dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)
    # Its token first (the authority's discovery goes by the relay's "other" lane too).
    graph_provider.read_reports(since, known=(), max_bytes=2**21, limit=0)
    graph_provider.forget_report_reads()
    relay.set_plan(FaultPlan(other=["429", "429"]))
    progressed = []
    for _ in range(2):
        with pytest.raises(ProviderError) as refused:
            graph_provider.read_reports(since, known=(), max_bytes=2**21, limit=50)
        assert refused.value.unavailable
        progressed.append(refused.value.progressed)
    assert progressed == [True, False]
    assert len(graph_provider.report_listings) == 1
    relay.set_plan(FaultPlan())
    read = graph_provider.read_reports(since, known=(), max_bytes=2**21, limit=50)
    assert read.complete and len(read.found) == 1


def test_reports_downloaded_before_a_refused_download_are_kept_and_not_downloaded_again(
    provider: ProviderFactory, graph: GraphEmulator, relay: FaultRelay
) -> None:
    """Three reports; each read is refused (429) at a later download than the last: the
    reports downloaded before a refusal are kept for the next read, which counts them as
    progress (`progressed`: the engine keeps the mailbox's watches while its reads get
    on) and hands them out without downloading them again. Every report is downloaded
    once, not once per refused read."""
    inject_reports(graph, 3)
    graph_provider = provider()
    since = dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)
    graph_provider.search("<warm-up@x>")  # discovery and token first: "other" is ours now
    before = len(relay.log)
    # Each read gets one download before its refusal (the listing passes, by the relay's
    # "search" lane): the first lists too, the second goes on with the listing kept.
    progressed = []
    for _ in range(2):
        relay.set_plan(FaultPlan(other=["pass", "429"]))
        with pytest.raises(ProviderError) as refused:
            graph_provider.read_reports(since, known=(), max_bytes=2**21, limit=50)
        assert refused.value.unavailable
        progressed.append(refused.value.progressed)
    assert progressed == [True, True]
    relay.set_plan(FaultPlan())
    read = graph_provider.read_reports(since, known=(), max_bytes=2**21, limit=50)
    assert read.complete and len(read.found) == 3
    assert all(found.raw for found in read.found)
    downloads = [
        e["path"]
        for e in relay.log[before:]
        if e["path"].endswith("/$value") and e["mode"] == "pass"
    ]
    assert len(downloads) == len(set(downloads)) == 3, downloads
    assert len(graph_provider.report_listings) == 0


def test_a_stopped_report_read_forgotten_lists_afresh(
    provider: ProviderFactory, graph: GraphEmulator, relay: FaultRelay
) -> None:
    """The engine reads the mailbox no more (its channel was removed by a reload): the
    listing a stopped read kept is dropped (`forget_report_reads`), not kept for ever, and
    a read made later lists the mailbox again from its first page."""
    report = rfc3464_report(raw_message(), mailbox=MAILBOX, recipient="nobody@gone.example")
    graph.inject(report, user=MAILBOX, message_class=NDR_CLASS)
    graph_provider = provider()
    since = dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)
    before = len(relay.log)
    # Listed, but over the caller's limit: the listing is kept for the next read.
    stopped = graph_provider.read_reports(since, known=(), max_bytes=2**21, limit=0)
    assert not stopped.complete and len(graph_provider.report_listings) == 1
    graph_provider.forget_report_reads()
    assert len(graph_provider.report_listings) == 0
    again = graph_provider.read_reports(since, known=(), max_bytes=2**21, limit=50)
    assert again.complete and len(again.found) == 1
    lists = [e["path"] for e in relay.log[before:] if "/mailFolders/inbox/messages?" in e["path"]]
    assert len(lists) == 2, lists  # the first read's page 1, and again after the drop


def test_a_search_whose_scope_moved_makes_no_further_call(
    provider: ProviderFactory, relay: FaultRelay, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One search is several calls (every page of Sent Items, then Deleted Items): it asks
    before each whether the mailbox's quota scope is still the daemon's (`calls_while`,
    set by the engine). Once it is not, it stops there with no answer (ScopeLost, never
    the hits of the pages read: a miss), and the rest is left to the scope's new owner,
    whose calls would otherwise interleave with these over the mailbox's limit."""
    graph_provider = provider()
    for _ in range(3):
        graph_provider.send_raw(raw_message())
    monkeypatch.setattr(graph_module, "PAGE_SIZE", 2)
    before = len(relay.log)
    with calls_while(asked_at_most(1)), pytest.raises(ScopeLost):
        graph_provider.search(MID)
    made = [e["path"] for e in relay.log[before:] if "/users/" in e["path"]]
    assert len(made) == 1 and "/mailFolders/sentitems/messages?" in made[0], made
    assert len(graph_provider.search(MID).hits) == 3  # whole, for the new owner


def test_a_draft_deletion_whose_scope_moved_fences_no_further_draft(
    provider: ProviderFactory, relay: FaultRelay, graph: GraphEmulator
) -> None:
    """Deleting a message's drafts is several calls (Drafts and Deleted Items listed, each
    draft fenced with a DELETE and reads): asked before each listing and each draft's
    fence, not inside one (stopped there, a draft would be left in Deleted Items, still
    sendable). Once the scope moved, the drafts not fenced yet are left to its new owner."""
    graph_provider = provider()
    first = graph.inject_draft(raw_message(), user=MAILBOX)
    second = graph.inject_draft(raw_message(), user=MAILBOX)
    before = len(relay.log)
    # The two listings and the first draft's fence.
    with calls_while(asked_at_most(3)), pytest.raises(ScopeLost):
        graph_provider.delete_drafts(MID)
    [left] = [d["id"] for d in graph.folder(MAILBOX, "drafts")]
    [fenced] = {first, second} - {left}
    deletes = [e["path"] for e in relay.log[before:] if e["method"] == "DELETE"]
    assert deletes and all(quote(fenced, safe="") in path for path in deletes), deletes
    assert graph_provider.delete_drafts(MID) == [left]  # the new owner's
    assert graph.folder(MAILBOX, "drafts") == [] and graph.folder(MAILBOX, "deleteditems") == []


def test_a_report_received_before_the_jobs_first_attempt_is_refused(
    provider: ProviderFactory, graph: GraphEmulator, tmp_path: Path
) -> None:
    """A forger who guessed a job's key mails its report before the job is sent: Graph's
    receivedDateTime of it is older than the job's first attempt, so it is refused; the
    same report received after the attempt is recorded."""
    policy = ChannelPolicy.model_validate(
        {
            "channel": "mail",
            "provider": "graph",
            "from": MAILBOX,
            "message_id_domain": "mail.example.com",
            "watch_bounces": "1h",
        }
    )
    run_report_before_send_check(
        tmp_path,
        Mailboxes(
            providers={"graph": provider(user="{from}", confirm_wait=3.0)},
            policies=[policy],
            mailbox=MAILBOX,
            gone="nobody@gone.example",
            ok="customer@example.net",
            deliver=lambda raw: graph.inject(raw, user=MAILBOX, message_class=NDR_CLASS),
            bounce_arrived=lambda: True,
        ),
        lambda raw, at: graph.inject(raw, user=MAILBOX, message_class=NDR_CLASS, received=at),
    )


def test_a_report_received_just_before_the_watch_s_end_is_recorded_when_read_after_it(
    provider: ProviderFactory, graph: GraphEmulator, tmp_path: Path
) -> None:
    """Graph's receivedDateTime of the report is 10 s before the watch's end; the engine
    reads it only after that end: it is recorded, then the watch ends."""
    policy = ChannelPolicy.model_validate(
        {
            "channel": "mail",
            "provider": "graph",
            "from": MAILBOX,
            "message_id_domain": "mail.example.com",
            "watch_bounces": "1h",
        }
    )
    run_report_at_the_watch_s_end_check(
        tmp_path,
        Mailboxes(
            providers={"graph": provider(user="{from}", confirm_wait=3.0)},
            policies=[policy],
            mailbox=MAILBOX,
            gone="nobody@gone.example",
            ok="customer@example.net",
            deliver=lambda raw: graph.inject(raw, user=MAILBOX, message_class=NDR_CLASS),
            bounce_arrived=lambda: True,
        ),
        lambda raw, at: graph.inject(raw, user=MAILBOX, message_class=NDR_CLASS, received=at),
    )


@pytest.mark.parametrize("refusal", ["429", "503"])
def test_a_refusal_answered_after_graph_sent_the_draft_is_not_proven_by_a_delete(
    provider: ProviderFactory,
    relay: FaultRelay,
    graph: GraphEmulator,
    accept_log: Path,
    refusal: Mode,
) -> None:
    """The send of the draft reaches Graph, which sends it and files the copy (no filing
    delay), and the answer that comes back is a 429 / 503 with Retry-After (from a gateway
    in front). The provider deletes the draft to prove the refusal; but under its
    immutable id the item is now the sent copy in Sent Items, and the DELETE removes
    that copy (204). A 2xx DELETE proves nothing about an item that is no draft: the
    outcome must not be "not sent" (a resend would mail the customer twice), and the
    sent copy must not be deleted."""
    graph_provider = provider()
    graph_provider.search("<warm-up@x>")  # discovery and token first
    relay.refuse_after_forward("send", refusal)
    outcome = graph_provider.send_raw(raw_message())
    assert logged_copies(accept_log) == 1  # Graph sent it
    assert outcome.kind is SendKind.UNKNOWN, outcome
    assert len(graph.folder(MAILBOX, "sentitems")) == 1, "the sent copy was deleted"
    assert len(graph_provider.search(MID).copies) == 1


def test_a_draft_a_person_edited_is_never_what_a_send_sends(
    provider: ProviderFactory, graph: GraphEmulator, accept_log: Path
) -> None:
    """Graph sends only the draft its send has just created (docs/providers.md "Gmail
    setup" says why it needs no read-back): a draft with the job's
    Message-ID that a person edited in the mailbox (left by an earlier process) is not
    the one sent, whatever it says."""
    edited = raw_message().replace(b"customer@example.net", b"mallory@evil.example")
    left = graph.inject_draft(edited, user=MAILBOX)
    outcome = provider().send_raw(raw_message())
    assert outcome.kind is SendKind.CONFIRMED, outcome
    [entry] = graph.accepted()
    assert entry["id"] != left and entry["to"] == "customer@example.net"
    assert logged_copies(accept_log) == 1


def test_a_fenced_draft_cannot_be_sent_by_a_late_call(
    provider: ProviderFactory, graph: GraphEmulator, accept_log: Path
) -> None:
    """Graph's DELETE moves a draft to Deleted Items, where it is still a draft that a send
    by its immutable id sends. The fence deletes it for good: a stalled attempt's send of
    it, landing after the fence, finds nothing to send (the count after the fence is
    final)."""
    graph_provider = provider()
    draft = graph.inject_draft(raw_message(), user=MAILBOX)
    assert graph_provider.delete_drafts(MID) == [draft]
    assert graph.send_draft(MAILBOX, draft) == 404
    assert logged_copies(accept_log) == 0
    assert graph.folder(MAILBOX, "drafts") == [] and graph.folder(MAILBOX, "deleteditems") == []


def test_a_late_send_landing_before_the_fence_s_delete_keeps_its_copy_counted(
    provider: ProviderFactory, graph: GraphEmulator, accept_log: Path
) -> None:
    """The fence read the draft (still a draft), then a stalled attempt's send of it landed
    before the DELETE: under its immutable id the item the DELETE moved is the sent copy.
    It is put back in Sent Items, not counted as a deleted draft, and the search counts it
    (a resend would mail the customer twice)."""
    graph_provider = provider()
    draft = graph.inject_draft(raw_message(), user=MAILBOX)
    graph.late_send_on_delete.add(draft)
    assert graph_provider.delete_drafts(MID) == []
    assert logged_copies(accept_log) == 1
    assert [m["id"] for m in graph.folder(MAILBOX, "sentitems")] == [draft]
    assert graph.folder(MAILBOX, "deleteditems") == []
    assert graph_provider.search(MID).copies == [draft]


def test_a_late_send_landing_before_the_second_delete_keeps_its_copy_counted(
    provider: ProviderFactory, graph: GraphEmulator, accept_log: Path
) -> None:
    """The draft was moved to Deleted Items and read back as a draft; a stalled attempt's
    send of it landed before the DELETE that is for good, and Graph filed the copy in Sent
    Items: that DELETE moved the sent copy. It is put back and counted, not deleted."""
    graph_provider = provider()
    draft = graph.inject_draft(raw_message(), user=MAILBOX)
    graph.late_send_before_purge.add(draft)
    assert graph_provider.delete_drafts(MID) == []
    assert logged_copies(accept_log) == 1
    assert [m["id"] for m in graph.folder(MAILBOX, "sentitems")] == [draft]
    assert graph_provider.search(MID).copies == [draft]


def test_a_draft_a_late_send_took_under_the_fence_is_read_again_by_the_search_after_it(
    provider: ProviderFactory, graph: GraphEmulator, accept_log: Path
) -> None:
    """The fence read the draft (a draft), a stalled attempt's send of it landed before the
    DELETE, and the copy was in transit: the DELETE is answered 404. The search right after
    the fence takes what the fence read (`Fenced.read`), but not this draft: its copy, filed
    by then, is found by its immutable id while `$filter` shows nothing. Handed on as
    deleted, or as read (gone), that copy was missed and a resend would mail it twice; no
    test held this (the late-send rule of docs/architecture.md "Microsoft Graph")."""
    graph.set_lag(3600)  # `$filter` shows no copy: only the read by id counts it
    graph.set_file_delay(0.2)
    graph_provider = provider()
    draft = graph.inject_draft(raw_message(), user=MAILBOX)
    graph.late_send_on_delete.add(draft)
    fenced = fence_job(graph_provider, MID, [draft])
    assert fenced.deleted == [] and draft not in fenced.read, fenced
    assert logged_copies(accept_log) == 1
    deadline = time.monotonic() + 5
    while not graph.folder(MAILBOX, "sentitems") and time.monotonic() < deadline:
        time.sleep(0.05)  # the copy filed
    assert search_job(graph_provider, MID, [draft], fenced).copies == [draft]


@pytest.mark.parametrize("refusal", ["429", "503"])
def test_a_refusal_whose_draft_could_not_be_read_is_never_sent_again_once_it_was_sent(
    provider: ProviderFactory,
    relay: FaultRelay,
    graph: GraphEmulator,
    accept_log: Path,
    refusal: Mode,
) -> None:
    """As above, but the read of the draft that would prove the refusal is refused too
    (throttled with the send): the refusal stands unproven, and the engine tries again.
    That next attempt must not send a second copy: it reads the earlier draft first, and
    one that is no draft any more was sent, so it sends nothing and leaves the job to the
    search (Unknown), which finds that copy by its immutable id."""
    graph_provider = provider()
    graph_provider.search("<warm-up@x>")  # discovery and token first
    relay.refuse_after_forward("send", refusal)
    relay.set_plan(FaultPlan(search=["503"]))  # the read of the draft after the refusal
    first = graph_provider.send_raw(raw_message())
    assert logged_copies(accept_log) == 1  # Graph sent it
    assert first.kind is SendKind.REJECTED and first.transient, first
    second = graph_provider.send_raw(raw_message())  # the retry after the backoff
    assert logged_copies(accept_log) == 1, "sent twice"
    assert second.kind is SendKind.UNKNOWN, second
    assert len(graph_provider.search(MID).copies) == 1
    assert len(graph.folder(MAILBOX, "sentitems")) == 1


# -- a send's calls after its start ask for the scope too ----------------------------------


def _calls_after(relay: FaultRelay, before: int) -> list[tuple[str, str]]:
    return [(e["method"], e["path"]) for e in relay.log[before:] if "/users/" in e["path"]]


def test_a_send_whose_scope_moved_stops_reading_its_copy_back(
    provider: ProviderFactory, relay: FaultRelay, graph: GraphEmulator, accept_log: Path
) -> None:
    """After the 202 the send reads the draft's immutable id until the copy is filed (one
    read per POLL_INTERVAL for up to `confirm_wait`): it asks before each read whether
    the scope is still the daemon's. Once it is not, it stops there: Unknown (never a
    refusal: the send was made), which the new owner's search settles."""
    graph.set_file_delay(1.0)
    graph_provider = provider(confirm_wait=3.0)
    graph_provider.search("<warm-up@x>")  # discovery and token first
    before = len(relay.log)
    with calls_while(asked_at_most(1)):
        outcome = graph_provider.send_raw(raw_message())
    assert outcome.kind is SendKind.UNKNOWN and "another daemon" in outcome.reason, outcome
    made = _calls_after(relay, before)
    reads = [path for method, path in made if method == "GET"]
    assert [m for m, _ in made].count("POST") == 2 and len(reads) == 1, made  # create, send
    assert logged_copies(accept_log) == 1
    time.sleep(1.1)  # filed
    assert len(provider().delete_drafts(MID)) == 0
    assert len(graph_provider.search(MID).hits) == 1  # the owner's search finds it


def test_a_refusal_whose_scope_moved_is_not_proven_and_left_unknown(
    provider: ProviderFactory, relay: FaultRelay, graph: GraphEmulator, accept_log: Path
) -> None:
    """A throttled send's refusal is proven by reading its draft and deleting it. Asked
    first: the scope gone, no proof is made and the outcome is Unknown, not the refusal:
    the next attempt is the new owner's, which does not remember this draft and would
    not tidy it; its sweep fences the message's drafts (this one) and then searches."""
    graph_provider = provider()
    graph_provider.search("<warm-up@x>")  # discovery and token first
    relay.set_plan(FaultPlan(send=["429"]))
    before = len(relay.log)
    with calls_while(asked_at_most(0)):
        outcome = graph_provider.send_raw(raw_message())
    assert outcome.kind is SendKind.UNKNOWN and "not proven" in outcome.reason, outcome
    assert [m for m, _ in _calls_after(relay, before)] == ["POST", "POST"]  # create, send
    assert len(graph.folder(MAILBOX, "drafts")) == 1
    relay.set_plan(FaultPlan())
    owner = provider()
    assert len(owner.delete_drafts(MID)) == 1 and owner.search(MID).hits == ()
    assert logged_copies(accept_log) == 0


def test_a_send_whose_scope_moved_during_its_tidy_creates_nothing(
    provider: ProviderFactory, relay: FaultRelay, graph: GraphEmulator, accept_log: Path
) -> None:
    """The next attempt tidies an earlier attempt's draft first (a read, a fence), then
    creates and sends. Asked before the tidy's read and before the create: the scope
    gone, nothing is created or sent (Rejected, transient, and no attempt: the engine
    does not count it against the policy's `max_attempts`) and the draft is left to the
    new owner's fence."""
    graph_provider = provider()
    graph_provider.search("<warm-up@x>")  # discovery and token first: "other" is ours now
    relay.set_plan(FaultPlan(send=["429"], other=["pass", "fail-before-forward"]))
    assert graph_provider.send_raw(raw_message()).kind is SendKind.REJECTED
    relay.set_plan(FaultPlan())
    for asks in (0, 1):  # stopped before the tidy's read; after the tidy, before the create
        before = len(relay.log)
        with calls_while(asked_at_most(asks)):
            outcome = graph_provider.send_raw(raw_message())
        assert outcome.kind is SendKind.REJECTED and outcome.transient, outcome
        assert not outcome.unavailable and "another daemon" in outcome.reason
        assert outcome.not_attempted  # no attempt: not counted against max_attempts
        assert "POST" not in [m for m, _ in _calls_after(relay, before)]
        assert logged_copies(accept_log) == 0
    assert graph.folder(MAILBOX, "drafts") == []  # the tidy of the second try fenced it
    assert graph_provider.send_raw(raw_message()).kind is SendKind.CONFIRMED
    assert logged_copies(accept_log) == 1


def test_the_fence_deletes_only_drafts_whose_message_id_is_exactly_ours(
    provider: ProviderFactory, graph: GraphEmulator, accept_log: Path
) -> None:
    """The `$filter`'s match is the server's, looser than ours where Exchange compares
    strings without case: a person's draft whose Message-ID differs from the job's in its
    local part's case is another message. The fence deletes the job's own draft and
    leaves that one, as the search does not count its copy."""
    graph.filter_ignores_case = True
    other_id = MID.replace("aabbccddeeff", "AABBCCDDEEFF")
    theirs = graph.inject_draft(raw_message(other_id), user=MAILBOX)
    ours = graph.inject_draft(raw_message(), user=MAILBOX)
    graph_provider = provider()
    assert graph_provider.delete_drafts(MID) == [ours]
    assert [m["id"] for m in graph.folder(MAILBOX, "drafts")] == [theirs]
    assert graph.send_draft(MAILBOX, theirs) == 202
    found = graph_provider.search(MID)
    assert found.hits == () and found.complete, found


def _draft_of_a_send_never_made(rig: Any, relay: FaultRelay, graph: GraphEmulator) -> str:
    """Job k1 submitted on the rig (an `EngineRig`) and its send's request lost before it
    reached Graph (Unknown): the id of the draft its send made and left in Drafts."""
    rig.submit("receipts", "k1")
    relay.set_plan(FaultPlan(send=["fail-before-forward"]))
    assert rig.tick().unknown == 1
    relay.set_plan(FaultPlan())
    [left] = [m["id"] for m in graph.folder(MAILBOX, "drafts")]
    return str(left)


def test_a_new_owner_fences_the_draft_a_replaced_daemon_made_by_its_recorded_id(
    provider: ProviderFactory, graph: GraphEmulator, relay: FaultRelay, accept_log: Path
) -> None:
    """Daemon `a` claims the job and its Graph send creates the draft; the send request
    never reaches Graph (Unknown) and `a` is replaced by `b`, which takes the mailbox.
    `b`'s provider never made that draft, and `$filter` does not show it yet (its index
    lags): before, `b`'s fence deleted nothing and left the draft in Drafts, one click from
    a copy the search had already counted as missing. The draft's immutable id is
    recorded with the claim, so `b` fences it by that id whatever the index shows."""
    from tests.unit.engine_rig import EngineRig, policy

    from daemon.doubles.fake_provider import FakeProvider
    from ledger.job import DRAFTS_FENCE, SendJob

    graph.set_lag(3600)  # `$filter` shows neither the draft nor any copy
    a, b = provider(), provider()
    with EngineRig(
        policy("receipts", on_unknown="retry"), provider=lambda clock: cast(FakeProvider, a)
    ) as rig:
        left = _draft_of_a_send_never_made(rig, relay, graph)
        rig.engine.close()  # `a` is gone; `b` starts with nothing remembered
        rig.provider = cast(FakeProvider, b)
        rig.engine = rig.new_engine("b")
        rig.advance_and_tick(60)  # search_after: `b`'s sweep fences, then searches
        fences = [
            e for e in rig.ledger.history("k1")
            if isinstance(e, SendJob.DraftsDeleted) and e.why == DRAFTS_FENCE
        ]  # fmt: skip
        assert [list(e.draft_ids) for e in fences] == [[left]], rig.events("k1")
    assert graph.folder(MAILBOX, "drafts") == [] and graph.folder(MAILBOX, "deleteditems") == []
    assert graph.send_draft(MAILBOX, left) == 404  # a person's click sends nothing
    assert logged_copies(accept_log) == 0


class _ClaimedMeanwhile(GraphProvider):
    """Runs `meanwhile` once, before its first draft's create answers (another daemon's
    claim of the job, at that moment)."""

    meanwhile: Callable[[], object] | None = None

    def make_draft_in(self, *args: Any) -> str | SendOutcome:
        made = super().make_draft_in(*args)
        hook, self.meanwhile = self.meanwhile, None
        if hook is not None:
            hook()
        return made


def test_a_claim_that_lost_its_race_deletes_the_draft_made_for_it(
    provider: ProviderFactory, graph: GraphEmulator, accept_log: Path
) -> None:
    """The draft is made before the claim: daemon `a` made its draft, and `b` claimed and
    sent the job meanwhile. `a`'s claim conflicts and is not saved, so its draft is
    recorded nowhere: `a` deletes it at once, by its id, and only that one (`b`'s sent
    copy stays). Left, it would wait in Drafts, one click from a second copy."""
    from tests.unit.engine_rig import EngineRig, policy

    from daemon.doubles.fake_provider import FakeProvider
    from ledger.vocabulary import JobState

    a = cast(_ClaimedMeanwhile, provider(kind=_ClaimedMeanwhile))
    with EngineRig(
        policy("receipts", on_unknown="retry"), provider=lambda clock: cast(FakeProvider, a)
    ) as rig:
        message_id = rig.submit("receipts", "k1")
        rig.provider = cast(FakeProvider, provider())
        b = rig.new_engine("b")
        a.meanwhile = lambda: b.tick()
        rig.tick()
        assert rig.job("k1").state is JobState.CONFIRMED, rig.events("k1")
        assert rig.events("k1").count("Attempted") == 1
    assert graph.folder(MAILBOX, "drafts") == [] and graph.folder(MAILBOX, "deleteditems") == []
    assert logged_copies(accept_log, message_id) == 1


def test_a_stop_asked_while_the_worker_flushes_before_the_create_makes_no_draft(
    provider: ProviderFactory,
    graph: GraphEmulator,
    accept_log: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The Graph create is made before the claim, after the worker reads the job's row and
    commits the outcomes left for the next commit (a flush that may wait behind a held
    row): a stop asked meanwhile starts no call (docs/operations.md "Stopping"). Before,
    the create went out after the signal, a call of the provider's whole timeout that a
    shorter `daemon.stop_timeout` ends the process under, leaving a draft no claim
    records. Now no draft and no claim: the next run sends the job, once."""
    from tests.unit.engine_rig import EngineRig, policy

    from daemon.doubles.fake_provider import FakeProvider
    from daemon.engine import dispatch
    from ledger.vocabulary import JobState

    a = provider()
    with EngineRig(policy("receipts"), provider=lambda clock: cast(FakeProvider, a)) as rig:
        message_id = rig.submit("receipts", "k1")
        moved = dispatch._moved_since_loaded

        def stopped_meanwhile(work: Any) -> bool:
            rig.engine.stop()  # SIGTERM while the worker reads the row and flushes
            return moved(work)

        monkeypatch.setattr(dispatch, "_moved_since_loaded", stopped_meanwhile)
        rig.tick()
        assert graph.folder(MAILBOX, "drafts") == [], rig.events("k1")
        assert rig.events("k1") == ["Requested"]
        monkeypatch.setattr(dispatch, "_moved_since_loaded", moved)
        rig.restart()
        rig.tick()
        assert rig.job("k1").state is JobState.CONFIRMED, rig.events("k1")
    assert graph.folder(MAILBOX, "drafts") == []
    assert logged_copies(accept_log, message_id) == 1


def test_a_new_owner_counts_the_copy_a_replaced_daemon_s_recorded_draft_became(
    provider: ProviderFactory, graph: GraphEmulator, relay: FaultRelay, accept_log: Path
) -> None:
    """Daemon `a`'s send of its recorded draft is made and its answer lost (Unknown), and
    `a` is replaced by `b`, which takes the mailbox; the index lags, so `$filter` shows
    no copy. `b`'s fence reads that draft by the id its claim recorded and finds it no
    draft: a copy. Before, `b`'s search read by id only the drafts its own process made,
    missed, and a resend followed, stopped only by the next attempt's tidy (Unknown again,
    an attempt spent each round, a copy found in the end by review). Now the search reads
    the recorded draft by id too: confirmed at once, one copy."""
    from tests.unit.engine_rig import EngineRig, policy

    from daemon.doubles.fake_provider import FakeProvider
    from ledger.vocabulary import JobState

    graph.set_lag(3600)  # `$filter` shows neither the draft nor the copy
    a, b = provider(), provider()
    with EngineRig(
        policy("receipts", on_unknown="retry"), provider=lambda clock: cast(FakeProvider, a)
    ) as rig:
        message_id = rig.submit("receipts", "k1")
        relay.set_plan(FaultPlan(send=["drop-response"]))
        assert rig.tick().unknown == 1
        rig.engine.close()  # `a` is gone; `b` starts with nothing remembered
        rig.provider = cast(FakeProvider, b)
        rig.engine = rig.new_engine("b")
        rig.advance_and_tick(60)  # search_after: `b`'s sweep fences, then searches
        assert rig.job("k1").state is JobState.CONFIRMED, rig.events("k1")
        assert rig.events("k1").count("Attempted") == 1
    assert logged_copies(accept_log, message_id) == 1


class _HeldSend(GraphProvider):
    """Holds its next draft's send, the draft made and the claim saved, until `release`
    (`held` is set once it waits)."""

    held: threading.Event | None = None
    release = threading.Event()

    def send_made_in(self, *args: Any) -> SendOutcome:
        held, self.held = self.held, None
        if held is not None:
            held.set()
            assert self.release.wait(10)
        return super().send_made_in(*args)


def test_a_stale_resend_s_fence_deletes_no_draft_of_the_resend_saved_first(
    provider: ProviderFactory, graph: GraphEmulator, relay: FaultRelay, accept_log: Path
) -> None:
    """Bob's resend read the job in review; before its fence, Alice's resend was saved and
    the daemon made the next attempt's draft, its send about to go. Bob's fence, from a
    door with a provider of its own, listed that draft by `$filter` and deleted it before
    his save was refused: the send found its draft gone (Unknown) for a job nobody sent
    twice. Recorded on the version Bob read before any deletion, the fence is refused
    there and deletes nothing: the send goes out, one copy."""
    from tests.unit.engine_rig import EngineRig, policy
    from tests.unit.test_resend_fence import stale_resend_refused

    from daemon.doubles.fake_provider import FakeProvider
    from daemon.service_layer.services import ChannelPolicies, Services
    from ledger.vocabulary import JobState, Resolution

    a = cast(_HeldSend, provider(kind=_HeldSend))
    a.release = threading.Event()
    door_provider = provider()
    legal = policy("legal", on_unknown="review", search_after="60s")
    with EngineRig(legal, provider=lambda clock: cast(FakeProvider, a)) as rig:
        message_id = rig.submit("legal", "k1")
        relay.set_plan(FaultPlan(send=["fail-before-forward"]))
        rig.tick()
        assert rig.job("k1").state is JobState.REVIEW, rig.events("k1")
        relay.set_plan(FaultPlan())
        rig.clock.advance(61)

        def door(providers: Callable[[str], Any]) -> Services:
            return Services(rig.ledger, lambda: ChannelPolicies(rig.policies), providers=providers)

        held = threading.Event()

        @contextmanager
        def alice_first(_: str) -> Iterator[GraphProvider]:
            alice = door(lambda _: nullcontext(door_provider))
            alice.resolve("k1", Resolution.RESEND, note="not in Sent", by="alice")
            a.held = held
            rig.engine.hand_out()  # the next attempt: its draft made, its send held
            assert held.wait(10)
            assert len(graph.folder(MAILBOX, "drafts")) == 1
            yield door_provider

        def drafts() -> int:
            return len(graph.folder(MAILBOX, "drafts"))

        stale_resend_refused(rig, door(alice_first), a.release, drafts)
    assert logged_copies(accept_log, message_id) == 1


def test_a_persons_check_from_a_fresh_process_counts_the_copy_a_recorded_draft_became(
    provider: ProviderFactory, graph: GraphEmulator, relay: FaultRelay, accept_log: Path
) -> None:
    """The daemon's send of its recorded draft is made and its answer lost (Unknown, to
    review); the index lags, so `$filter` shows no copy. A person's `review check` from a
    command (a process of its own, which made no draft) searched by `$filter` alone and
    answered "no copy found", advising a resend, where the daemon's own search, reading
    that draft by the id its claim recorded, counted the copy. The check now searches as
    the daemon does (`search_job`): one copy, recorded."""
    from tests.unit.engine_rig import EngineRig, policy

    from daemon.doubles.fake_provider import FakeProvider
    from daemon.service_layer.services import ChannelPolicies, Services
    from ledger.vocabulary import JobState

    graph.set_lag(3600)  # `$filter` shows no copy
    a, door_provider = provider(), provider()
    legal = policy("legal", on_unknown="review", search_after="60s")
    with EngineRig(legal, provider=lambda clock: cast(FakeProvider, a)) as rig:
        message_id = rig.submit("legal", "k1")
        relay.set_plan(FaultPlan(send=["drop-response"]))
        assert rig.tick().unknown == 1
        assert rig.job("k1").state is JobState.REVIEW, rig.events("k1")
        relay.set_plan(FaultPlan())
        door = Services(
            rig.ledger,
            lambda: ChannelPolicies(rig.policies),
            providers=lambda _: nullcontext(door_provider),
        )
        answer = door.check("k1", by="alice")
        assert answer.count == 1 and answer.recorded, answer
        assert rig.events("k1")[-1] == "Checked"
    assert logged_copies(accept_log, message_id) == 1


class _FenceFailsOnce(GraphProvider):
    """Its first draft deletion fails (a DELETE answered 503), after the fence was listed
    and recorded."""

    failed = False

    def _fence(self, mailbox: Any, message_id: str, draft_id: str) -> bool:
        if not self.failed:
            self.failed = True
            raise ProviderError("DELETE: HTTP 503 (scripted)", unavailable=True)
        return super()._fence(mailbox, message_id, draft_id)


def test_a_draft_whose_recorded_fence_failed_is_fenced_by_its_id_after_a_restart(
    provider: ProviderFactory, graph: GraphEmulator, relay: FaultRelay, accept_log: Path
) -> None:
    """Daemon `b`'s fence recorded the draft `a`'s lapsed claim made (recorded before its
    deletion), then its DELETE failed; `b` was replaced by `c`. The fence and the tidy read
    by id only the recorded drafts no event said were deleted, so `c`, which never made
    nor read that draft and whose `$filter` does not show it yet, fenced nothing: the draft
    stayed in Drafts, sendable, while the search counted no copy. Every draft the job's
    claims recorded is now read by its id: `c`'s fence deletes it."""
    from tests.unit.engine_rig import EngineRig, policy

    from daemon.doubles.fake_provider import FakeProvider
    from ledger.job import DRAFTS_FENCE, SendJob

    graph.set_lag(3600)  # `$filter` shows neither the draft nor any copy
    a, b, c = provider(), provider(kind=_FenceFailsOnce), provider()
    with EngineRig(
        policy("receipts", on_unknown="retry"), provider=lambda clock: cast(FakeProvider, a)
    ) as rig:
        left = _draft_of_a_send_never_made(rig, relay, graph)
        for name, replacement in (("b", b), ("c", c)):
            rig.engine.close()  # the daemon before is gone; this one remembers nothing
            rig.provider = cast(FakeProvider, replacement)
            rig.engine = rig.new_engine(name)
            rig.clock.advance(60)
            rig.tick(errors=1 if name == "b" else 0)  # `b`: its DELETE fails
        fences = [
            list(e.draft_ids) for e in rig.ledger.history("k1")
            if isinstance(e, SendJob.DraftsDeleted) and e.why == DRAFTS_FENCE
        ]  # fmt: skip
        assert fences[0] == [left], rig.events("k1")
    assert graph.folder(MAILBOX, "drafts") == [] and graph.folder(MAILBOX, "deleteditems") == []
    assert graph.send_draft(MAILBOX, left) == 404  # a late call sends nothing
    assert logged_copies(accept_log) == 0


def test_a_draft_a_late_send_took_during_a_recorded_fence_keeps_the_next_attempt_unsent(
    provider: ProviderFactory, graph: GraphEmulator, relay: FaultRelay, accept_log: Path
) -> None:
    """Daemon `b`'s fence recorded the draft `a`'s lapsed claim made (read by its id, still
    a draft); a late send of it landed before the DELETE, so the DELETE found it gone (in
    transit), and the search right after found no copy yet: the job was requeued, and `b`
    was replaced by `c`. Reading by id only the recorded drafts no event said were
    deleted, `c`'s next attempt skipped that draft, now a copy in Sent Items, and sent a
    second one. It reads every recorded draft by its id: the copy is seen, nothing is sent
    beside it, and the search counts it (one copy, confirmed)."""
    from tests.unit.engine_rig import EngineRig, policy

    from daemon.doubles.fake_provider import FakeProvider
    from ledger.job import DRAFTS_FENCE, SendJob
    from ledger.vocabulary import JobState

    graph.set_lag(3600)  # `$filter` shows neither the draft nor any copy
    a, b, c = provider(), provider(), provider()
    receipts = policy("receipts", on_unknown="retry", confirm_misses=1)
    with EngineRig(receipts, provider=lambda clock: cast(FakeProvider, a)) as rig:

        def replaced_by(name: str, replacement: GraphProvider) -> None:
            rig.engine.close()  # the daemon before is gone; this one remembers nothing
            rig.provider = cast(FakeProvider, replacement)
            rig.engine = rig.new_engine(name)
            rig.clock.advance(60)

        left = _draft_of_a_send_never_made(rig, relay, graph)
        message_id = rig.job("k1").message_id
        graph.set_file_delay(2.0)  # the late send's copy is in transit through `b`'s sweep
        graph.late_send_on_delete.add(left)
        replaced_by("b", b)
        rig.tick()  # the fence (the draft gone under it), a miss: requeued
        assert rig.job("k1").state is JobState.REQUESTED, rig.events("k1")
        filed = time.monotonic() + 10
        while not graph.folder(MAILBOX, "sentitems"):  # the late send's copy filed
            assert time.monotonic() < filed
            time.sleep(0.05)
        replaced_by("c", c)
        rig.tick()  # `c`'s attempt: it reads the recorded draft first
        assert logged_copies(accept_log, message_id) == 1, "sent beside the late copy"
        rig.clock.advance(60)
        rig.tick()  # its sweep: the attempt's own draft fenced, the late copy counted
        fences = [
            list(e.draft_ids) for e in rig.ledger.history("k1")
            if isinstance(e, SendJob.DraftsDeleted) and e.why == DRAFTS_FENCE
        ]  # fmt: skip
        assert fences[0] == [left], rig.events("k1")
        assert rig.job("k1").state is JobState.CONFIRMED, rig.events("k1")
    assert logged_copies(accept_log, message_id) == 1
    assert graph.folder(MAILBOX, "drafts") == []


@pytest.mark.parametrize(
    ("fault", "state", "reads"),
    [
        # The send's answer lost: its draft is the copy, read once by the fence.
        ("drop-response", "confirmed", 1),
        # The send never reached Graph: the fence reads the draft, then reads it back after
        # each of its two DELETEs (deleted for good), and the search needs no read.
        ("fail-before-forward", "requested", 3),
    ],
)
def test_a_sweep_reads_each_recorded_draft_by_id_no_more_than_its_fence_does(
    provider: ProviderFactory,
    graph: GraphEmulator,
    relay: FaultRelay,
    accept_log: Path,
    fault: Mode,
    state: str,
    reads: int,
) -> None:
    """The sweep of an Unknown Graph job fences the job's drafts, reading each its claims
    recorded by id, then searches, reading each by id again: one GET per recorded draft
    more per Unknown outcome, from the mailbox's throttling budget, for an answer that
    could not have changed (a copy stays a copy; a draft deleted for good can no longer
    be sent). The search now takes what the fence read of them; counted at the emulator."""
    from tests.unit.engine_rig import EngineRig, policy

    from daemon.doubles.fake_provider import FakeProvider
    from ledger.vocabulary import JobState

    graph.set_lag(3600)  # `$filter` shows no copy: only the reads by id count it
    a = provider()
    receipts = policy("receipts", on_unknown="retry", confirm_misses=1)
    with EngineRig(receipts, provider=lambda clock: cast(FakeProvider, a)) as rig:
        message_id = rig.submit("receipts", "k1")
        relay.set_plan(FaultPlan(send=[fault]))
        assert rig.tick().unknown == 1
        relay.set_plan(FaultPlan())
        [draft] = rig.job("k1").made_drafts
        before = len(graph.requests)
        rig.advance_and_tick(60)  # search_after: the fence, then the search
        assert rig.job("k1").state is JobState(state), rig.events("k1")
        by_id = [
            method for method, path in graph.requests[before:]
            if path.endswith("/messages/" + quote(draft, safe=""))
        ]  # fmt: skip
        assert by_id.count("GET") == reads, graph.requests[before:]
    assert logged_copies(accept_log, message_id) == (1 if state == "confirmed" else 0)


def test_a_draft_a_fence_left_in_recoverable_items_holds_back_no_later_attempt_or_sweep(
    provider: ProviderFactory, graph: GraphEmulator, relay: FaultRelay, accept_log: Path
) -> None:
    """A fence's DELETE from Deleted Items puts the draft in Recoverable Items, where
    Exchange Online keeps it and a GET by its immutable id still answers it, a draft, and
    where Graph refuses to delete it (403 ErrorCannotDeleteObject). Every later fence,
    and the tidy before the next attempt's send, read each recorded draft by id: before,
    they took that draft for one still to delete, its DELETE was refused, and the next
    attempt was refused in turn (not sent, again at every try) and the sweep failed at
    every return. A draft read in Recoverable Items is fenced already: the attempts after
    it go ahead, the sweeps settle, one copy in the end."""
    from tests.unit.engine_rig import EngineRig, policy

    from daemon.doubles.fake_provider import FakeProvider
    from ledger.vocabulary import JobState

    graph.recoverable_items = True
    a = provider()
    receipts = policy("receipts", on_unknown="retry", confirm_misses=1)
    with EngineRig(receipts, provider=lambda clock: cast(FakeProvider, a)) as rig:
        message_id = rig.submit("receipts", "k1")
        for attempt in (1, 2):  # each send lost before it reached Graph: Unknown
            relay.set_plan(FaultPlan(send=["fail-before-forward"]))
            assert rig.advance_and_tick(60).unknown == 1, rig.events("k1")
            relay.set_plan(FaultPlan())
            rig.advance_and_tick(60)  # the sweep: its fence, a miss, requeued
            assert rig.job("k1").state is JobState.REQUESTED, rig.events("k1")
            assert len(graph.folder(MAILBOX, "recoverableitemsdeletions")) == attempt
        rig.advance_and_tick(60)
        assert rig.job("k1").state is JobState.CONFIRMED, rig.events("k1")
    for left in graph.folder(MAILBOX, "recoverableitemsdeletions"):
        assert graph.send_draft(MAILBOX, left["id"]) == 404  # a late call sends nothing
    assert logged_copies(accept_log, message_id) == 1


def test_a_draft_graph_refuses_to_delete_sends_the_job_to_review_saying_which(
    provider: ProviderFactory, graph: GraphEmulator, relay: FaultRelay, accept_log: Path
) -> None:
    """A hold or a retention label on the job's unsent draft in Drafts: Graph answers it by
    id and refuses its DELETE (403), now and at every try. Before, the sweep's fence
    failed at each return (an error, the job Unknown for ever, its draft still sendable
    by a late call). The sweep now sends the job to review at once, naming the draft and
    Graph's answer, with nothing sent."""
    from tests.unit.engine_rig import EngineRig, policy

    from daemon.doubles.fake_provider import FakeProvider
    from ledger.job import SendJob
    from ledger.vocabulary import JobState

    a = provider()
    receipts = policy("receipts", on_unknown="retry", confirm_misses=1)
    with EngineRig(receipts, provider=lambda clock: cast(FakeProvider, a)) as rig:
        left = _draft_of_a_send_never_made(rig, relay, graph)
        graph.refuse_delete[left] = (403, "ErrorAccessDenied")
        rig.advance_and_tick(60)  # the sweep: its fence refused
        assert rig.job("k1").state is JobState.REVIEW, rig.events("k1")
        [escalated] = [e for e in rig.ledger.history("k1") if isinstance(e, SendJob.Escalated)]
        assert left in escalated.detail and "HTTP 403: ErrorAccessDenied" in escalated.detail
        assert "delete it in the mailbox" in escalated.detail, escalated.detail
    assert [m["id"] for m in graph.folder(MAILBOX, "drafts")] == [left]
    assert logged_copies(accept_log) == 0


@contextmanager
def _in_review_with_a_held_draft(
    provider: ProviderFactory, relay: FaultRelay, graph: GraphEmulator
) -> Iterator[tuple[Any, str, Any]]:
    """An `EngineRig` whose job k1 (channel legal: Unknown goes to review) is in review,
    its send lost before it reached Graph, the draft it left one Graph refuses to delete
    (403: a hold), and `search_after` past; with that draft's id and a person's door."""
    from tests.unit.engine_rig import EngineRig, policy

    from daemon.doubles.fake_provider import FakeProvider
    from daemon.service_layer.services import ChannelPolicies, Services
    from ledger.vocabulary import JobState

    a = provider()
    legal = policy("legal", on_unknown="review", search_after="60s")
    with EngineRig(legal, provider=lambda clock: cast(FakeProvider, a)) as rig:
        rig.submit("legal", "k1")
        relay.set_plan(FaultPlan(send=["fail-before-forward"]))
        rig.tick()
        relay.set_plan(FaultPlan())
        assert rig.job("k1").state is JobState.REVIEW, rig.events("k1")
        [left] = rig.job("k1").made_drafts
        graph.refuse_delete[left] = (403, "ErrorCannotDeleteObject")
        door = Services(
            rig.ledger,
            lambda: ChannelPolicies(rig.policies),
            providers=lambda _: nullcontext(provider()),
            draft_providers=frozenset({rig.job("k1").last_provider or ""}),
        )
        yield rig, left, door


def test_the_tidy_of_a_final_job_whose_draft_graph_refuses_to_delete_ends(
    provider: ProviderFactory, graph: GraphEmulator, relay: FaultRelay, accept_log: Path
) -> None:
    """A person abandons the job whose draft Graph refuses to delete (a hold): its tidy,
    due `search_after` later, met the refusal and failed at every return, an error each
    time for ever. No attempt of a final job follows, so the tidy now ends at the first
    refusal, the draft named in the daemon's log (one error), and is not tried again."""
    from ledger.vocabulary import JobState, Resolution

    with _in_review_with_a_held_draft(provider, relay, graph) as (rig, left, door):
        door.resolve("k1", Resolution.ABANDON, note="on hold", by="alice")
        assert rig.job("k1").tidy_at is not None, rig.events("k1")
        assert rig.job("k1").state is JobState.ABANDONED, rig.events("k1")
        rig.clock.advance(61)
        rig.tick(errors=1)  # the tidy: refused, named once
        assert rig.job("k1").tidy_at is None, rig.events("k1")
        assert rig.events("k1")[-1] == "DraftsDeleted"
        rig.advance_and_tick(120)  # not tried again
    assert [m["id"] for m in graph.folder(MAILBOX, "drafts")] == [left]
    assert logged_copies(accept_log) == 0


def _earlier_attempts_draft_left(
    graph_provider: GraphProvider, relay: FaultRelay, graph: GraphEmulator
) -> str:
    """An attempt whose send Graph refused (429) and whose draft's proof got no answer:
    Rejected, its draft left in Drafts for the next attempt to delete. That draft's id."""
    graph_provider.search("<warm-up@x>")  # discovery and token first: "other" is ours now
    relay.set_plan(FaultPlan(send=["429"], other=["pass", "fail-before-forward"]))
    assert graph_provider.send_raw(raw_message()).kind is SendKind.REJECTED  # draft left
    relay.set_plan(FaultPlan())
    [left] = [m["id"] for m in graph.folder(MAILBOX, "drafts")]
    return str(left)


def test_an_earlier_draft_graph_refuses_to_delete_is_a_refusal_for_good_of_the_next_send(
    provider: ProviderFactory, relay: FaultRelay, graph: GraphEmulator, accept_log: Path
) -> None:
    """The next attempt deletes the drafts of earlier ones before its send. A draft Graph
    refuses to delete (a hold) was taken for one that could not be checked now: Rejected,
    transient, the same refusal at every try. Sent beside it, this attempt's copy could be
    the second one, so nothing is sent and the refusal is for good (a person decides),
    naming the draft."""
    graph_provider = provider()
    left = _earlier_attempts_draft_left(graph_provider, relay, graph)
    graph.refuse_delete[left] = (403, "ErrorCannotDeleteObject")
    outcome = graph_provider.send_raw(raw_message())
    assert outcome.kind is SendKind.REJECTED and not outcome.transient, outcome
    assert left in outcome.reason and "cannot be deleted" in outcome.reason, outcome
    assert logged_copies(accept_log) == 0


def test_an_earlier_draft_graph_answers_locked_holds_the_next_send_back_only_for_now(
    provider: ProviderFactory, relay: FaultRelay, graph: GraphEmulator, accept_log: Path
) -> None:
    """Graph answers the DELETE of an earlier attempt's draft 423 (Graph's error table: "the
    resource that is being accessed is locked"): a lock ends, a hold does not. Taken for a
    refusal for good, the next attempt was Rejected for good and the message never sent;
    now it is Rejected for now, and once the lock is gone the attempt after it deletes the
    draft and sends, one copy."""
    graph_provider = provider()
    left = _earlier_attempts_draft_left(graph_provider, relay, graph)
    graph.refuse_delete[left] = (423, "ErrorItemLocked")
    outcome = graph_provider.send_raw(raw_message())
    assert outcome.kind is SendKind.REJECTED and outcome.transient, outcome
    assert logged_copies(accept_log) == 0
    del graph.refuse_delete[left]
    assert graph_provider.send_raw(raw_message()).kind is SendKind.CONFIRMED
    assert logged_copies(accept_log) == 1
    assert left not in [m["id"] for m in graph.folder(MAILBOX, "drafts")]


def test_an_earlier_draft_whose_delete_says_when_to_ask_again_is_no_refusal_for_good(
    provider: ProviderFactory, relay: FaultRelay, graph: GraphEmulator, accept_log: Path
) -> None:
    """Graph refuses the DELETE of an earlier attempt's draft with a 4xx that says when to
    ask again (Retry-After): an answer that will change, not a hold. Taken for a refusal
    for good, the next attempt was Rejected for good and the message never sent; now it is
    Rejected for now, waiting what Graph said, and the attempt after it sends, one copy."""
    graph_provider = provider()
    left = _earlier_attempts_draft_left(graph_provider, relay, graph)
    graph.refuse_delete[left] = (403, "ErrorAccessDenied")
    graph.refuse_delete_retry_after = 2
    outcome = graph_provider.send_raw(raw_message())
    assert outcome.kind is SendKind.REJECTED and outcome.transient, outcome
    assert outcome.retry_after == 2, outcome
    del graph.refuse_delete[left]
    assert graph_provider.send_raw(raw_message()).kind is SendKind.CONFIRMED
    assert logged_copies(accept_log) == 1


def test_a_recoverable_items_folder_answered_404_once_is_asked_again(
    provider: ProviderFactory, relay: FaultRelay, graph: GraphEmulator, accept_log: Path
) -> None:
    """The first draft a tidy reads asks for the Recoverable Items folder's id, and Graph
    answers 404 at that moment. That answer was kept as "no such folder" for the process's
    life: a later draft lying in Recoverable Items was then deleted again, refused (403)
    and the next attempt of its message Rejected for good, never sent. The 404 is not kept:
    asked again, the folder's id says that draft is fenced, and the message is sent once."""
    graph.recoverable_items = True
    graph_provider = provider()
    _earlier_attempts_draft_left(graph_provider, relay, graph)
    graph.folders_unanswered.add("recoverableitemsdeletions")
    assert graph_provider.send_raw(raw_message()).kind is SendKind.CONFIRMED  # tidied
    graph.folders_unanswered.clear()
    other = "<second@example.com>"
    relay.set_plan(FaultPlan(send=["429"], other=["pass", "fail-before-forward"]))
    assert graph_provider.send_raw(raw_message(other)).kind is SendKind.REJECTED
    relay.set_plan(FaultPlan())
    [left] = [m["id"] for m in graph.folder(MAILBOX, "drafts")]
    graph.move(MAILBOX, left, "recoverableitemsdeletions")  # a fence's, or a person's
    outcome = graph_provider.send_raw(raw_message(other))
    assert outcome.kind is SendKind.CONFIRMED, outcome
    assert logged_copies(accept_log, other) == 1


def test_a_resend_whose_draft_graph_refuses_to_delete_is_refused_for_good_naming_it(
    provider: ProviderFactory, graph: GraphEmulator, relay: FaultRelay, accept_log: Path
) -> None:
    """A person resends a job in review whose draft Graph holds and will not delete (403:
    a hold, a retention label). The resend's fence meets the refusal: before, it was
    answered as a search that could not be made (503, exit 1, "try later"), and the
    Python client retried it, each try one more fence. Trying later changes nothing, so
    it is refused as a conflict (409, exit 3): the job left in review, the answer naming
    the draft and what a person does, nothing sent."""
    from fastapi.testclient import TestClient
    from tests.unit.test_api_routes import AUTH, api_context

    from daemon.api.app import create_app
    from daemon.service_layer.problems import ServiceError
    from ledger.exceptions import Refusal
    from ledger.vocabulary import JobState, Resolution

    with _in_review_with_a_held_draft(provider, relay, graph) as (rig, left, door):
        rig.clock.advance(61)
        with pytest.raises(ServiceError) as refused:
            door.resolve("k1", Resolution.RESEND, note="not in Sent", by="alice")
        said = refused.value.message
        assert refused.value.kind is Refusal.CONFLICT, said
        assert left in said and "HTTP 403: ErrorCannotDeleteObject" in said, said
        assert "delete it in the mailbox" in said and "nothing was sent" in said, said
        with TestClient(create_app(api_context(rig))) as client:
            answer = client.post(
                "/v1/review/k1/resolve", json={"as": "resend", "note": "not in Sent"}, headers=AUTH
            )
        assert answer.status_code == 409, answer.text
        assert left in answer.text and "delete it in the mailbox" in answer.text, answer.text
        assert rig.job("k1").state is JobState.REVIEW, rig.events("k1")
    assert [m["id"] for m in graph.folder(MAILBOX, "drafts")] == [left]
    assert logged_copies(accept_log) == 0


def test_a_persons_resend_reads_each_recorded_draft_by_id_once(
    provider: ProviderFactory, graph: GraphEmulator, relay: FaultRelay, accept_log: Path
) -> None:
    """A person's resend fences the job's drafts and then searches, as the sweep does: the
    fence read the recorded draft by id and the search read it again. The search takes
    what the fence read: one GET of the draft's id, which finds it the copy a send whose
    answer was lost made, and the resend is refused on that copy."""
    from tests.unit.engine_rig import EngineRig, policy

    from daemon.doubles.fake_provider import FakeProvider
    from daemon.service_layer.problems import ServiceError
    from daemon.service_layer.services import ChannelPolicies, Services
    from ledger.vocabulary import JobState, Resolution

    graph.set_lag(3600)  # `$filter` shows no copy: only the read by id counts it
    a, door_provider = provider(), provider()
    legal = policy("legal", on_unknown="review", search_after="60s")
    with EngineRig(legal, provider=lambda clock: cast(FakeProvider, a)) as rig:
        message_id = rig.submit("legal", "k1")
        relay.set_plan(FaultPlan(send=["drop-response"]))
        rig.tick()
        relay.set_plan(FaultPlan())
        assert rig.job("k1").state is JobState.REVIEW, rig.events("k1")
        [draft] = rig.job("k1").made_drafts
        rig.clock.advance(61)
        door = Services(
            rig.ledger,
            lambda: ChannelPolicies(rig.policies),
            providers=lambda _: nullcontext(door_provider),
        )
        before = len(graph.requests)
        with pytest.raises(ServiceError):
            door.resolve("k1", Resolution.RESEND, note="not in Sent", by="alice")
        by_id = [
            method for method, path in graph.requests[before:]
            if path.endswith("/messages/" + quote(draft, safe=""))
        ]  # fmt: skip
        assert by_id == ["GET"], graph.requests[before:]
        assert rig.job("k1").state is JobState.REVIEW, rig.events("k1")
    assert logged_copies(accept_log, message_id) == 1


def test_a_draft_a_person_deleted_is_fenced_by_one_delete_into_recoverable_items(
    provider: ProviderFactory, graph: GraphEmulator, relay: FaultRelay, accept_log: Path
) -> None:
    """The job's draft was in Deleted Items already (a person deleted it: still sendable by
    its id), so the fence's first DELETE put it in Recoverable Items. Read back there, a
    draft, it was deleted once more, refused (403), and the job went to review as if Graph
    held the draft. It is fenced: the sweep's miss requeues the job, sent once."""
    from tests.unit.engine_rig import EngineRig, policy

    from daemon.doubles.fake_provider import FakeProvider
    from ledger.vocabulary import JobState

    graph.recoverable_items = True
    a = provider()
    receipts = policy("receipts", on_unknown="retry", confirm_misses=1)
    with EngineRig(receipts, provider=lambda clock: cast(FakeProvider, a)) as rig:
        left = _draft_of_a_send_never_made(rig, relay, graph)
        message_id = rig.job("k1").message_id
        graph.move(MAILBOX, left, "deleteditems")  # a person's delete
        rig.advance_and_tick(60)  # the sweep: its fence, a miss, requeued
        assert rig.job("k1").state is JobState.REQUESTED, rig.events("k1")
        rig.advance_and_tick(60)
        assert rig.job("k1").state is JobState.CONFIRMED, rig.events("k1")
    assert [m["id"] for m in graph.folder(MAILBOX, "recoverableitemsdeletions")] == [left]
    assert logged_copies(accept_log, message_id) == 1

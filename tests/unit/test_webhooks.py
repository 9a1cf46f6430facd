"""Webhooks on a memory store with injected time (docs/http-api.md "Webhooks"): the signature
against the reference scheme, the payload mapping, and a webhook's position, retries,
backoff and lease."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, get_args

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from standardwebhooks.webhooks import Webhook, WebhookVerificationError
from tests.unit.engine_rig import EngineRig, policy

from daemon.config.settings import ConfigError, WebhookSettings, settings_from_dict
from daemon.doubles.fake_provider import Scripted
from daemon.webhooks.delivery import Outcome
from daemon.webhooks.delivery_threads import hooks_from
from daemon.webhooks.events import (
    REJECTED_CODES,
    WEBHOOK_EVENTS,
    WEBHOOK_TYPES,
    WebhookType,
    event_id_for,
    topics_for,
)
from daemon.webhooks.signing import new_secret, parse_secret, signed_headers
from daemon.webhooks.status import webhook_status
from daemon.webhooks.worker import Deliverer, Hook
from ledger.job import SendJob, job_id_for
from ledger.vocabulary import Resolution

# The example of the Standard Webhooks specification (and of Svix's documentation).
SPEC_SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
SPEC_ID = "msg_p5jXN8AQM9LWM0D4loKWxJek"
SPEC_TIMESTAMP = 1614265330
SPEC_BODY = '{"test": 2432232314}'
SPEC_SIGNATURE = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
SECRET = new_secret()


def hmac_signature(secret: str, msg_id: str, timestamp: str, body: bytes) -> str:
    """The scheme written out, independently of the library."""
    key = base64.b64decode(secret.removeprefix("whsec_"))
    signed = msg_id.encode() + b"." + timestamp.encode() + b"." + body
    return "v1," + base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()


# -- signing ---------------------------------------------------------------------------


def test_signature_matches_the_specification_example() -> None:
    at = datetime.fromtimestamp(SPEC_TIMESTAMP, UTC)
    headers = signed_headers(SPEC_SECRET, SPEC_ID, at, SPEC_BODY)
    assert headers == {
        "webhook-id": SPEC_ID,
        "webhook-timestamp": str(SPEC_TIMESTAMP),
        "webhook-signature": SPEC_SIGNATURE,
    }
    assert hmac_signature(SPEC_SECRET, SPEC_ID, str(SPEC_TIMESTAMP), SPEC_BODY.encode()) == (
        SPEC_SIGNATURE
    )


@settings(deadline=None, max_examples=50)
@given(
    body=st.text(),
    msg_id=st.from_regex(r"evt_[0-9a-f]{32}_[1-9][0-9]{0,3}", fullmatch=True),
    offset=st.integers(-3600 * 12, 3600 * 12),
)
def test_any_body_verifies_with_the_reference_library(body: str, msg_id: str, offset: int) -> None:
    # A non-UTC time zone must not move the signed timestamp.
    from datetime import timedelta, timezone

    now = datetime.now(UTC)
    at = now.astimezone(timezone(timedelta(seconds=offset // 60 * 60)))
    headers = signed_headers(SECRET, msg_id, at, body)
    assert headers["webhook-timestamp"] == str(int(now.timestamp()))
    Webhook(SECRET).verify(body, headers, json_parse=False)
    expected = hmac_signature(SECRET, msg_id, headers["webhook-timestamp"], body.encode())
    assert headers["webhook-signature"] == expected


def test_a_changed_body_or_another_secret_fails_verification() -> None:
    headers = signed_headers(SECRET, "evt_1", datetime.now(UTC), '{"a":1}')
    with pytest.raises(WebhookVerificationError):
        Webhook(SECRET).verify('{"a":2}', headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(new_secret()).verify('{"a":1}', headers)


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "one line expected"),
        ("whsec_a\nwhsec_b\n", "one line expected"),
        ("MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "must start with 'whsec_'"),
        ("whsec_not base64!", "not base64"),
        ("whsec_" + base64.b64encode(b"short").decode(), "24 to 64 bytes, not 5"),
    ],
)
def test_bad_secrets_are_refused_without_echoing_them(text: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason) as caught:
        parse_secret(text)
    assert "MfKQ9r8" not in str(caught.value)


def test_the_new_secret_is_a_valid_one() -> None:
    assert parse_secret(new_secret() + "\n").startswith("whsec_")


# -- settings --------------------------------------------------------------------------


def _webhook_config(**fields: Any) -> dict[str, Any]:
    return {
        "webhooks": {"ops": {"url": "https://hooks.example.com/x", "secret_file": "s", **fields}}
    }


def test_webhook_settings_defaults() -> None:
    hook = settings_from_dict(_webhook_config()).webhooks["ops"]
    assert hook.events == list(WEBHOOK_TYPES)
    assert (hook.timeout, hook.retry_backoff, hook.retry_backoff_max) == (10.0, 1.0, 300.0)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"url": "ftp://hooks.example.com/"}, "webhooks.ops.url: .*http:// or https://"),
        ({"url": "http://hooks.example.com/"}, "webhooks.ops: url: http:// to hooks.example.com"),
        ({"url": "https://u:p@hooks.example.com/"}, "webhooks.ops.url: .*credentials"),
        ({"events": []}, "webhooks.ops.events"),
        ({"events": ["confirmed", "confirmed"]}, "webhooks.ops.events: .*twice"),
        ({"events": ["sent"]}, "webhooks.ops.events.0"),
        ({"timeout": "0s"}, "webhooks.ops.timeout"),
        ({"timeout": "6m"}, "webhooks.ops.timeout"),
        ({"retry_backoff_max": "2d"}, "webhooks.ops.retry_backoff_max: a duration from 1ms to 1d"),
        ({"retry_backoff": "soon"}, "webhooks.ops.retry_backoff: not a duration"),
        ({"retry_backoff": "1m", "retry_backoff_max": "1s"}, "retry_backoff_max is shorter"),
        ({"colour": "red"}, "webhooks.ops.colour: unknown key"),
    ],
)
def test_bad_webhook_settings_name_the_field(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        settings_from_dict(_webhook_config(**fields))


def test_plain_http_is_allowed_to_loopback_or_when_asked() -> None:
    for url in ("http://127.0.0.1:8080/h", "http://[::1]/h", "http://localhost/h"):
        settings_from_dict(_webhook_config(url=url))
    settings_from_dict(_webhook_config(url="http://n8n:5678/webhook/x", allow_http=True))


def test_a_bad_name_is_refused() -> None:
    with pytest.raises(ConfigError, match="webhooks"):
        settings_from_dict({"webhooks": {"o ps": {"url": "https://a/", "secret_file": "s"}}})


def test_a_bad_secret_file_names_the_setting(tmp_path: Path) -> None:
    (tmp_path / "s").write_text("not a secret\n")
    config = settings_from_dict(_webhook_config(), config_path=tmp_path / "c.toml")
    with pytest.raises(ConfigError, match=r"webhooks\.ops\.secret_file: the secret must start"):
        hooks_from(config)


def test_the_allowed_events_are_the_table() -> None:
    assert set(get_args(WebhookType)) == {entry.type for entry in WEBHOOK_EVENTS}
    assert "cancelled" in WEBHOOK_TYPES
    assert WebhookSettings.model_fields["events"] is not None


# -- a receiver and a store ------------------------------------------------------------


@dataclass
class Receiver:
    """Takes deliveries in memory; `refuse` answers that many with 503 first."""

    secret: str = SECRET
    refuse: int = 0
    down: bool = False
    got: list[dict[str, Any]] = field(default_factory=list)
    attempts: list[str] = field(default_factory=list)

    def __call__(
        self, url: str, body: bytes, headers: Mapping[str, str], timeout: float
    ) -> Outcome:
        # The reference library's own signing (its `verify` checks the timestamp against
        # the real clock, and these tests inject time).
        at = datetime.fromtimestamp(int(headers["webhook-timestamp"]), UTC)
        expected = Webhook(self.secret).sign(headers["webhook-id"], at, body.decode())
        assert headers["webhook-signature"] == expected
        payload = json.loads(body)
        assert payload["event_id"] == headers["webhook-id"]
        self.attempts.append(headers["webhook-id"])
        if self.down:
            return Outcome(False, None, "ConnectionRefusedError: [Errno 111] refused")
        if self.refuse > 0:
            self.refuse -= 1
            return Outcome(False, 503, "HTTP 503: busy")
        self.got.append(payload)
        return Outcome(True, 200)


class Rig(EngineRig):
    def __init__(self, **policy_fields: Any) -> None:
        super().__init__(policy("receipts", **policy_fields))
        self.rng = random.Random(7)

    def now(self) -> float:
        return self.clock().timestamp()

    def deliverer(
        self,
        receiver: Receiver,
        *,
        owner: str = "a",
        types: tuple[str, ...] = WEBHOOK_TYPES,
        page: int = 100,
        name: str = "ops",
    ) -> Deliverer:
        hook = Hook(
            name,
            "https://hooks.example.com/x",
            SECRET,
            frozenset(types),
            timeout=5.0,
            retry_backoff=2.0,
            retry_backoff_max=60.0,
        )
        return Deliverer(
            self.ledger,
            hook,
            owner=owner,
            poster=receiver,
            clock=self.now,
            rng=self.rng,
            page=page,
        )

    def confirmed(self, *keys: str) -> None:
        for key in keys:
            self.submit("receipts", key)
        self.tick()
        for key in keys:
            assert self.job(key).state == "confirmed"


def log_order(rig: Rig, event: str) -> list[str]:
    """The keys of the jobs whose `event` is in the log, in log order."""
    keys = {job_id_for(row.key): row.key for row in rig.ledger.jobs()}
    return [keys[e.originator_id] for e in rig.ledger.job_events(types=[event])]


def drain(deliverer: Deliverer, passes: int = 50) -> None:
    for _ in range(passes):
        if not deliverer.pass_once():
            return


@pytest.fixture
def rig() -> Any:
    rig = Rig()
    yield rig
    rig.close()


# -- the payload -----------------------------------------------------------------------


def test_a_confirmed_job_is_delivered_once_with_its_fields(rig: Rig) -> None:
    rig.confirmed("order-1")
    receiver = Receiver()
    deliverer = rig.deliverer(receiver)
    drain(deliverer)
    drain(deliverer)
    job = rig.job("order-1")
    confirmed = next(e for e in rig.ledger.history("order-1") if type(e).__name__ == "Confirmed")
    assert receiver.got == [
        {
            "type": "confirmed",
            "key": "order-1",
            "channel": "receipts",
            "state": "confirmed",
            "message_id": job.message_id,
            "at": confirmed.timestamp.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "event_id": event_id_for(job.id, confirmed.originator_version),
            "reason": None,
            "detail": None,
            "verified": None,
        }
    ]


def test_review_rejected_and_abandoned_map_through_the_table() -> None:
    rig = Rig(on_unknown="review", max_attempts=1)
    try:
        rig.provider.script(Scripted.rejected(transient=False, reason="Invalid To header"))
        rig.submit("receipts", "bad-to")
        rig.tick()
        rig.provider.script(Scripted.dropped_response())
        rig.submit("receipts", "lost")
        rig.tick()
        assert rig.job("lost").state == "review"
        rig.ledger.update(
            "lost", lambda j: j.resolve(Resolution.ABANDON, note="", by="ops", at=rig.clock())
        )
        receiver = Receiver()
        drain(rig.deliverer(receiver))
        seen = [(p["key"], p["type"], p["state"], p["reason"]) for p in receiver.got]
        assert seen[:2] == [
            ("bad-to", "rejected", "attempted", "permanent"),
            ("bad-to", "review", "review", "rejected"),
        ]
        # The provider's words in their own field, never as the code.
        assert [p["detail"] for p in receiver.got[:2]] == ["Invalid To header", None]
        assert ("lost", "review", "review", "unknown-outcome") in seen
        assert ("lost", "abandoned", "abandoned", "resolved: abandon") in seen
        # Per job, the order of the job's own events.
        lost = [s[1] for s in seen if s[0] == "lost"]
        assert lost == ["review", "abandoned"]
    finally:
        rig.close()


def test_only_the_configured_types_are_sent(rig: Rig) -> None:
    rig.provider.script(Scripted.rejected(transient=True, retry_after=1.0))
    rig.submit("receipts", "later")
    rig.tick()
    rig.advance_and_tick(30)
    assert rig.job("later").state == "confirmed"
    receiver = Receiver()
    drain(rig.deliverer(receiver, types=("rejected",)))
    assert [p["type"] for p in receiver.got] == ["rejected"]
    assert receiver.got[0]["reason"] == "transient"
    assert topics_for(["abandoned"]) == [SendJob.Resolved.TOPIC]


@pytest.mark.parametrize(
    ("fate", "code"),
    [
        (Scripted.unavailable(retry_after=1.0), "unavailable"),
        (Scripted.rejected(transient=True, retry_after=1.0, reason="451 try later"), "transient"),
        (Scripted.rejected(transient=False, reason="550 no such user"), "permanent"),
    ],
)
def test_a_rejected_delivery_s_reason_is_a_code_and_its_detail_the_provider_s_words(
    rig: Rig, fate: Scripted, code: str
) -> None:
    rig.provider.script(fate)
    rig.submit("receipts", "refused")
    rig.tick()
    receiver = Receiver()
    drain(rig.deliverer(receiver, types=("rejected",)))
    [sent] = receiver.got
    assert sent["reason"] == code and code in REJECTED_CODES
    [rejected] = [e for e in rig.ledger.history("refused") if type(e).__name__ == "Rejected"]
    assert sent["detail"] == rejected.reason and sent["detail"]


# -- position, retries, order ----------------------------------------------------------


def test_a_failing_receiver_gets_the_same_id_again_after_the_backoff(rig: Rig) -> None:
    rig.confirmed("a-1", "a-2")
    receiver = Receiver(refuse=3)
    deliverer = rig.deliverer(receiver)
    deliverer.pass_once()
    assert len(receiver.attempts) == 1
    deliverer.pass_once()  # the retry is not due yet
    assert len(receiver.attempts) == 1
    row = rig.ledger.positions().read_all()[0]
    assert row.failures == 1 and row.last_error == "HTTP 503: busy" and row.position == 0
    assert row.next_at is not None and 1.5 <= row.next_at - rig.now() <= 2.0
    for expected_wait in (4.0, 8.0):
        rig.clock.advance(60)
        deliverer.pass_once()
        row = rig.ledger.positions().read_all()[0]
        assert 0.75 * expected_wait <= row.next_at - rig.now() <= expected_wait  # type: ignore[operator]
    rig.clock.advance(60)
    drain(deliverer)
    first = receiver.attempts[0]
    assert receiver.attempts[:4] == [first] * 4
    assert [p["key"] for p in receiver.got] == log_order(rig, "Confirmed")
    row = rig.ledger.positions().read_all()[0]
    assert (row.failures, row.delivered, row.failed) == (0, 2, 3)


def test_a_receiver_down_for_an_hour_then_gets_everything_in_order(rig: Rig) -> None:
    receiver = Receiver(down=True)
    deliverer = rig.deliverer(receiver)
    keys = [f"k-{n}" for n in range(12)]
    for start in range(0, 12, 3):
        rig.confirmed(*keys[start : start + 3])
        for _ in range(15):  # an hour, a pass every four minutes
            rig.clock.advance(240)
            deliverer.pass_once()
    row = rig.ledger.positions().read_all()[0]
    assert row.position == 0 and row.failures >= 10
    # Capped backoff: never more than retry_backoff_max between attempts.
    assert row.next_at is not None and row.next_at - rig.now() <= 60
    status = webhook_status(rig.ledger, {"ops": list(WEBHOOK_TYPES)}, rig.now())[0]
    assert status["behind"] == 12 and status["lag_seconds"] >= 3600
    assert "refused" in status["last_error"]
    assert status["next_event_id"] == receiver.attempts[-1]
    receiver.down = False
    rig.clock.advance(61)
    drain(deliverer)
    assert [p["key"] for p in receiver.got] == log_order(rig, "Confirmed")
    assert sorted(p["key"] for p in receiver.got) == sorted(keys)
    status = webhook_status(rig.ledger, {"ops": list(WEBHOOK_TYPES)}, rig.now())[0]
    assert status["behind"] == 0 and status["lag_seconds"] is None
    # 127b519 went on showing the hour-old error with nothing behind.
    assert status["last_error"] is None and status["last_error_at"] is None
    assert status["failures"] == 0


def test_a_restart_resumes_from_the_stored_position(rig: Rig) -> None:
    rig.confirmed("r-1", "r-2", "r-3")
    receiver = Receiver()
    drain(rig.deliverer(receiver, page=1), passes=2)  # two pages, then "killed"
    order = log_order(rig, "Confirmed")
    assert [p["key"] for p in receiver.got] == order[:2]
    drain(rig.deliverer(receiver, page=1))  # the same daemon name after a restart
    assert [p["key"] for p in receiver.got] == order


def test_two_daemons_share_a_webhook_by_lease(rig: Rig) -> None:
    rig.confirmed("l-1")
    receiver = Receiver()
    first, second = rig.deliverer(receiver, owner="a"), rig.deliverer(receiver, owner="b")
    drain(first)
    rig.confirmed("l-2")
    drain(second)  # a's lease runs: b sends nothing
    assert [p["key"] for p in receiver.got] == ["l-1"]
    first.release()  # a stops: b takes over at once
    drain(second)
    assert [p["key"] for p in receiver.got] == ["l-1", "l-2"]
    rig.confirmed("l-3")
    rig.clock.advance(61)  # b died without releasing: a takes over after the lease
    drain(first)
    assert [p["key"] for p in receiver.got] == ["l-1", "l-2", "l-3"]


def test_a_stale_owner_cannot_move_the_position(rig: Rig) -> None:
    positions = rig.ledger.positions()
    now = rig.now()
    assert positions.claim("ops", "a", now, 60) is not None
    assert positions.claim("ops", "b", now + 61, 60) is not None  # a's lease ran out
    assert not positions.advance("ops", "a", 0, 5, 1, now + 62, 60)
    assert not positions.fail("ops", "a", 0, "late", now + 70, now + 62, 60)
    assert positions.advance("ops", "b", 0, 5, 1, now + 62, 60)
    assert not positions.advance("ops", "b", 0, 9, 1, now + 62, 60)  # not at 0 any more
    assert positions.read_all()[0].position == 5


def test_webhooks_keep_their_own_positions(rig: Rig) -> None:
    rig.confirmed("w-1")
    good, bad = Receiver(), Receiver(down=True)
    drain(rig.deliverer(bad, name="broken"))
    drain(rig.deliverer(good, name="ops"))
    assert [p["key"] for p in good.got] == ["w-1"]
    rows = {row.name: row for row in rig.ledger.positions().read_all()}
    assert rows["broken"].position == 0 and rows["ops"].position > 0


@settings(deadline=None, max_examples=100)
@given(
    base=st.floats(0.001, 100),
    ceiling=st.floats(0.001, 10_000),
    failures=st.integers(1, 10_000),
    seed=st.integers(0, 2**32),
)
def test_backoff_doubles_within_its_bounds(
    base: float, ceiling: float, failures: int, seed: int
) -> None:
    hook = Hook(
        "h",
        "https://a/",
        SECRET,
        frozenset(),
        retry_backoff=base,
        retry_backoff_max=max(base, ceiling),
    )
    delay = hook.backoff(failures, random.Random(seed))
    expected = min(base * 2 ** min(failures - 1, 60), max(base, ceiling))
    assert 0.75 * expected <= delay <= expected


def test_the_body_is_compact_json_signed_as_sent(rig: Rig) -> None:
    rig.confirmed("j-1")
    bodies: list[bytes] = []

    def poster(url: str, body: bytes, headers: Mapping[str, str], timeout: float) -> Outcome:
        bodies.append(body)
        expected = hmac_signature(SECRET, headers["webhook-id"], headers["webhook-timestamp"], body)
        assert headers["webhook-signature"] == expected
        assert abs(int(headers["webhook-timestamp"]) - rig.now()) < 1
        return Outcome(True, 204)

    hook = Hook("ops", "https://a/", SECRET, frozenset(WEBHOOK_TYPES))
    drain(Deliverer(rig.ledger, hook, owner="a", poster=poster, clock=rig.now))
    assert len(bodies) == 1 and b": " not in bodies[0]
    assert json.loads(bodies[0])["key"] == "j-1"


def test_metrics_count_deliveries_and_failures_per_webhook(rig: Rig) -> None:
    from daemon.api.metrics import Metrics, Sources

    metrics = Metrics(Sources(rig.ledger, {}))
    rig.confirmed("m-1", "m-2")
    receiver = Receiver(refuse=1)
    deliverer = rig.deliverer(receiver)
    deliverer.observer = metrics
    deliverer.pass_once()
    rig.clock.advance(60)
    drain(deliverer)
    text = metrics.render().decode()
    assert 'sendledger_webhook_deliveries_total{webhook="ops"} 2.0' in text
    assert 'sendledger_webhook_failures_total{webhook="ops"} 1.0' in text


def test_an_operator_skip_moves_a_running_webhook_on(rig: Rig) -> None:
    rig.confirmed("x-1")
    rig.confirmed("x-2")
    receiver = Receiver(down=True)
    deliverer = rig.deliverer(receiver)
    deliverer.pass_once()
    [stuck] = rig.ledger.positions().read_all()
    first = next(iter(rig.ledger.log_after(0, 10_000, 100, deliverer.hook.topics)))
    rig.ledger.positions().force("ops", first.id, rig.now(), expected=0)  # `webhooks skip ops`
    receiver.down = False
    drain(deliverer)  # no wait for the backoff: the failures went with the event
    assert [p["key"] for p in receiver.got] == log_order(rig, "Confirmed")[1:]
    assert stuck.failures == 1 and rig.ledger.positions().read_all()[0].failures == 0


def test_the_failing_gauge_follows_the_next_event(rig: Rig) -> None:
    from daemon.api.metrics import Metrics, Sources

    metrics = Metrics(Sources(rig.ledger, {}))
    rig.confirmed("g-1")
    receiver = Receiver(refuse=2)
    deliverer = rig.deliverer(receiver)
    for _ in range(2):
        deliverer.pass_once()
        rig.clock.advance(60)
    gauge = 'sendledger_webhook_consecutive_failures{webhook="ops"}'
    assert f"{gauge} 2.0" in metrics.render().decode()
    drain(deliverer)
    assert f"{gauge} 0.0" in metrics.render().decode()


def test_an_event_that_cannot_be_sent_is_a_failed_attempt(rig: Rig) -> None:
    rig.confirmed("e-1")

    def broken(url: str, body: bytes, headers: Mapping[str, str], timeout: float) -> Outcome:
        raise RuntimeError("no route")

    hook = Hook("ops", "https://a/", SECRET, frozenset(WEBHOOK_TYPES))
    assert not Deliverer(rig.ledger, hook, owner="a", poster=broken, clock=rig.now).pass_once()
    [row] = rig.ledger.positions().read_all()
    assert (row.position, row.failures) == (0, 1)
    assert row.last_error == "cannot deliver: RuntimeError: no route"


def test_a_readable_secret_file_is_warned_about(tmp_path: Path) -> None:
    from daemon.config.secret_files import warn_exposed_secrets

    secret = tmp_path / "s"
    secret.write_text(new_secret())
    secret.chmod(0o644)
    config = settings_from_dict(_webhook_config(), config_path=tmp_path / "c.toml")
    assert warn_exposed_secrets(config) == [secret]
    secret.chmod(0o600)
    assert warn_exposed_secrets(config) == []


@settings(deadline=None, max_examples=200)
@given(
    url=st.one_of(
        st.text(max_size=60),
        st.builds(
            lambda scheme, host, port, path: f"{scheme}://{host}{port}/{path}",
            st.sampled_from(["http", "https", "ftp", "HTTP", ""]),
            st.sampled_from(["127.0.0.1", "localhost", "[::1]", "n8n", "a.example", "", "u@h"]),
            st.sampled_from(["", ":8080", ":0", ":x", ":99999"]),
            st.text(max_size=10),
        ),
    )
)
def test_any_url_is_taken_or_refused_naming_the_field(url: str) -> None:
    try:
        hook = settings_from_dict(_webhook_config(url=url)).webhooks["ops"]
    except ConfigError as exc:
        message = str(exc)
        assert message.startswith("config: webhooks.ops") and "\n" not in message
        return
    from urllib.parse import urlsplit

    parts = urlsplit(hook.url)
    assert parts.scheme in ("http", "https") and parts.hostname
    if parts.scheme == "http":
        assert parts.hostname in ("127.0.0.1", "localhost", "::1")


def test_a_secret_is_24_to_64_bytes_a_new_one_32_and_a_lease_at_least_a_minute() -> None:
    for size, ok in ((23, False), (24, True), (64, True), (65, False)):
        secret = "whsec_" + base64.b64encode(b"k" * size).decode()
        if ok:
            assert parse_secret(secret) == secret
        else:
            with pytest.raises(ValueError, match="24 to 64 bytes"):
                parse_secret(secret)
    assert len(base64.b64decode(new_secret().removeprefix("whsec_"))) == 32
    assert Hook("h", "https://a/", new_secret(), frozenset(), timeout=10.0).lease == 60.0
    assert Hook("h", "https://a/", new_secret(), frozenset(), timeout=30.0).lease == 90.0


# -- purges ----------------------------------------------------------------------------


def test_a_job_purged_while_a_pass_delivers_is_delivered_scrubbed(rig: Rig) -> None:
    """A pass reads a page of events, then POSTs them one by one (each up to its
    timeout). A purge (an erasure request) that lands meanwhile must not let the page's
    copy of a later event send the content it just erased."""
    rig.confirmed("first")
    rig.submit("receipts", "erased")
    rig.provider.script(
        Scripted.rejected(transient=True, reason="450 customer@example.net: try later")
    )
    rig.tick()
    rig.advance_and_tick(120)
    assert rig.job("erased").state == "confirmed"

    class PurgingReceiver(Receiver):
        def __call__(
            self, url: str, body: bytes, headers: Mapping[str, str], timeout: float
        ) -> Outcome:
            outcome = super().__call__(url, body, headers, timeout)
            if len(self.got) == 1:  # after the first delivery, the purge commits
                rig.ledger.purge("erased", by="ops", rule="admin purge --key")
            return outcome

    receiver = PurgingReceiver()
    drain(rig.deliverer(receiver))
    rejected = [p for p in receiver.got if p["type"] == "rejected"]
    assert [p["key"] for p in rejected] == ["erased"]
    assert "customer@example.net" not in json.dumps(receiver.got[1:])
    assert rejected[0]["detail"] == "450 [purged]: try later"


@pytest.mark.parametrize(
    ("url", "why"),
    [
        # http.client refuses these on every attempt (InvalidURL, UnicodeEncodeError): the
        # webhook would fail forever, holding back every event, from a config that loaded.
        ("https://hooks.example.com/web hook", "a space"),
        ("https://hooks.example.com/x?token=a b", "a space"),
        ("https://hooks example.com/x", "a space"),
        ("https://hooks.example.com/\x00x", "a control character"),
        ("https://hooks.example.com/x\x7f", "a control character"),
        ("https://hooks.example.com/caf\u00e9", "non-ASCII"),
        # Read back as another URL than the one written: urlsplit drops tabs and
        # newlines, and the socket and TLS layers encode a non-ASCII host with IDNA 2003,
        # which maps "straße" to "strasse" (another domain, another owner) where IDNA
        # 2008 and browsers say "xn--strae-oqa".
        ("https://hooks.example.com/x\ty", "a control character"),
        ("https://stra\u00dfe.example/hook", "non-ASCII"),
        ("https://\uff11\uff12\uff17.0.0.1/hook", "non-ASCII"),
    ],
)
def test_a_url_that_would_not_be_requested_as_written_is_refused_naming_it(
    url: str, why: str
) -> None:
    with pytest.raises(ConfigError, match=f"webhooks.ops.url: .*{why}") as caught:
        settings_from_dict(_webhook_config(url=url))
    assert "\n" not in str(caught.value)


def test_the_failing_gauge_leaves_out_a_webhook_taken_out_of_the_config(rig: Rig) -> None:
    """A webhook removed from the config keeps its row (status shows it "not configured")
    and `webhooks skip` refuses its name: the gauge said it kept failing, and the alert on
    it fired for good with nothing an operator could do."""
    from daemon.api.metrics import Metrics, Sources

    rig.confirmed("g-1")
    for name in ("ops", "gone"):
        rig.deliverer(Receiver(down=True), name=name).pass_once()
    metrics = Metrics(Sources(rig.ledger, {}, webhooks=["ops"]))
    text = metrics.render().decode()
    assert 'sendledger_webhook_consecutive_failures{webhook="ops"} 1.0' in text
    assert 'webhook="gone"' not in text


def test_a_pass_starts_no_post_once_the_daemon_stops(rig: Rig) -> None:
    """A stopping daemon waits for the attempt in flight and its write, not for the rest
    of the page: the pass ends after the POST under way, its event recorded, and the
    next event is left to the next pass (delivery_threads.py `WebhookThreads.stop`)."""
    rig.confirmed("s-1", "s-2")
    receiver = Receiver()
    deliverer = rig.deliverer(receiver)

    def stopped_during_the_first(
        url: str, body: bytes, headers: Mapping[str, str], timeout: float
    ) -> Outcome:
        deliverer.stopping.set()  # the stop comes while this POST is out
        return receiver(url, body, headers, timeout)

    deliverer.poster = stopped_during_the_first
    assert not deliverer.pass_once()
    assert [got["key"] for got in receiver.got] == ["s-1"]
    [row] = rig.ledger.positions().read_all()
    deliverer.stopping.clear()
    deliverer.poster = receiver
    drain(deliverer)
    assert [got["key"] for got in receiver.got] == ["s-1", "s-2"]
    assert rig.ledger.positions().read_all()[0].position > row.position

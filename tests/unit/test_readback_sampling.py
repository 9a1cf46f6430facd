"""The Message-ID read-back after confirmed sends: every one of the first `readback_first`
after start, then a `readback_rate` share; a provider that replaces IDs is still caught.

Engine runs use the fake provider on a memory store with injected time (engine_rig.py);
read-backs are counted by the engine's health record.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.unit.engine_rig import EngineRig, policy
from tests.unit.meanwhile import Meanwhile

from daemon.config.settings import ConfigError, GmailProviderSettings, settings_from_dict
from daemon.doubles.fake_provider import FakeProvider
from daemon.doubles.fake_time import FakeClock
from daemon.engine.circuit import Admit, Circuits, CircuitSettings
from daemon.engine.readback import ProviderHealth, _Sampler
from daemon.providers.base import DEFAULT_READBACK_FIRST, DEFAULT_READBACK_RATE, ProviderError
from daemon.runtime import Daemon
from ledger.application import Ledger
from ledger.message import render


def run_jobs(rig: EngineRig, count: int, start: int = 0) -> None:
    for i in range(start, start + count):
        rig.submit("receipts", f"job-{i:05d}")
    rig.tick()


RigFactory = Callable[..., EngineRig]


@pytest.fixture
def rig_with() -> Iterator[RigFactory]:
    """Engine rigs whose fake provider declares its sampling (None: declares nothing, as
    a provider without the settings); closed at teardown."""
    rigs: list[EngineRig] = []

    def make(first: int | None, rate: float = 0.0, *, replaces: bool = False) -> EngineRig:
        rig = EngineRig(policy("receipts"))
        rigs.append(rig)
        rig.provider.replaces_message_id = replaces
        if first is not None:
            # The Gmail provider takes both from its settings.
            rig.provider.readback_first = first
            rig.provider.readback_rate = rate
        return rig

    yield make
    for rig in rigs:
        rig.close()


def test_first_sends_then_a_share_of_the_rest(rig_with: RigFactory) -> None:
    rig = rig_with(3, 0.25)
    run_jobs(rig, 23)
    assert rig.provider.sends == 23
    assert rig.engine.health.readbacks == 3 + 5


def test_a_provider_that_replaces_ids_is_caught_on_its_first_send(rig_with: RigFactory) -> None:
    rig = rig_with(1, 0.0, replaces=True)
    run_jobs(rig, 1)
    assert rig.engine.unreliable_providers() == ["fake"]
    assert not rig.ledger.handle_reliable("fake")


def test_no_read_back_when_a_response_id_names_no_stored_copy(rig_with: RigFactory) -> None:
    """An SMTP 250 names a queue entry: reading it back would only fail and warn."""
    rig = rig_with(5, 1.0)
    rig.provider.response_ids_readable = False
    run_jobs(rig, 4)
    assert rig.provider.sends == 4 and rig.engine.health.readbacks == 0
    assert rig.engine.unreliable_providers() == []


def test_a_provider_that_starts_replacing_later_is_caught_by_the_sample(
    rig_with: RigFactory,
) -> None:
    rig = rig_with(2, 0.5)
    run_jobs(rig, 10)
    assert rig.engine.unreliable_providers() == []
    rig.provider.replaces_message_id = True
    run_jobs(rig, 2, start=10)  # at rate 0.5, one of any two sends is read back
    assert rig.engine.unreliable_providers() == ["fake"]


def test_a_restart_reads_back_the_first_sends_again(rig_with: RigFactory) -> None:
    rig = rig_with(2, 0.0)
    run_jobs(rig, 5)
    assert rig.engine.health.readbacks == 2
    rig.restart()
    run_jobs(rig, 5, start=5)
    assert rig.engine.health.readbacks == 2


def test_a_provider_without_settings_gets_the_defaults(rig_with: RigFactory) -> None:
    rig = rig_with(None)
    run_jobs(rig, DEFAULT_READBACK_FIRST + 5)
    assert rig.engine.health.readbacks == DEFAULT_READBACK_FIRST


@settings(max_examples=200, deadline=None)
@given(
    first=st.integers(min_value=1, max_value=50),
    rate=st.floats(min_value=0.0, max_value=1.0, allow_nan=False),
    sends=st.integers(min_value=0, max_value=600),
)
def test_sampler_reads_the_first_sends_and_the_rate_of_the_rest(
    first: int, rate: float, sends: int
) -> None:
    sampler = _Sampler(first, rate)
    taken = [sampler.take() for _ in range(sends)]
    assert all(taken[:first])
    rest = max(sends - first, 0)
    sampled = sum(taken[first:])
    assert math.floor(rest * rate) - 1 <= sampled <= math.ceil(rest * rate) + 1
    if rate == 1.0:
        assert sampled == rest
    if rate == 0.0:
        assert sampled == 0


# -- settings -----------------------------------------------------------------------------


def provider_config(**fields: object) -> dict[str, object]:
    return {"providers": {"gmail": {"credentials_file": "sa.json", **fields}}}


def test_settings_default_to_the_shared_defaults() -> None:
    loaded = settings_from_dict(provider_config(), config_path=Path("/etc/sendledger.toml"))
    gmail = loaded.providers["gmail"]
    assert isinstance(gmail, GmailProviderSettings)
    assert gmail.readback_first == DEFAULT_READBACK_FIRST
    assert gmail.readback_rate == DEFAULT_READBACK_RATE


@given(st.integers(min_value=1, max_value=1_000_000), st.floats(min_value=0, max_value=1))
def test_settings_accept_every_valid_value(first: int, rate: float) -> None:
    loaded = settings_from_dict(provider_config(readback_first=first, readback_rate=rate))
    gmail = loaded.providers["gmail"]
    assert isinstance(gmail, GmailProviderSettings)
    assert gmail.readback_first == first
    assert gmail.readback_rate == rate


@given(
    st.one_of(
        st.tuples(st.just("readback_first"), st.integers(max_value=0)),
        st.tuples(st.just("readback_first"), st.integers(min_value=1_000_001)),
        st.tuples(st.just("readback_first"), st.text(alphabet="abc-xyz ", max_size=5)),
        st.tuples(
            st.just("readback_rate"),
            st.floats(allow_nan=True).filter(lambda x: not 0 <= x <= 1),
        ),
        st.tuples(st.just("readback_rate"), st.text(alphabet="abc-xyz ", max_size=5)),
    )
)
def test_settings_refuse_bad_values_naming_the_key(bad: tuple[str, object]) -> None:
    key, value = bad
    with pytest.raises(ConfigError) as caught:
        settings_from_dict(provider_config(**{key: value}))
    message = str(caught.value)
    assert f"providers.gmail.{key}" in message
    assert "\n" not in message


def test_the_read_back_names_the_unreliable_handle_in_the_log_and_status(
    caplog: pytest.LogCaptureFixture,
) -> None:
    rig = EngineRig(policy("receipts"))
    try:
        rig.provider.replaces_message_id = True
        rig.submit("receipts", "k1")
        with caplog.at_level(logging.CRITICAL, logger="sendledger.engine"):
            rig.tick()
        assert "PROVIDER fake REPLACED OUR MESSAGE-ID" in caplog.text
        line = Daemon.status_line(SimpleNamespace(engine=rig.engine))  # type: ignore[arg-type]
        assert line.endswith("; HANDLE UNRELIABLE: fake")
    finally:
        rig.close()


def test_a_read_back_that_timed_out_counts_as_a_hang() -> None:
    """A read-back whose call timed out counts toward its scope's circuit as a search
    that timed out does: as a hang, whose probe is a ping, not a send into it (one more
    Unknown)."""
    clock = FakeClock(datetime(2026, 12, 1, 9, 0, tzinfo=UTC))
    circuits = Circuits(CircuitSettings(failures=1, probe_after=1.0, probe_max=8.0))
    provider = TimingOut("fake", clock=clock)
    ledger = Ledger("memory://", clock=clock)
    try:
        health = ProviderHealth(ledger, clock, circuits)
        job = SimpleNamespace(key="k", message_id="<k@mail.example.com>")
        health.read_back(job, "fake", provider, "provider-id", raw=b"")  # type: ignore[arg-type]
        [opened] = circuits.open()
        assert opened.scope == "fake"
        assert circuits.admit("fake", clock() + timedelta(seconds=1.5)) is Admit.PING  # a hang
    finally:
        ledger.close()


class TimingOut(FakeProvider):
    def read_message_id(self, provider_message_id: str) -> str | None:
        raise ProviderError("get: timed out", timed_out=True)


class MarkedWhileRead:
    """The ledger, whose read of a handle (the tick's `ProviderHealth.refresh`) lets
    `meanwhile` run once the store has answered, before the answer is kept: a send worker
    of the same daemon at work at that moment."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.meanwhile = Meanwhile()

    def handle_reliable(self, provider: str) -> bool:
        answer = self.ledger.handle_reliable(provider)
        self.meanwhile()
        return answer

    def __getattr__(self, name: str) -> Any:
        return getattr(self.ledger, name)


#: When the read-back's mark comes, against the tick's read of the handles: marked and
#: written while the tick read; marked then, written once the tick kept its answer; marked
#: before the tick began, written once it kept its answer.
TIMINGS = ["within-the-read", "written-after", "marked-before"]


@pytest.mark.parametrize("timing", TIMINGS)
def test_a_handle_marked_while_the_tick_reads_the_handles_stays_unreliable(
    rig_with: RigFactory, timing: str
) -> None:
    """A send worker's read-back finds the provider replacing our Message-ID while the
    tick reads the handles from the store: the tick kept what it read, from before the
    mark was written, over the mark. Until the next tick the daemon took the handle for
    reliable: its due searches of Unknown jobs went on, each miss a step towards a
    resend that duplicates, and `/metrics` said reliable."""
    rig = rig_with(1, 0.0, replaces=True)
    rig.submit("receipts", "k1")
    job = rig.job("k1")
    raw = render(job)
    sent = rig.provider.send_raw(raw)
    assert sent.provider_message_id is not None
    store = MarkedWhileRead(rig.ledger)
    health = ProviderHealth(store, rig.clock)  # type: ignore[arg-type]
    health.refresh(["fake"])
    assert health.reliable("fake")
    writing, kept = threading.Event(), threading.Event()
    mark_handle = rig.ledger.mark_handle

    def paused_write(*args: Any, **kwargs: Any) -> Any:
        writing.set()
        if timing != "within-the-read":
            assert kept.wait(timeout=10)
        return mark_handle(*args, **kwargs)

    store.mark_handle = paused_write  # type: ignore[attr-defined]
    worker = threading.Thread(
        target=health.read_back,
        args=(job, "fake", rig.provider, sent.provider_message_id),
        kwargs={"raw": raw},
        name="send-worker",
    )

    def the_worker_marks() -> None:
        worker.start()
        assert writing.wait(timeout=10)
        if timing == "within-the-read":
            worker.join(timeout=10)

    if timing == "marked-before":
        the_worker_marks()
    else:
        store.meanwhile.hook = the_worker_marks
    health.refresh(["fake"])
    kept.set()
    worker.join(timeout=10)
    assert not worker.is_alive() and not rig.ledger.handle_reliable("fake")
    assert not health.reliable("fake") and health.unreliable() == ["fake"]
    health.refresh(["fake"])  # the store says so from now on
    assert not health.reliable("fake")

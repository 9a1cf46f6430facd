"""A rendered message that does not say what its job says is never sent: refused at intake
naming the field, sent to review (`render-mismatch`) before the claim at dispatch; and a
read-back marks the provider's handle unreliable only for bytes proved to carry our
Message-ID (docs/cli.md "Message fields and validation", docs/architecture.md "The message")."""

from __future__ import annotations

import ast
import dataclasses
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from tests.unit.engine_rig import EngineRig, policy, receipt
from tests.unit.test_services import job, services

import ledger.message as message
import ledger.wire_check as wire_check
from daemon.engine.readback import ProviderHealth
from daemon.providers.base import SendOutcome
from daemon.service_layer.intake import IntakeError, check_messages
from ledger.content import JobContent
from ledger.message import render
from ledger.mime import MessageFields, render_message
from ledger.vocabulary import EscalationReason, JobState
from policies.loader import PolicySet


@pytest.fixture
def rig() -> Iterator[EngineRig]:
    rig = EngineRig(policy("receipts"))
    yield rig
    rig.close()


def bad_writer(fields: MessageFields) -> bytes:
    """A writer with a bug: it adds a Bcc recipient the job does not have."""
    raw = render_message(fields)
    return raw.replace(b"\r\nSubject:", b"\r\nBcc: evil@attacker.example\r\nSubject:", 1)


@pytest.fixture
def injecting_writer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wire_check, "render_message", bad_writer)


def test_a_mismatch_at_dispatch_is_review_and_nothing_is_sent(
    rig: EngineRig, injecting_writer: None
) -> None:
    rig.submit("receipts", "k1")
    rig.tick()
    job = rig.job("k1")
    assert (job.state, job.reason) == (JobState.REVIEW, EscalationReason.RENDER_MISMATCH)
    assert job.reason == "render-mismatch"
    assert rig.provider.sends == 0
    assert rig.events("k1") == ["Requested", "Escalated"]  # never claimed


def test_a_mismatch_at_intake_is_a_refusal_naming_the_field(injecting_writer: None) -> None:
    channel = policy("receipts")
    with pytest.raises(IntakeError) as info:
        check_messages(
            PolicySet({"receipts": channel}),
            [receipt("receipts", "k1")],
            [channel.sender],
            {},
            batch=False,
            at=datetime(2026, 11, 1, tzinfo=UTC),
        )
    [problem] = info.value.problems
    assert problem.field == "bcc" and "rendered message differs" in problem.reason


def test_a_read_back_marks_the_handle_only_for_bytes_that_carry_our_message_id(
    rig: EngineRig,
) -> None:
    rig.provider.replaces_message_id = True
    health = ProviderHealth(rig.ledger, rig.clock)
    rig.submit("receipts", "k1")
    job = rig.job("k1")
    proved = render(job)
    # The Message-ID pushed into the body by a header block that ended early: the
    # provider assigning its own says nothing about how it treats ours.
    lost = proved.replace(b"\r\nMessage-ID:", b"\r\n\r\nMessage-ID:", 1)
    sent = rig.provider.send_raw(lost)
    assert sent.provider_message_id is not None
    health.read_back(job, "fake", rig.provider, sent.provider_message_id, raw=lost)
    handle = rig.ledger.handle("fake")
    assert handle is None or handle.reliable
    sent = rig.provider.send_raw(proved)
    assert sent.provider_message_id is not None
    health.read_back(job, "fake", rig.provider, sent.provider_message_id, raw=proved)
    handle = rig.ledger.handle("fake")
    assert handle is not None and not handle.reliable


def counted_proofs(monkeypatch: pytest.MonkeyPatch) -> list[bytes | None]:
    """What every proof `render_checked` makes gave, in order: the bytes, or None for a
    message the proof refused."""
    proved: list[bytes | None] = []

    def counting(fields: MessageFields) -> bytes:
        proved.append(None)
        checked = wire_check.checked_message(fields)
        proved[-1] = checked
        return checked

    monkeypatch.setattr(message, "checked_message", counting)
    return proved


def sent_bytes(rig: EngineRig, monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """The bytes handed to the provider, in order."""
    sent: list[bytes] = []
    send = rig.provider.send_raw

    def sending(raw: bytes) -> SendOutcome:
        sent.append(raw)
        return send(raw)

    monkeypatch.setattr(rig.provider, "send_raw", sending)
    return sent


def test_a_message_the_intake_proved_is_sent_as_proved_without_a_second_proof(
    rig: EngineRig, monkeypatch: pytest.MonkeyPatch
) -> None:
    proved = counted_proofs(monkeypatch)
    sent = sent_bytes(rig, monkeypatch)
    door = services(rig)
    valid = door.intake.validate(job("k1", "receipts"))
    rig.clock.advance(5)  # the job is created at the time its message was proved
    door.record(valid, by="ops")
    assert len(proved) == 1  # the intake's
    assert rig.job("k1").proved_by == message.writer_fingerprint()
    rig.tick()
    assert rig.job("k1").state is JobState.CONFIRMED
    assert len(proved) == 1  # the claim only rendered it
    assert sent == proved  # the very bytes the intake proved, its Date included


def test_a_message_another_writer_proved_is_proved_again_at_its_claim(
    rig: EngineRig, monkeypatch: pytest.MonkeyPatch
) -> None:
    proved = counted_proofs(monkeypatch)
    services(rig).submit(job("k1", "receipts"), by="ops")
    # A new release with a bug in its writer takes over the job the old one proved.
    monkeypatch.setattr(message, "writer_fingerprint", lambda: "another release")
    monkeypatch.setattr(wire_check, "render_message", bad_writer)
    rig.tick()
    job_now = rig.job("k1")
    assert (job_now.state, job_now.reason) == (JobState.REVIEW, EscalationReason.RENDER_MISMATCH)
    assert len(proved) == 2 and rig.provider.sends == 0


def test_a_job_not_submitted_through_the_intake_is_proved_at_its_claim(
    rig: EngineRig, monkeypatch: pytest.MonkeyPatch
) -> None:
    proved = counted_proofs(monkeypatch)
    rig.submit("receipts", "k1")  # straight to the ledger: nothing proved its message
    assert rig.job("k1").proved_by == ""
    rig.tick()
    assert len(proved) == 1 and rig.job("k1").state is JobState.CONFIRMED


def test_content_the_store_would_give_back_otherwise_is_proved_at_its_claim(
    rig: EngineRig, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The claim renders the content as the store returns it: were that not the content
    # the intake proved, its proof would not be the claim's.
    loaded = JobContent.from_canonical
    altered = lambda fields: dataclasses.replace(loaded(fields), subject="other")  # noqa: E731
    monkeypatch.setattr(JobContent, "from_canonical", staticmethod(altered))
    services(rig).submit(job("k1", "receipts"), by="ops")
    monkeypatch.setattr(JobContent, "from_canonical", staticmethod(loaded))
    assert rig.job("k1").proved_by == ""


def test_a_batch_keeps_its_order_and_each_message_is_sent_as_proved(
    rig: EngineRig, monkeypatch: pytest.MonkeyPatch
) -> None:
    proved = counted_proofs(monkeypatch)
    sent = sent_bytes(rig, monkeypatch)
    keys = ["k3", "k1", "k2"]  # not in the order of their keys
    services(rig).submit([job(key, "receipts") for key in keys], by="ops")
    created = [rig.job(key).created_on for key in keys]
    assert created == sorted(created) and len(set(created)) == 3  # due in the batch's order
    rig.tick()
    assert [rig.job(key).state for key in keys] == [JobState.CONFIRMED] * 3
    assert sorted(sent) == sorted(p for p in proved if p is not None) and len(proved) == 3


def test_the_writer_is_known_only_by_its_sources(tmp_path: Path) -> None:
    # Without the sources (compiled files only) no fingerprint: every claim proves again.
    assert message.sources_fingerprint(tmp_path) == ""
    (tmp_path / "message.py").write_text("x = 1\n")
    first = message.sources_fingerprint(tmp_path)
    assert len(first) == 32
    (tmp_path / "mime.py").write_text("y = 2\n")  # any change of the package's code
    assert message.sources_fingerprint(tmp_path) not in ("", first)


def test_the_writer_is_known_by_the_libraries_it_calls_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A new release of idna may map a stored domain to other ASCII: another writer.
    assert message.WRITER_LIBRARIES == ("idna",)
    ours, library = tmp_path / "ledger", tmp_path / "site" / "maplib"
    ours.mkdir()
    library.mkdir(parents=True)
    (ours / "message.py").write_text("x = 1\n")
    (library / "__init__.py").write_text("VERSION = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    alone = message.sources_fingerprint(ours)
    first = message.sources_fingerprint(ours, ["maplib"])
    assert first not in ("", alone)
    (library / "__init__.py").write_text("VERSION = 2\n")
    assert message.sources_fingerprint(ours, ["maplib"]) not in ("", first)
    # A library that cannot be found: no fingerprint, every claim proves.
    assert message.sources_fingerprint(ours, ["no_such_library_here"]) == ""


# A process that loaded the ledger, then had its installed sources replaced (an upgrade in
# place, `pip install .` into the running service's venv), before it first asked for its
# fingerprint: the fingerprint must not name the new sources, which it does not run.
_LOADED_THEN_UPGRADED = """
import sys
from pathlib import Path
folder = Path(sys.argv[1])
import ledger.{first}                     # what the process loaded at its start
if sys.argv[2] == "upgrade":
    (folder / "mime.py").write_text((folder / "mime.py").read_text() + "# the next release\\n")
import ledger.message as message          # the first claim, or the first submission
print(repr(message.writer_fingerprint()))
print(repr(message.sources_fingerprint(folder, message.WRITER_LIBRARIES)))
"""


@pytest.mark.parametrize("first", ["message", "content"])
def test_a_process_names_the_writer_it_runs_not_sources_installed_after_it_loaded(
    tmp_path: Path, first: str
) -> None:
    # "message": the daemon (dispatch imports the writer at its start), whose first claim
    # comes after the upgrade: it still names the writer it imported. "content":
    # `sendledger api`, whose intake loads the job's validation at its start and the
    # writer at its first submission, after the upgrade: a mix of two releases, which
    # names none (every claim proves). Naming the new sources would let this process
    # send the new release's jobs with its old writer unproved, or stamp jobs its old
    # validation read as proved by the new release's writer.
    package = tmp_path / "ledger"
    shutil.copytree(Path(message.__file__).parent, package,
                    ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    script = _LOADED_THEN_UPGRADED.replace("{first}", first)

    def fingerprints(change: str) -> list[str]:
        run = subprocess.run(
            [sys.executable, "-B", "-c", script, str(package), change],
            env={**os.environ, "PYTHONPATH": str(tmp_path)},
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        return [ast.literal_eval(line) for line in run.stdout.splitlines()]

    before, on_disk = fingerprints("none")
    assert before == on_disk != ""  # sources unchanged: the process names them
    claimed, on_disk = fingerprints("upgrade")
    assert on_disk not in ("", before)  # the new sources are there
    assert claimed == (before if first == "message" else "")

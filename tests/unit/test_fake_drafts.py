"""The in-memory drafts provider keeps Gmail's draft semantics (the integration tests show
them on the emulator): one message per draft, a consumed draft gone, checks at once."""

from __future__ import annotations

from email.message import EmailMessage

from daemon.doubles.fake_drafts import FakeDraftsProvider
from daemon.doubles.fake_provider import FakeProvider, Scripted
from daemon.doubles.fake_time import FakeClock
from daemon.providers.base import SendKind
from daemon.providers.draft_handle import DraftStatus, drafts_of

MID = "<job-1@mail.example.com>"


def raw(message_id: str = MID) -> bytes:
    msg = EmailMessage()
    msg["From"] = "a@example.com"
    msg["To"] = "b@example.com"
    msg["Message-ID"] = message_id
    msg.set_content("hi")
    return msg.as_bytes()


def test_it_is_a_drafts_provider_and_the_plain_fake_is_not(clock: FakeClock) -> None:
    assert drafts_of(FakeDraftsProvider(clock=clock)) is not None
    assert drafts_of(FakeProvider(clock=clock)) is None


def test_a_lost_request_leaves_the_draft_and_a_person_can_delete_it(clock: FakeClock) -> None:
    provider = FakeDraftsProvider(clock=clock, replaces_message_id=True)
    draft = provider.create_draft(raw())
    provider.script(Scripted.lost_request())
    provider.send_draft(draft)
    assert provider.check_draft(draft).status is DraftStatus.PENDING
    assert provider.find_drafts(MID) == [draft]
    provider.delete_by_person(draft.draft_id)
    assert provider.check_draft(draft).status is DraftStatus.GONE
    assert provider.delete_draft(draft.draft_id) is False
    sent = provider.create_draft(raw())
    assert provider.send_draft(sent).kind is SendKind.CONFIRMED
    assert provider.check_draft(sent).message_id_header != MID  # replaced, still found

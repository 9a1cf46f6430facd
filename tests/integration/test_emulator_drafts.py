"""The Gmail emulator's drafts (drafts.create / get / send / list / delete) against the real
google-api-python-client, and `rewrite_message_id` on both send paths (issue 20: a draft id
is a key Gmail itself enforces: at most one message per draft).

Effects are counted in the acceptance log: one line per message actually sent."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from googleapiclient.errors import HttpError
from googleapiclient.http import MediaInMemoryUpload
from tests.integration.test_emulator import (
    READ,
    SEND,
    USER,
    b64,
    gmail,
    message,
    sa_credentials,
)

from testkit.gmail_emulator import GmailEmulator
from testkit.relay import classify

COMPOSE = "https://www.googleapis.com/auth/gmail.compose"
MID = "<job-1@mail.example.com>"


@pytest.fixture
def drafts_api(emulator: GmailEmulator, service_account_file: Path) -> Any:
    return gmail(emulator, sa_credentials(service_account_file, [COMPOSE, READ]))


def logged(emulator: GmailEmulator) -> list[dict[str, Any]]:
    log = emulator._acceptance_log
    assert log is not None
    if not log.exists():
        return []
    return [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()]


def create(api: Any, raw: bytes, **message: Any) -> dict[str, Any]:
    body = {"message": {"raw": b64(raw), **message}}
    draft: dict[str, Any] = api.users().drafts().create(userId="me", body=body).execute()
    return draft


def test_create_gives_a_draft_and_a_message_id_and_sends_nothing(
    drafts_api: Any, emulator: GmailEmulator
) -> None:
    draft = create(drafts_api, message(MID))
    assert draft["id"].startswith("r") and draft["message"]["labelIds"] == ["DRAFT"]
    got = drafts_api.users().drafts().get(userId="me", id=draft["id"]).execute()
    assert got["message"]["id"] == draft["message"]["id"]
    headers = {h["name"]: h["value"] for h in got["message"]["payload"]["headers"]}
    assert headers["Message-ID"] == MID
    assert emulator.accepted() == [] and logged(emulator) == []
    # A draft is not a sent copy: the daemon's search (SENT) does not see it.
    listed = (
        drafts_api.users()
        .messages()
        .list(userId="me", q=f"rfc822msgid:{MID}", labelIds=["SENT"])
        .execute()
    )
    assert "messages" not in listed


def test_send_consumes_the_draft_once(drafts_api: Any, emulator: GmailEmulator) -> None:
    draft = create(drafts_api, message(MID))
    sent = drafts_api.users().drafts().send(userId="me", body={"id": draft["id"]}).execute()
    assert sent["id"] == draft["message"]["id"] and sent["labelIds"] == ["SENT"]
    with pytest.raises(HttpError) as again:
        drafts_api.users().drafts().send(userId="me", body={"id": draft["id"]}).execute()
    assert again.value.resp.status == 404
    with pytest.raises(HttpError) as gone:
        drafts_api.users().drafts().get(userId="me", id=draft["id"]).execute()
    assert gone.value.resp.status == 404
    copy = (
        drafts_api.users()
        .messages()
        .get(userId="me", id=sent["id"], format="metadata", metadataHeaders=["Message-ID"])
        .execute()
    )
    assert copy["labelIds"] == ["SENT"]
    assert [(e["message_id"], e["via"]) for e in logged(emulator)] == [(MID, "drafts.send")]
    assert emulator.copies(MID) == 1


def test_the_sent_draft_is_searchable_after_the_lag(
    drafts_api: Any, emulator: GmailEmulator
) -> None:
    emulator.set_lag(60)
    draft = create(drafts_api, message(MID))
    drafts_api.users().drafts().send(userId="me", body={"id": draft["id"]}).execute()
    query = drafts_api.users().messages().list(userId="me", q=f"rfc822msgid:{MID}")
    assert "messages" not in query.execute()
    emulator.set_lag(0)
    # The lag was fixed at the send: still hidden; messages.get sees it at once.
    assert "messages" not in query.execute()
    assert drafts_api.users().messages().get(userId="me", id=draft["message"]["id"]).execute()


def test_a_draft_without_recipients_is_not_sent(drafts_api: Any, emulator: GmailEmulator) -> None:
    raw = message(MID).replace(b"To: a@example.org\r\n", b"")
    draft = create(drafts_api, raw)
    with pytest.raises(HttpError) as refused:
        drafts_api.users().drafts().send(userId="me", body={"id": draft["id"]}).execute()
    assert refused.value.resp.status == 400
    assert emulator.drafts(USER) == {draft["id"]: draft["message"]["id"]}
    assert emulator.accepted() == []


def test_list_and_delete(drafts_api: Any, emulator: GmailEmulator) -> None:
    first = create(drafts_api, message(MID))
    second = create(drafts_api, message("<job-2@mail.example.com>"))
    listed = drafts_api.users().drafts().list(userId="me").execute()
    assert [d["id"] for d in listed["drafts"]] == [second["id"], first["id"]]
    found = drafts_api.users().drafts().list(userId="me", q=f"rfc822msgid:{MID}").execute()
    assert [d["message"]["id"] for d in found["drafts"]] == [first["message"]["id"]]
    paged = drafts_api.users().drafts().list(userId="me", maxResults=1).execute()
    rest = (
        drafts_api.users()
        .drafts()
        .list(userId="me", maxResults=1, pageToken=paged["nextPageToken"])
        .execute()
    )
    assert [d["id"] for d in paged["drafts"] + rest["drafts"]] == [second["id"], first["id"]]
    drafts_api.users().drafts().delete(userId="me", id=first["id"]).execute()
    with pytest.raises(HttpError) as gone:
        drafts_api.users().drafts().send(userId="me", body={"id": first["id"]}).execute()
    assert gone.value.resp.status == 404
    with pytest.raises(HttpError) as twice:
        drafts_api.users().drafts().delete(userId="me", id=first["id"]).execute()
    assert twice.value.resp.status == 404
    with pytest.raises(HttpError):
        drafts_api.users().messages().get(userId="me", id=first["message"]["id"]).execute()
    assert emulator.drafts(USER) == {second["id"]: second["message"]["id"]}
    assert emulator.accepted() == []


def test_upload_create_and_thread(drafts_api: Any, emulator: GmailEmulator) -> None:
    sent = (
        drafts_api.users()
        .messages()
        .send(userId="me", body={"raw": b64(message("<job-0@mail.example.com>"))})
        .execute()
    )
    media = MediaInMemoryUpload(message(MID), mimetype="message/rfc822")
    upload = (
        drafts_api.users()
        .drafts()
        .create(userId="me", body={"message": {"threadId": sent["threadId"]}}, media_body=media)
    )
    assert "/upload/gmail/v1/users/me/drafts" in upload.uri
    # The discovery document's upload root is https; the emulator here speaks http.
    upload.uri = upload.uri.replace("https://", "http://", 1)
    draft = upload.execute()
    assert draft["message"]["threadId"] == sent["threadId"]


def test_drafts_need_a_compose_scope(emulator: GmailEmulator, service_account_file: Path) -> None:
    send_only = gmail(emulator, sa_credentials(service_account_file, [SEND, READ]))
    with pytest.raises(HttpError) as refused:
        create(send_only, message(MID))
    assert refused.value.resp.status == 403


@pytest.mark.parametrize("path", ["messages", "drafts"])
def test_rewrite_message_id_on_both_paths(
    drafts_api: Any, emulator: GmailEmulator, service_account_file: Path, path: str
) -> None:
    emulator.rewrite_message_id = True
    if path == "messages":
        api = gmail(emulator, sa_credentials(service_account_file, [SEND, READ]))
        sent = api.users().messages().send(userId="me", body={"raw": b64(message(MID))}).execute()
    else:
        draft = create(drafts_api, message(MID))
        got = drafts_api.users().drafts().get(userId="me", id=draft["id"]).execute()
        kept = {h["name"]: h["value"] for h in got["message"]["payload"]["headers"]}
        assert kept["Message-ID"] == MID  # the draft keeps ours; sending replaces it
        sent = drafts_api.users().drafts().send(userId="me", body={"id": draft["id"]}).execute()
        assert sent["id"] == draft["message"]["id"]  # the draft's handle still finds it
    copy = (
        drafts_api.users()
        .messages()
        .get(userId="me", id=sent["id"], format="metadata", metadataHeaders=["Message-ID"])
        .execute()
    )
    header = {h["name"]: h["value"] for h in copy["payload"]["headers"]}["Message-ID"]
    assert header != MID and header.endswith("@mail.gmail.com>")
    assert emulator.copies(MID) == 0 and len(emulator.accepted()) == 1


def test_the_relay_counts_drafts_send_as_a_send() -> None:
    assert classify("POST", "/gmail/v1/users/me/drafts/send") == "send"
    assert classify("POST", "/gmail/v1/users/me/drafts") == "other"
    assert classify("POST", "/v1.0/users/a%40b/messages/AAk=/send") == "send"
    assert classify("POST", "/v1.0/users/a@b/sendMail") == "send"
    assert classify("GET", "/v1.0/users/a@b/mailFolders/sentitems/messages?$filter=x") == "search"

"""The Gmail emulator against the real Google client stack (google-auth, httplib2,
google-api-python-client) and against bare http.client where the stack cannot reach."""

from __future__ import annotations

import argparse
import base64
import http.client
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import google.auth.transport.requests
import google_auth_httplib2
import httplib2
import pytest
from google.oauth2 import credentials as user_credentials
from google.oauth2 import service_account
from googleapiclient.discovery import build
from googleapiclient.errors import HttpError
from googleapiclient.http import MediaInMemoryUpload

from daemon.cli.testkit_doubles import register
from testkit.credentials import write_authorized_user, write_service_account
from testkit.gmail_emulator import GmailEmulator

SEND = "https://www.googleapis.com/auth/gmail.send"
READ = "https://www.googleapis.com/auth/gmail.readonly"
METADATA = "https://www.googleapis.com/auth/gmail.metadata"
USER = "support@example.com"


def message(
    message_id: str | None = "<job-1@mail.example.com>", *, to: str = "a@example.org"
) -> bytes:
    lines = [f"From: Support <{USER}>", f"To: {to}", "Subject: =?utf-8?q?Caf=C3=A9?="]
    if message_id is not None:
        lines.append(f"Message-ID: {message_id}")
    lines += [
        "MIME-Version: 1.0",
        'Content-Type: text/plain; charset="UTF-8"',
        "",
        "hello <world>",
        "",
    ]
    return "\r\n".join(lines).encode()


def b64(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


@pytest.fixture
def emulator(tmp_path: Path) -> Iterator[GmailEmulator]:
    with GmailEmulator(acceptance_log=tmp_path / "accepted.jsonl") as emu:
        yield emu


@pytest.fixture
def sa_file(tmp_path: Path, emulator: GmailEmulator) -> Path:
    return write_service_account(tmp_path / "sa.json", token_uri=emulator.token_uri)


def sa_credentials(path: Path, scopes: list[str] | None = None, subject: str | None = USER) -> Any:
    # google-auth's credentials are unannotated (no-untyped-call, here and below).
    return service_account.Credentials.from_service_account_file(  # type: ignore[no-untyped-call]
        str(path), scopes=scopes or [SEND, READ], subject=subject
    )


def gmail(emulator: GmailEmulator, creds: Any) -> Any:
    http = google_auth_httplib2.AuthorizedHttp(creds, http=httplib2.Http(timeout=5))
    return build(
        "gmail",
        "v1",
        http=http,
        client_options={"api_endpoint": emulator.url},
        static_discovery=True,
    )


@pytest.fixture
def service(emulator: GmailEmulator, sa_file: Path) -> Any:
    return gmail(emulator, sa_credentials(sa_file))


def request(
    emulator: GmailEmulator,
    method: str,
    path: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, str], Any]:
    parts = urlsplit(emulator.url)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=5)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        data = response.read()
        return response.status, dict(response.getheaders()), json.loads(data) if data else None
    finally:
        conn.close()


def bearer(emulator: GmailEmulator) -> dict[str, str]:
    form = "grant_type=refresh_token&client_id=c&client_secret=s&refresh_token=r"
    status, _, body = request(
        emulator,
        "POST",
        "/token",
        form.encode(),
        {"Content-Type": "application/x-www-form-urlencoded"},
    )
    assert status == 200
    return {"Authorization": f"Bearer {body['access_token']}"}


def list_ids(service: Any, q: str, **kwargs: Any) -> list[str]:
    result = service.users().messages().list(userId="me", q=q, **kwargs).execute()
    return [m["id"] for m in result.get("messages", [])]


# -- OAuth -------------------------------------------------------------------------------


def test_service_account_jwt_grant_with_google_auth(emulator: GmailEmulator, sa_file: Path) -> None:
    creds = sa_credentials(sa_file)
    creds.refresh(google.auth.transport.requests.Request())

    assert creds.token.startswith("ya29.")
    assert creds.valid
    [record] = emulator.token_requests
    assert record["grant_type"] == "urn:ietf:params:oauth:grant-type:jwt-bearer"
    assert record["sub"] == USER
    assert record["iss"] == "sendledger@test-project.iam.gserviceaccount.com"
    assert set(record["scope"].split()) == {SEND, READ}
    assert record["status"] == 200
    assert oct(sa_file.stat().st_mode & 0o777) == "0o600"


def test_authorized_user_refresh_grant(emulator: GmailEmulator, tmp_path: Path) -> None:
    path = write_authorized_user(tmp_path / "user.json", token_uri=emulator.token_uri)
    info = json.loads(path.read_text())
    # Built by hand: google-auth's from_authorized_user_info ignores the file's token_uri.
    creds = user_credentials.Credentials(  # type: ignore[no-untyped-call]
        token=None,
        refresh_token=info["refresh_token"],
        client_id=info["client_id"],
        client_secret=info["client_secret"],
        token_uri=info["token_uri"],
    )
    creds.refresh(google.auth.transport.requests.Request())  # type: ignore[no-untyped-call]

    assert creds.token
    [record] = emulator.token_requests
    assert record["grant_type"] == "refresh_token"
    assert record["client_id"] == info["client_id"]
    assert record["client_secret"] == "***"


@pytest.mark.parametrize(
    ("form", "error"),
    [
        (
            "grant_type=urn%3Aietf%3Aparams%3Aoauth%3Agrant-type%3Ajwt-bearer&assertion=x",
            "invalid_grant",
        ),
        ("grant_type=refresh_token&client_id=c", "invalid_grant"),
        ("grant_type=password&username=u", "unsupported_grant_type"),
    ],
)
def test_malformed_token_request_is_400(emulator: GmailEmulator, form: str, error: str) -> None:
    status, _, body = request(
        emulator,
        "POST",
        "/token",
        form.encode(),
        {"Content-Type": "application/x-www-form-urlencoded"},
    )
    assert status == 400
    assert body["error"] == error
    assert emulator.token_requests[-1]["status"] == 400


def test_gmail_without_token_is_401_in_gmail_shape(emulator: GmailEmulator) -> None:
    status, headers, body = request(emulator, "GET", "/gmail/v1/users/me/messages")
    assert status == 401
    assert body["error"]["code"] == 401
    assert body["error"]["status"] == "UNAUTHENTICATED"
    assert body["error"]["errors"][0]["reason"] == "authError"
    assert headers["WWW-Authenticate"].startswith("Bearer")

    status, _, _ = request(
        emulator, "GET", "/gmail/v1/users/me/messages", headers={"Authorization": "Bearer made-up"}
    )
    assert status == 401


def test_no_auth_mode_serves_without_token(tmp_path: Path) -> None:
    with GmailEmulator(require_auth=False) as emu:
        status, _, body = request(emu, "GET", "/gmail/v1/users/me/messages")
    assert status == 200
    assert body == {"resultSizeEstimate": 0}


def test_expired_tokens_are_refreshed_by_the_client(emulator: GmailEmulator, service: Any) -> None:
    service.users().messages().list(userId="me").execute()
    emulator.expire_tokens()
    service.users().messages().list(userId="me").execute()

    assert [r["status"] for r in emulator.token_requests] == [200, 200]


def test_scopes_and_delegation_are_enforced(emulator: GmailEmulator, sa_file: Path) -> None:
    metadata_only = gmail(emulator, sa_credentials(sa_file, scopes=[METADATA]))
    with pytest.raises(HttpError) as caught:
        list_ids(metadata_only, "rfc822msgid:x@y")
    assert caught.value.resp.status == 403
    with pytest.raises(HttpError) as caught:
        metadata_only.users().messages().send(userId="me", body={"raw": b64(message())}).execute()
    assert caught.value.resp.status == 403

    no_subject = gmail(emulator, sa_credentials(sa_file, subject=None))
    with pytest.raises(HttpError) as caught:
        no_subject.users().messages().list(userId="me").execute()
    assert caught.value.resp.status == 400

    delegated = gmail(emulator, sa_credentials(sa_file))
    with pytest.raises(HttpError) as caught:
        delegated.users().messages().list(userId="other@example.com").execute()
    assert caught.value.resp.status == 403


# -- messages.send ---------------------------------------------------------------------------


def test_send_raw_json_keeps_message_id_and_logs_acceptance(
    emulator: GmailEmulator, service: Any, tmp_path: Path
) -> None:
    raw = message()
    sent = service.users().messages().send(userId=USER, body={"raw": b64(raw)}).execute()

    assert len(sent["id"]) == 16
    assert int(sent["id"], 16) >= 0
    assert sent["labelIds"] == ["SENT"]
    assert emulator.copies("<job-1@mail.example.com>") == 1
    lines = (tmp_path / "accepted.jsonl").read_text().splitlines()
    [entry] = [json.loads(line) for line in lines]
    assert entry == emulator.accepted()[0]
    assert entry["id"] == sent["id"]
    assert entry["user"] == USER
    assert entry["message_id"] == "<job-1@mail.example.com>"
    assert entry["subject"] == "Café"
    assert entry["to"] == "a@example.org"
    assert entry["via"] == "send"
    assert entry["at"].endswith("Z")
    assert len(entry["raw_sha256"]) == 64


def test_send_via_media_and_multipart_upload(emulator: GmailEmulator, service: Any) -> None:
    # googleapiclient keeps https:// for upload URLs even with an http api_endpoint, so the
    # request it builds is sent with its scheme corrected.
    first = service.users().messages().send(userId="me", body={"raw": b64(message())}).execute()
    upload = (
        service.users()
        .messages()
        .send(
            userId="me",
            body={"threadId": first["threadId"]},
            media_body=MediaInMemoryUpload(
                message("<job-2@mail.example.com>"), mimetype="message/rfc822"
            ),
        )
    )
    assert "uploadType=multipart" in upload.uri
    upload.uri = upload.uri.replace("https://", "http://", 1)
    multipart = upload.execute()
    assert multipart["threadId"] == first["threadId"]

    raw = message("<job-3@mail.example.com>")
    status, _, media = request(
        emulator,
        "POST",
        "/upload/gmail/v1/users/me/messages/send?uploadType=media",
        raw,
        {"Content-Type": "message/rfc822", **bearer(emulator)},
    )
    assert status == 200
    assert [e["via"] for e in emulator.accepted()] == ["send", "upload", "upload"]
    assert emulator.copies("<job-2@mail.example.com>") == 1
    # The stored copy is byte-for-byte what was uploaded.
    stored = service.users().messages().get(userId="me", id=multipart["id"], format="raw").execute()
    assert base64.urlsafe_b64decode(stored["raw"]) == message("<job-2@mail.example.com>")
    assert emulator.accepted()[2]["id"] == media["id"]


def test_send_without_recipient_or_raw_is_400(emulator: GmailEmulator, service: Any) -> None:
    no_to = b"From: a@example.com\r\nSubject: x\r\nMessage-ID: <n@x>\r\n\r\nbody\r\n"
    with pytest.raises(HttpError) as caught:
        service.users().messages().send(userId="me", body={"raw": b64(no_to)}).execute()
    assert caught.value.resp.status == 400
    with pytest.raises(HttpError) as caught:
        service.users().messages().send(userId="me", body={}).execute()
    assert caught.value.resp.status == 400
    assert emulator.accepted() == []


def test_message_without_message_id_gets_one(emulator: GmailEmulator, service: Any) -> None:
    service.users().messages().send(userId="me", body={"raw": b64(message(None))}).execute()
    [entry] = emulator.accepted()
    assert entry["message_id"].endswith("@mail.gmail.com>")


def test_rewrite_message_id_replaces_the_callers_header(sa_file: Path, tmp_path: Path) -> None:
    with GmailEmulator(rewrite_message_id=True) as emu:
        sa = write_service_account(tmp_path / "sa2.json", token_uri=emu.token_uri)
        service = gmail(emu, sa_credentials(sa))
        sent = service.users().messages().send(userId="me", body={"raw": b64(message())}).execute()
        got = (
            service.users()
            .messages()
            .get(userId="me", id=sent["id"], format="metadata", metadataHeaders=["Message-ID"])
            .execute()
        )

        assert emu.copies("<job-1@mail.example.com>") == 0
        [header] = got["payload"]["headers"]
        assert header["value"] == emu.accepted()[0]["message_id"]
        assert header["value"].endswith("@mail.gmail.com>")
        assert list_ids(service, "rfc822msgid:<job-1@mail.example.com>") == []


# -- messages.list / get ---------------------------------------------------------------------


def test_search_sees_a_message_only_after_the_index_lag(
    emulator: GmailEmulator, service: Any
) -> None:
    emulator.set_lag(0.3)
    sent = service.users().messages().send(userId="me", body={"raw": b64(message())}).execute()

    empty = (
        service.users()
        .messages()
        .list(userId="me", q="rfc822msgid:<job-1@mail.example.com>")
        .execute()
    )
    assert empty == {"resultSizeEstimate": 0}
    # get is immediate, and so is listing by label alone
    assert service.users().messages().get(userId="me", id=sent["id"], format="minimal").execute()
    assert [
        m["id"] for m in service.users().messages().list(userId="me").execute()["messages"]
    ] == [sent["id"]]

    time.sleep(0.35)
    for q in (
        "rfc822msgid:<job-1@mail.example.com>",
        "rfc822msgid:job-1@mail.example.com",
        'rfc822msgid:"<JOB-1@Mail.Example.com>"',
    ):
        assert list_ids(service, q, labelIds=["SENT"], includeSpamTrash=True) == [sent["id"]], q
    assert list_ids(service, "rfc822msgid:<job-1@mail.example.co>") == []


def test_paging_walks_every_message_newest_first(emulator: GmailEmulator, service: Any) -> None:
    ids = [emulator.inject(message(f"<p{i}@x>"), user=USER) for i in range(7)]
    seen: list[str] = []
    token: str | None = None
    pages = 0
    while True:
        result = (
            service.users().messages().list(userId="me", maxResults=3, pageToken=token).execute()
        )
        assert result["resultSizeEstimate"] == 7
        seen += [m["id"] for m in result["messages"]]
        pages += 1
        token = result.get("nextPageToken")
        if token is None:
            break
    assert pages == 3
    assert seen == list(reversed(ids))


def test_label_filter_and_spam_trash(emulator: GmailEmulator, service: Any) -> None:
    raw = message()
    sent = emulator.inject(raw, user=USER)
    inbox = emulator.inject(raw, labels=["INBOX", "UNREAD"], user=USER)
    trashed = emulator.inject(raw, labels=["SENT", "TRASH"], user=USER)
    emulator.inject(raw, user="someone-else@example.com")
    q = "rfc822msgid:<job-1@mail.example.com>"

    assert set(list_ids(service, q)) == {sent, inbox}
    assert list_ids(service, q, labelIds=["SENT"]) == [sent]
    assert set(list_ids(service, q, labelIds=["SENT"], includeSpamTrash=True)) == {sent, trashed}
    assert list_ids(service, q, labelIds=["SENT", "UNREAD"]) == []
    assert set(list_ids(service, f"{q} in:anywhere")) == {sent, inbox, trashed}
    assert emulator.copies("<job-1@mail.example.com>") == 4


def test_get_formats(emulator: GmailEmulator, service: Any) -> None:
    sent = service.users().messages().send(userId="me", body={"raw": b64(message())}).execute()
    get = service.users().messages().get

    minimal = get(userId="me", id=sent["id"], format="minimal").execute()
    assert "payload" not in minimal
    assert minimal["labelIds"] == ["SENT"]
    assert minimal["snippet"] == "hello &lt;world&gt;"
    assert int(minimal["internalDate"]) > 0

    metadata = get(
        userId="me", id=sent["id"], format="metadata", metadataHeaders=["message-id", "Subject"]
    ).execute()
    assert metadata["payload"]["headers"] == [
        {"name": "Subject", "value": "Café"},
        {"name": "Message-ID", "value": "<job-1@mail.example.com>"},
    ]

    full = get(userId="me", id=sent["id"], format="full").execute()
    assert full["payload"]["mimeType"] == "text/plain"
    assert len(full["payload"]["headers"]) == 6
    assert base64.urlsafe_b64decode(full["payload"]["body"]["data"]).startswith(b"hello <world>")

    raw = get(userId="me", id=sent["id"], format="raw").execute()
    assert base64.urlsafe_b64decode(raw["raw"]) == message()
    assert raw["sizeEstimate"] == len(message())

    with pytest.raises(HttpError) as caught:
        get(userId="me", id="0123456789abcdef").execute()
    assert caught.value.resp.status == 404
    assert json.loads(caught.value.content)["error"]["errors"][0]["reason"] == "notFound"


def test_mailboxes_are_per_user(tmp_path: Path) -> None:
    with GmailEmulator(require_auth=False) as emu:
        send = "/gmail/v1/users/{}/messages/send"
        body = json.dumps({"raw": b64(message())}).encode()
        assert request(emu, "POST", send.format("alice%40example.com"), body)[0] == 200
        assert request(emu, "POST", send.format("me"), body)[0] == 200
        q = "?q=rfc822msgid%3Ajob-1%40mail.example.com"
        _, _, alice = request(emu, "GET", "/gmail/v1/users/ALICE@example.com/messages" + q)
        _, _, bob = request(emu, "GET", "/gmail/v1/users/bob@example.com/messages" + q)
        _, _, me = request(emu, "GET", "/gmail/v1/users/me/messages" + q)
    assert alice["resultSizeEstimate"] == 1
    assert bob == {"resultSizeEstimate": 0}
    assert me["resultSizeEstimate"] == 1
    assert {e["user"] for e in emu.accepted()} == {"alice@example.com", "me"}


def test_connections_are_kept_alive(emulator: GmailEmulator) -> None:
    auth = bearer(emulator)
    parts = urlsplit(emulator.url)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=5)
    try:
        for _ in range(3):
            conn.request("GET", "/gmail/v1/users/me/messages", headers=auth)
            response = conn.getresponse()
            assert response.status == 200
            assert json.loads(response.read()) == {"resultSizeEstimate": 0}
            sock = conn.sock
            assert sock is not None
    finally:
        conn.close()


def test_unsupported_query_terms_fail_loudly(emulator: GmailEmulator, service: Any) -> None:
    with pytest.raises(HttpError) as caught:
        list_ids(service, "hello")
    assert caught.value.resp.status == 400


# -- CLI ---------------------------------------------------------------------------------


def cli_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sendledger")
    register(parser.add_subparsers(dest="command", required=True))
    return parser


@pytest.mark.parametrize(
    ("argv", "option"),
    [
        (["emulator", "gmail", "--lag", "soon"], "--lag"),
        (["emulator", "gmail", "--port", "99999"], "--port"),
        (["relay", "--upstream", "ftp://x", "--port", "0"], "--upstream"),
        (["relay", "--upstream", "http://127.0.0.1:1", "--send", "explode"], "--send"),
        (["relay", "--upstream", "http://127.0.0.1:1", "--send-mix", "pass=1"], "--send-mix"),
        (
            ["relay", "--upstream", "http://127.0.0.1:1", "--seed", "1", "--send-mix", "pass"],
            "--send-mix",
        ),
        (["relay", "--upstream", "http://127.0.0.1:1", "--hang", "-1"], "--hang"),
        (["relay", "--upstream", "http://127.0.0.1:1", "--slow", "2d"], "--slow"),
    ],
)
def test_cli_bad_input_is_one_line_and_exit_2(
    argv: list[str], option: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args = cli_parser().parse_args(argv)
    assert args.func(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert option in err


def test_cli_runs_the_emulator_until_sigterm(tmp_path: Path) -> None:
    script = (
        "import argparse, sys\n"
        "from daemon.cli.testkit_doubles import register\n"
        "p = argparse.ArgumentParser()\n"
        "register(p.add_subparsers(dest='command', required=True))\n"
        "a = p.parse_args(sys.argv[1:])\n"
        "sys.exit(a.func(a))\n"
    )
    log = tmp_path / "cli.jsonl"
    sa = tmp_path / "cli-sa.json"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            script,
            "emulator",
            "gmail",
            "--port",
            "0",
            "--lag",
            "250ms",
            "--accept-log",
            str(log),
            "--no-auth",
            "--write-service-account",
            str(sa),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:")
        assert json.loads(sa.read_text())["token_uri"] == url + "/token"
        parts = urlsplit(url)
        conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=5)
        conn.request(
            "POST", "/gmail/v1/users/me/messages/send", json.dumps({"raw": b64(message())})
        )
        assert conn.getresponse().status == 200
        conn.close()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=5) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert json.loads(log.read_text())["message_id"] == "<job-1@mail.example.com>"

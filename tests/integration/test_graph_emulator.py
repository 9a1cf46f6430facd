"""The Graph emulator's own contract (testkit/graph_emulator.py), spoken to over HTTPS with plain
requests: what a Graph client can rely on, and what the provider tests build on."""

from __future__ import annotations

import argparse
import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import requests

from daemon.cli.testkit_doubles import register
from testkit.graph_emulator import (
    DEFAULT_CLIENT_ID,
    DEFAULT_CLIENT_SECRET,
    DEFAULT_TENANT,
    GRAPH_SCOPE,
    GraphEmulator,
    odata_literal,
)
from testkit.tls import TlsFiles, make_loopback_tls

MAILBOX = "a@example.com"
IMMUTABLE = {"Prefer": 'IdType="ImmutableId"'}


def mime(message_id: str = "<m1@example.com>") -> bytes:
    return (
        f"From: {MAILBOX}\r\nTo: b@example.com\r\nSubject: s\r\nMessage-ID: {message_id}\r\n"
        "\r\nbody\r\n"
    ).encode()


class Client:
    def __init__(self, emulator: GraphEmulator, tls: TlsFiles) -> None:
        self.emulator = emulator
        self.session = requests.Session()
        self.session.verify = str(tls.ca_file)
        self.session.trust_env = False  # else REQUESTS_CA_BUNDLE would replace `verify`
        answer = self.session.post(
            f"{emulator.authority}/{DEFAULT_TENANT}/oauth2/v2.0/token",
            data={
                "grant_type": "client_credentials",
                "client_id": DEFAULT_CLIENT_ID,
                "client_secret": DEFAULT_CLIENT_SECRET,
                "scope": GRAPH_SCOPE,
            },
        )
        assert answer.status_code == 200, answer.text
        self.session.headers["Authorization"] = "Bearer " + answer.json()["access_token"]

    def call(self, method: str, path: str, **kwargs: Any) -> requests.Response:
        url = f"{self.emulator.api_endpoint}/users/{MAILBOX}{path}"
        return self.session.request(method, url, **kwargs)

    def create(self, raw: bytes, *, immutable: bool = True) -> dict[str, Any]:
        headers = {"Content-Type": "text/plain", **(IMMUTABLE if immutable else {})}
        answer = self.call("POST", "/messages", data=base64.b64encode(raw), headers=headers)
        assert answer.status_code == 201, answer.text
        data: dict[str, Any] = answer.json()
        return data

    def filtered(self, folder: str, message_id: str) -> list[dict[str, Any]]:
        query = quote(f"internetMessageId eq {odata_literal(message_id)}", safe="")
        answer = self.call(
            "GET", f"/mailFolders/{folder}/messages?$filter={query}", headers=IMMUTABLE
        )
        assert answer.status_code == 200, answer.text
        value: list[dict[str, Any]] = answer.json()["value"]
        return value


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    return make_loopback_tls(tmp_path_factory.mktemp("graph-emulator-tls"))


@pytest.fixture
def emulator(tls: TlsFiles, tmp_path: Path) -> Iterator[GraphEmulator]:
    with GraphEmulator(tls=tls, acceptance_log=tmp_path / "accepted.jsonl") as emu:
        yield emu


@pytest.fixture
def client(emulator: GraphEmulator, tls: TlsFiles) -> Iterator[Client]:
    # Closed here, not left to the garbage collector: its kept connection would hold one
    # of the emulator's threads in a read past the teardown (thread_guard's 10 s, seen
    # under a load of 20).
    made = Client(emulator, tls)
    with made.session:
        yield made


def test_tenant_discovery_points_at_the_token_endpoint(
    emulator: GraphEmulator, tls: TlsFiles
) -> None:
    url = f"{emulator.authority}/{DEFAULT_TENANT}/v2.0/.well-known/openid-configuration"
    config = requests.get(url, verify=str(tls.ca_file)).json()
    assert config["token_endpoint"] == f"{emulator.url}/{DEFAULT_TENANT}/oauth2/v2.0/token"
    other = requests.get(url.replace(DEFAULT_TENANT, "nope"), verify=str(tls.ca_file))
    assert other.status_code == 400


@pytest.mark.parametrize(
    ("form", "status", "error"),
    [
        ({"client_secret": "wrong"}, 401, "invalid_client"),
        ({"client_id": "unknown"}, 400, "unauthorized_client"),
        ({"scope": "Mail.Send"}, 400, "invalid_scope"),
        ({"grant_type": "password"}, 400, "unsupported_grant_type"),
    ],
)
def test_token_refusals(
    emulator: GraphEmulator, tls: TlsFiles, form: dict[str, str], status: int, error: str
) -> None:
    data = {
        "grant_type": "client_credentials",
        "client_id": DEFAULT_CLIENT_ID,
        "client_secret": DEFAULT_CLIENT_SECRET,
        "scope": GRAPH_SCOPE,
        **form,
    }
    answer = requests.post(
        f"{emulator.authority}/{DEFAULT_TENANT}/oauth2/v2.0/token",
        data=data,
        verify=str(tls.ca_file),
    )
    assert (answer.status_code, answer.json()["error"]) == (status, error)


def test_api_needs_a_token(emulator: GraphEmulator, tls: TlsFiles) -> None:
    answer = requests.get(
        f"{emulator.api_endpoint}/users/{MAILBOX}/messages", verify=str(tls.ca_file)
    )
    assert answer.status_code == 401
    assert answer.json()["error"]["code"] == "InvalidAuthenticationToken"


def test_a_draft_is_sent_once_and_keeps_its_immutable_id(
    client: Client, emulator: GraphEmulator
) -> None:
    draft = client.create(mime())
    assert draft["isDraft"] is True and draft["internetMessageId"] == "<m1@example.com>"
    assert emulator.copies("<m1@example.com>") == 0
    sent = client.call("POST", f"/messages/{draft['id']}/send", headers=IMMUTABLE)
    assert (sent.status_code, sent.content) == (202, b"")
    again = client.call("POST", f"/messages/{draft['id']}/send", headers=IMMUTABLE)
    assert again.status_code == 400  # filed: no longer a draft
    copy = client.call("GET", f"/messages/{draft['id']}", headers=IMMUTABLE).json()
    assert (copy["id"], copy["isDraft"], copy["parentFolderId"]) == (
        draft["id"],
        False,
        "sentitems",
    )
    assert emulator.copies("<m1@example.com>") == 1


def test_in_transit_the_id_answers_404_and_a_second_send_sends_nothing(
    client: Client, emulator: GraphEmulator
) -> None:
    emulator.set_file_delay(60)
    draft = client.create(mime())
    assert client.call("POST", f"/messages/{draft['id']}/send", headers=IMMUTABLE).ok
    assert client.call("GET", f"/messages/{draft['id']}", headers=IMMUTABLE).status_code == 404
    again = client.call("POST", f"/messages/{draft['id']}/send", headers=IMMUTABLE)
    assert again.status_code == 404
    assert emulator.copies("<m1@example.com>") == 1


def test_without_immutable_ids_the_id_changes_when_filed(
    client: Client, emulator: GraphEmulator
) -> None:
    draft = client.create(mime(), immutable=False)
    assert client.call("POST", f"/messages/{draft['id']}/send").status_code == 202
    # The draft's (mutable) id named it in Drafts; filed in Sent Items it has another.
    assert client.call("GET", f"/messages/{draft['id']}").status_code == 404
    listed = client.call("GET", "/mailFolders/sentitems/messages").json()["value"]
    assert [m["id"] for m in listed] != [draft["id"]]
    [immutable] = client.filtered("sentitems", "<m1@example.com>")
    assert client.call("GET", f"/messages/{immutable['id']}", headers=IMMUTABLE).ok


def test_filter_sees_a_copy_only_after_the_lag(client: Client, emulator: GraphEmulator) -> None:
    emulator.set_lag(60)
    draft = client.create(mime())
    client.call("POST", f"/messages/{draft['id']}/send", headers=IMMUTABLE)
    assert client.filtered("sentitems", "<m1@example.com>") == []
    assert [m["id"] for m in emulator.folder(MAILBOX, "sentitems")] == [draft["id"]]
    assert client.call("GET", f"/messages/{draft['id']}", headers=IMMUTABLE).ok


def test_filter_is_exact_and_refuses_other_filters(client: Client) -> None:
    client.create(mime("<o'neil@example.com>"))
    client.create(mime("<other@example.com>"))
    [draft] = client.filtered("drafts", "<o'neil@example.com>")
    assert draft["internetMessageId"] == "<o'neil@example.com>"
    refused = client.call("GET", "/messages?$filter=" + quote("subject eq 's'"))
    assert refused.status_code == 400


def test_send_mail_answers_202_without_an_id(client: Client, emulator: GraphEmulator) -> None:
    answer = client.call(
        "POST", "/sendMail", data=base64.b64encode(mime()), headers={"Content-Type": "text/plain"}
    )
    assert (answer.status_code, answer.content) == (202, b"")
    [entry] = emulator.accepted()
    assert (entry["via"], entry["message_id"]) == ("sendMail", "<m1@example.com>")
    assert len(client.filtered("sentitems", "<m1@example.com>")) == 1


def test_rewrite_message_id_on_both_paths(client: Client, emulator: GraphEmulator) -> None:
    emulator.rewrite_message_id = True
    draft = client.create(mime())
    assert draft["internetMessageId"] == "<m1@example.com>"  # kept until it is sent
    client.call("POST", f"/messages/{draft['id']}/send", headers=IMMUTABLE)
    client.call(
        "POST", "/sendMail", data=base64.b64encode(mime()), headers={"Content-Type": "text/plain"}
    )
    assert emulator.copies("<m1@example.com>") == 0
    assert len({entry["message_id"] for entry in emulator.accepted()}) == 2
    assert client.filtered("sentitems", "<m1@example.com>") == []


def test_a_deleted_draft_is_in_deleted_items_until_deleted_there(
    client: Client, emulator: GraphEmulator
) -> None:
    """Graph's DELETE moves an item to Deleted Items (a draft stays a draft there, sendable
    by its id); deleted from Deleted Items, it is gone for good and cannot be sent."""
    draft = client.create(mime())
    assert client.call("DELETE", f"/messages/{draft['id']}", headers=IMMUTABLE).status_code == 204
    [moved] = emulator.folder(MAILBOX, "deleteditems")
    assert (moved["id"], moved["isDraft"]) == (draft["id"], True)
    assert client.call("DELETE", f"/messages/{draft['id']}", headers=IMMUTABLE).status_code == 204
    assert client.call("DELETE", f"/messages/{draft['id']}", headers=IMMUTABLE).status_code == 404
    sent = client.call("POST", f"/messages/{draft['id']}/send", headers=IMMUTABLE)
    assert sent.status_code == 404
    assert emulator.accepted() == []


def test_with_recoverable_items_a_purged_draft_is_still_read_by_id_and_not_deleted_again(
    client: Client, emulator: GraphEmulator
) -> None:
    """`recoverable_items`: deleted from Deleted Items, a draft lies in Recoverable Items,
    where its id still answers it (a draft, its folder the id `GET
    mailFolders/recoverableitemsdeletions` gives), a send is 404 and a DELETE is refused, 403
    `ErrorCannotDeleteObject`; `refuse_delete` refuses every DELETE of one id, the item
    left where it is."""
    emulator.recoverable_items = True
    draft = client.create(mime())
    for _ in (1, 2):  # to Deleted Items, then to Recoverable Items
        answer = client.call("DELETE", f"/messages/{draft['id']}", headers=IMMUTABLE)
        assert answer.status_code == 204
    folder = client.call("GET", "/mailFolders/recoverableitemsdeletions?$select=id").json()
    read = client.call("GET", f"/messages/{draft['id']}", headers=IMMUTABLE).json()
    assert (read["isDraft"], read["parentFolderId"]) == (True, folder["id"])
    refused = client.call("DELETE", f"/messages/{draft['id']}", headers=IMMUTABLE)
    assert (refused.status_code, refused.json()["error"]["code"]) == (
        403,
        "ErrorCannotDeleteObject",
    )
    sent = client.call("POST", f"/messages/{draft['id']}/send", headers=IMMUTABLE)
    assert sent.status_code == 404
    held = client.create(mime("<m2@example.com>"))
    emulator.refuse_delete[held["id"]] = (403, "ErrorAccessDenied")
    refused = client.call("DELETE", f"/messages/{held['id']}", headers=IMMUTABLE)
    assert (refused.status_code, refused.json()["error"]["code"]) == (403, "ErrorAccessDenied")
    assert [m["id"] for m in emulator.folder(MAILBOX, "drafts")] == [held["id"]]
    assert emulator.accepted() == []


def test_a_refused_delete_may_say_when_to_ask_again_and_a_folder_may_answer_404(
    client: Client, emulator: GraphEmulator
) -> None:
    """`refuse_delete_retry_after` adds a Retry-After to `refuse_delete`'s refusals, and a
    well-known folder named in `folders_unanswered` is answered 404 until it is not: the
    provider tests of a refusal for now and of a folder asked again rest on both."""
    held = client.create(mime())
    emulator.refuse_delete[held["id"]] = (403, "ErrorAccessDenied")
    emulator.refuse_delete_retry_after = 2
    refused = client.call("DELETE", f"/messages/{held['id']}", headers=IMMUTABLE)
    assert (refused.status_code, refused.headers["Retry-After"]) == (403, "2")
    path = "/mailFolders/recoverableitemsdeletions?$select=id"
    emulator.folders_unanswered.add("recoverableitemsdeletions")
    assert client.call("GET", path).status_code == 404
    emulator.folders_unanswered.clear()
    assert client.call("GET", path).json()["id"] == "recoverableitemsdeletions"


def test_a_draft_in_deleted_items_can_still_be_sent(
    client: Client, emulator: GraphEmulator
) -> None:
    draft = client.create(mime())
    assert client.call("DELETE", f"/messages/{draft['id']}", headers=IMMUTABLE).status_code == 204
    sent = client.call("POST", f"/messages/{draft['id']}/send", headers=IMMUTABLE)
    assert sent.status_code == 202
    assert len(emulator.accepted()) == 1


def test_throttle_answers_429_and_does_nothing(client: Client, emulator: GraphEmulator) -> None:
    emulator.throttle(1, retry_after=2)
    answer = client.call(
        "POST",
        "/messages",
        data=base64.b64encode(mime()),
        headers={"Content-Type": "text/plain", **IMMUTABLE},
    )
    assert (answer.status_code, answer.headers["Retry-After"]) == (429, "2")
    assert emulator.folder(MAILBOX, "drafts") == []
    assert client.create(mime())["isDraft"] is True


def test_paging_and_the_acceptance_log(client: Client, emulator: GraphEmulator) -> None:
    for _ in range(3):
        draft = client.create(mime())
        client.call("POST", f"/messages/{draft['id']}/send", headers=IMMUTABLE)
    query = quote(f"internetMessageId eq {odata_literal('<m1@example.com>')}", safe="")
    page = client.call(
        "GET", f"/mailFolders/sentitems/messages?$filter={query}&$top=2", headers=IMMUTABLE
    ).json()
    assert len(page["value"]) == 2
    rest = client.session.get(page["@odata.nextLink"], headers=IMMUTABLE).json()
    assert len(rest["value"]) == 1 and "@odata.nextLink" not in rest
    log = emulator._acceptance_log
    assert log is not None
    lines = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines()]
    assert [line["via"] for line in lines] == ["send"] * 3


def test_access_policy(client: Client, emulator: GraphEmulator) -> None:
    emulator.mailboxes = {"other@example.com"}
    answer = client.call("GET", "/messages")
    assert (answer.status_code, answer.json()["error"]["code"]) == (403, "ErrorAccessDenied")


@pytest.mark.parametrize(
    ("argv", "option"),
    [
        (["emulator", "graph", "--lag", "soon"], "--lag"),
        (["emulator", "graph", "--port", "99999"], "--port"),
        (["emulator", "graph", "--file-delay", "-1"], "--file-delay"),
        (
            ["emulator", "graph", "--client-secret-file", "/nonexistent/secret"],
            "--client-secret-file",
        ),
    ],
)
def test_cli_bad_input_is_one_line_and_exit_2(
    argv: list[str], option: str, capsys: pytest.CaptureFixture[str]
) -> None:
    parser = argparse.ArgumentParser(prog="sendledger")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    assert args.func(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and option in err

"""Form fields and query parameters at the doors are UTF-8 text, or refused naming the
field (docs/review.md "Review page", docs/http-api.md "Errors and statuses"): bytes that
are not UTF-8 were read as U+FFFD (multipart: as Latin-1) and a note nobody typed was
stored in the trail, or a filter nobody asked for listed nothing."""

# ruff: noqa: F811 - the tests take the imported fixtures by name

from __future__ import annotations

from html import unescape

import pytest
from fastapi.testclient import TestClient
from tests.unit.engine_rig import EngineRig
from tests.unit.test_api_fails_cleanly import client, rig  # noqa: F401
from tests.unit.test_api_routes import AUTH, in_review, job

from daemon.api import form_text
from ledger.display import printable
from ledger.vocabulary import JobState

FORM = {"content-type": "application/x-www-form-urlencoded"}


def _trail(client: TestClient, key: str) -> str:
    return str(client.get(f"/v1/jobs/{key}/events", headers=AUTH).json())


@pytest.mark.parametrize(
    ("path", "body", "field", "byte"),
    [
        ("/ui/jobs/k1/resolve", b"as=abandon&note=caf%E9", "note", 0xE9),
        ("/ui/jobs/k1/resolve", b"as=abandon&note=caf%C3", "note", 0xC3),
        ("/ui/jobs/k1/cancel", b"note=%FF", "note", 0xFF),
        ("/ui/jobs/k1/resolve", b"as=abandon&n%E9te=x", "form", 0xE9),
        ("/ui/triage", b"channel=caf%E9&mode=resolve", "channel", 0xE9),
        ("/ui/sign-in", b"token=caf%E9", "token", 0xE9),
    ],
)
def test_a_page_form_field_that_is_not_utf8_is_refused_naming_it(
    rig: EngineRig, client: TestClient, path: str, body: bytes, field: str, byte: int
) -> None:
    """`note=caf%E9` (a Latin-1 client's `café`) was stored as `caf\ufffd`: the job was
    abandoned with a note nobody typed. Now 422, the page's line naming the field and
    the byte, and nothing written."""
    in_review(rig, client, "k1", copy=False)
    before = _trail(client, "k1")
    answer = client.post(path, content=body, headers={**AUTH, **FORM}, follow_redirects=False)
    assert answer.status_code == 422, answer.text
    assert answer.headers["content-type"].startswith("text/html")
    # A name that is not text itself is shown by its escapes (a backslash shown doubled).
    assert f"{printable(field)}: not UTF-8 text (byte 0x{byte:02x})" in unescape(answer.text)
    assert rig.job("k1").state is JobState.REVIEW
    assert _trail(client, "k1") == before


def test_a_multipart_field_that_is_not_utf8_is_refused_not_read_as_latin1(
    rig: EngineRig, client: TestClient
) -> None:
    """A multipart form's field that is not UTF-8 was read as Latin-1: `caf\\xe9` stored
    as `café` on a guess. Refused as the urlencoded one is."""
    in_review(rig, client, "k1", copy=False)
    body = (
        b'--XX\r\nContent-Disposition: form-data; name="as"\r\n\r\nabandon\r\n'
        b'--XX\r\nContent-Disposition: form-data; name="note"\r\n\r\ncaf\xe9\r\n--XX--\r\n'
    )
    headers = {**AUTH, "content-type": "multipart/form-data; boundary=XX"}
    answer = client.post("/ui/jobs/k1/resolve", content=body, headers=headers)
    assert answer.status_code == 422, answer.text
    assert "note: not UTF-8 text (byte 0xe9)" in unescape(answer.text)
    assert rig.job("k1").state is JobState.REVIEW


def test_a_form_s_raw_utf8_bytes_are_read_as_utf8(rig: EngineRig, client: TestClient) -> None:
    """`curl -d 'note=café'` sends `é` unescaped, as its UTF-8 bytes: Starlette read them
    as Latin-1, and `cafÃ©` was stored. Now the note is what was typed."""
    in_review(rig, client, "k1", copy=False)
    body = "as=abandon&note=café+ok".encode()
    answer = client.post(
        "/ui/jobs/k1/resolve", content=body, headers={**AUTH, **FORM}, follow_redirects=False
    )
    assert answer.status_code == 303, answer.text
    assert rig.job("k1").state is JobState.ABANDONED
    assert "café ok" in _trail(client, "k1") and "Ã" not in _trail(client, "k1")


@pytest.mark.parametrize(
    ("url", "field"),
    [
        ("/v1/jobs?channel=caf%E9", "channel"),
        ("/v1/jobs?state=review&cursor=%FF", "cursor"),
        ("/v1/review?channel=caf%C3", "channel"),
        ("/ui/search?q=caf%E9", "q"),
        ("/ui/?channel=caf%E9", "channel"),
    ],
)
def test_a_query_parameter_that_is_not_utf8_is_refused_naming_it(
    client: TestClient, url: str, field: str
) -> None:
    """`GET /v1/jobs?channel=caf%E9` read `caf\ufffd` and listed no job, as if channel
    `café` had none. Now 422 naming the parameter, as a key in a path is refused."""
    client.post("/v1/jobs", json=job("k1", channel="legal"), headers=AUTH)
    answer = client.get(url, headers=AUTH)
    assert answer.status_code == 422, answer.text
    assert answer.json()["errors"][0]["field"] == field
    assert "not UTF-8 text" in answer.json()["error"]


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/ui/jobs/k1/resolve", b"as=maybe", "as"),
        ("/ui/jobs/k1/resolve", b"as=abandon&version=x1", "version"),
        ("/ui/jobs/k1/cancel", b"version=0", "version"),
        ("/ui/triage", b"channel=a%00b&mode=resolve", "channel"),
        ("/ui/triage", b"reason=maybe&mode=resolve", "reason"),
    ],
)
def test_every_page_refusal_names_its_field(
    rig: EngineRig, client: TestClient, path: str, body: bytes, field: str
) -> None:
    """The page said `Choose sent, resend or abandon.`, `The form is damaged.` and `No such
    channel or reason.`, naming no field (the API names each). Now each line starts with
    the field, and nothing is recorded."""
    in_review(rig, client, "k1", copy=False)
    before = _trail(client, "k1")
    answer = client.post(path, content=body, headers={**AUTH, **FORM}, follow_redirects=False)
    assert answer.status_code == 422, answer.text
    assert f'<p class="box">{field}: ' in unescape(answer.text), answer.text
    assert _trail(client, "k1") == before


#: More fields than the form parser takes (Starlette's `max_fields`, which FastAPI keeps).
MANY = 200_000


@pytest.mark.parametrize("kind", ["urlencoded", "multipart"])
def test_a_form_of_more_fields_than_the_parser_takes_is_not_scanned_whole(
    rig: EngineRig, client: TestClient, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    """The form parser refuses a form of more than 1000 fields (400) after reading 1001;
    the UTF-8 check before it read every one, on the event loop and before the sign-in:
    a 40 MB body of `a=b&` pairs held every request of the API for about 13 s. Now it
    stops where the parser does, and the form is refused as before, nothing recorded."""
    in_review(rig, client, "k1", copy=False)
    before = _trail(client, "k1")
    seen: list[bytes] = []
    checked = form_text._checked

    def counted(name: bytes, value: bytes) -> form_text.NotText | None:
        seen.append(name)
        return checked(name, value)

    monkeypatch.setattr(form_text, "_checked", counted)
    if kind == "urlencoded":
        body = b"as=abandon&" + b"a=b&" * MANY + b"note=caf%E9"
        headers = {**AUTH, **FORM}
    else:
        part = b'--XX\r\nContent-Disposition: form-data; name="a"\r\n\r\nb\r\n'
        body = part * MANY + b"--XX--\r\n"
        headers = {**AUTH, "content-type": "multipart/form-data; boundary=XX"}
    answer = client.post("/ui/jobs/k1/resolve", content=body, headers=headers)
    assert answer.status_code == 400, answer.text
    assert len(seen) <= form_text.MAX_FIELDS + 1, len(seen)
    assert rig.job("k1").state is JobState.REVIEW
    assert _trail(client, "k1") == before


def test_a_field_the_form_does_not_have_is_not_shown_back(
    rig: EngineRig, client: TestClient
) -> None:
    """The refusal is answered before the sign-in and the CSRF check, to any browser: a
    page of another site that posted a form (`accept-charset="ISO-8859-1"`) whose field
    was named with a sentence of its own, its value `é`, had the review page show that
    sentence as its refusal, on the daemon's own origin. The line names a field of the
    form's own only; another is `form: ... (a field the form does not have)`."""
    in_review(rig, client, "k1", copy=False)
    said = "Your session ended: sign in again at https://attacker.example"
    body = b"as=abandon&" + said.encode().replace(b" ", b"+") + b"=%E9"
    answer = client.post("/ui/jobs/k1/resolve", content=body, headers=FORM)
    assert answer.status_code == 422, answer.text
    assert "attacker.example" not in answer.text
    line = f"form: not UTF-8 text (byte 0xe9): {form_text.HOW} (a field the form does not have)"
    assert line in unescape(answer.text)
    assert rig.job("k1").state is JobState.REVIEW

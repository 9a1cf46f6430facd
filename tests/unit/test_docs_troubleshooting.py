"""docs/troubleshooting.md against the code: each of the ten errors the page quotes is made
here the way a newcomer makes it (in this process, on a folder `sendledger init` wrote),
and what sendledger says is the page's line, word for word (the folder written as
/srv/mail, a port as 8025, content hashes as `sha256:...`)."""

from __future__ import annotations

import contextlib
import io
import json
import re
import signal
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from tests.unit import docs_page
from tests.unit.engine_rig import EngineRig, policy
from tests.unit.test_api_routes import api_context

from daemon import runtime
from daemon.api.app import create_app
from daemon.bootstrap import bootstrap
from daemon.cli import main
from daemon.from_settings import load_policies, open_ledger, settings_for
from ledger.stores import IdentityTaken
from testkit.credentials import write_service_account

PAGE = docs_page.DOCS / "troubleshooting.md"


def quoted() -> dict[str, str]:
    """Each numbered section's title and the one line its code block quotes."""
    text = PAGE.read_text(encoding="utf-8")
    found = re.findall(r"^### \d+\. (.+)\n\n```\n(.+)\n```$", text, re.M)
    return dict(found)


def test_the_page_has_ten_errors() -> None:
    assert len(quoted()) == 10
    assert [
        int(n) for n in re.findall(r"^### (\d+)\. ", PAGE.read_text(encoding="utf-8"), re.M)
    ] == list(range(1, 11))


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.delenv("SENDLEDGER_CONFIG", raising=False)
    folder = tmp_path / "site"
    assert said("init", str(folder), "--mailbox", "support@example.com", cwd=tmp_path)[0] == 0
    return folder


@contextlib.contextmanager
def _handlers_kept() -> Iterator[None]:
    """`run` installs its signal handlers: the test process keeps its own."""
    kept = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for signum, handler in kept.items():
            signal.signal(signum, handler)


def said(*argv: str, cwd: Path, stdin: str = "") -> tuple[int, str]:
    """Exit code and stderr of `sendledger ARGV` run in this process."""
    err = io.StringIO()
    with (
        contextlib.chdir(cwd),
        contextlib.redirect_stderr(err),
        contextlib.redirect_stdout(io.StringIO()),
        _handlers_kept(),
        _stdin(stdin),
    ):
        code = main(list(argv))
    return code, err.getvalue().strip()


@contextlib.contextmanager
def _stdin(text: str) -> Iterator[None]:
    import sys

    before = sys.stdin
    sys.stdin = io.StringIO(text)
    try:
        yield
    finally:
        sys.stdin = before


def shown(text: str, folder: Path) -> str:
    return text.replace(str(folder), "/srv/mail")


def test_no_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SENDLEDGER_CONFIG", raising=False)
    empty = tmp_path / "mail"
    empty.mkdir()
    code, text = said("status", "first-job-1", cwd=empty)
    assert code == 2 and shown(text, empty) == quoted()["No config"]


def test_a_misspelled_key(site: Path) -> None:
    path = site / "sendledger.toml"
    path.write_text(
        path.read_text(encoding="utf-8").replace("credentials_file =", "credential_file ="),
        encoding="utf-8",
    )
    code, text = said("policy", "check", cwd=site)
    assert code == 2 and shown(text, site) == quoted()["A misspelled key"]


def test_no_credentials_file(site: Path) -> None:
    code, text = said("run", cwd=site)
    assert code == 2 and shown(text, site) == quoted()["No credentials file"]


def test_the_apis_port_is_taken(site: Path) -> None:
    write_service_account(site / "gmail-service-account.json", token_uri="http://127.0.0.1:1/t")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        path = site / "sendledger.toml"
        text = path.read_text(encoding="utf-8").replace("127.0.0.1:8025", f"127.0.0.1:{port}")
        path.write_text(text, encoding="utf-8")
        code, text = said("run", cwd=site)
    line = shown(text, site).replace(f":{port} ", ":8025 ")
    assert code == 2 and line == quoted()["The API's port is taken"]


def test_no_store_yet(site: Path) -> None:
    code, text = said("status", "first-job-1", cwd=site)
    assert code == 2 and shown(text, site) == quoted()["No store yet"]


def _job(site: Path, **change: str) -> str:
    job = json.loads((site / "first-job.json").read_text(encoding="utf-8"))
    return json.dumps({**job, **change})


def test_a_channel_without_a_policy(site: Path) -> None:
    code, text = said("submit", "-", cwd=site, stdin=_job(site, channel="receipt"))
    assert code == 2 and text == quoted()["A channel without a policy"]


def test_a_job_with_several_problems(site: Path) -> None:
    code, text = said("submit", "-", cwd=site, stdin=_job(site, to="nope", subject="a\nb"))
    assert code == 2 and text == quoted()["A job with several problems"]
    assert "job.subject: must not contain CR or LF" in PAGE.read_text(encoding="utf-8")


def test_the_same_key_with_other_content(site: Path) -> None:
    assert said("submit", str(site / "first-job.json"), cwd=site)[0] == 0
    code, text = said("submit", "-", cwd=site, stdin=_job(site, subject="Another"))
    line = re.sub(r"sha256:[0-9a-f]+", "sha256:...", text)
    assert code == 3 and line == quoted()["The same key with other content"]


def test_no_token_on_an_http_request() -> None:
    rig = EngineRig(policy("receipts"))
    try:
        with TestClient(create_app(api_context(rig))) as client:
            answer = client.post("/v1/jobs", json={})
    finally:
        rig.close()
    assert answer.status_code == 401
    assert json.dumps(answer.json()) == quoted()["No token on an HTTP request"]


def test_a_second_daemon_with_the_same_name(site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A first daemon holds the name (its lock, in this process); a second one starting on
    the same store is refused. The provider's scope check before it asks a real Google
    endpoint: the name is what this is about, so that check is left out."""
    path = site / "sendledger.toml"
    path.write_text(
        path.read_text(encoding="utf-8").replace(
            'policies_dir = "policies"', 'policies_dir = "policies"\nname = "mail-1"'
        ),
        encoding="utf-8",
    )
    write_service_account(site / "gmail-service-account.json", token_uri="http://127.0.0.1:1/t")
    monkeypatch.setattr(runtime, "check_provider_access", lambda providers: None)
    settings = settings_for(str(site / "sendledger.toml"))
    with open_ledger(settings) as first, open_ledger(settings) as second:
        held = first.hold_identity("mail-1")
        service = bootstrap(settings, ledger=second, policy_loader=lambda: load_policies(settings))
        try:
            with pytest.raises(IdentityTaken) as refused:
                runtime.start_up(service)
        finally:
            service.close()
            held.release()
    line = "sendledger: " + shown(str(refused.value), site)
    assert line == quoted()["A second daemon with the same name"]

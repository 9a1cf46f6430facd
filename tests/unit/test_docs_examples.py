"""The docs' examples run as printed: commands, config, policy, client, webhook, init, errors."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shlex
import signal
import socket
import sys
import tomllib
from datetime import UTC, datetime
from itertools import groupby
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from fastapi.testclient import TestClient
from tests.unit.docs_code import KINDS, SECTIONS, check_default
from tests.unit.docs_code import rig as rig
from tests.unit.docs_page import PAGES, REPO, block, flat, page, section
from tests.unit.engine_rig import EngineRig
from tests.unit.test_api_routes import api_context

from daemon.api.app import create_app
from daemon.bootstrap import build_provider
from daemon.cli import COMMANDS, build_parser, main
from daemon.cli.init_command import FIRST_KEY, config_text, installation, planned_files, unit_text
from daemon.config.settings import ConfigError, WebhookSettings, settings_from_dict
from daemon.from_settings import open_ledger, settings_for
from daemon.webhooks import events, signing
from ledger.addresses import parse_mailbox
from ledger.application import Ledger
from ledger.message_id import message_id_for
from ledger.stores.url import parse_store_url
from policies.durations import parse_duration
from policies.loader import PolicyLoadError, load_policy_dir, load_policy_file
from policies.model import ChannelPolicy
from testkit.credentials import write_service_account
from testkit.relay import MODES

#: The example's values that are a deployment's own, not the defaults: its store file, its
#: daemon's name (the host name by default), the Gmail user it sends as (default "me").
DEPLOYMENTS_OWN = {("store", "url"), ("daemon", "name"), ("gmail", "user")}


def commands(text: str) -> list[list[str]]:
    """The argv of each `sendledger ...` of a text's shell blocks and code spans (after `sudo`
    or a path too; continuations joined, comments, redirections and `[optional]` dropped)."""
    found = []
    spans = re.findall(r"`(sendledger [^`]+)`", flat(re.sub(r"```.*?```", "", text, flags=re.S)))
    for lines in [*re.findall(r"```sh\n(.*?)```", text, re.S), *spans]:
        for line in lines.replace("\\\n", " ").splitlines():
            lexer = shlex.shlex(re.sub(r"\[[^\]]*\]", "", line), posix=True, punctuation_chars=True)
            lexer.whitespace_split = True
            for between, group in groupby(lexer, lambda word: word in (";", "&&", "&", "|")):
                words = list(group)
                words = words[: next((i for i, w in enumerate(words) if w[0] in "<>"), None)]
                at = [i for i, w in enumerate(words) if re.fullmatch(r"(.*/bin/)?sendledger", w)]
                if not between and at and words[: at[0]] in ([], ["sudo"]):
                    found.append(words[at[0] + 1 :])
    return found


def test_the_example_config_policy_store_urls_durations_and_message_id_are_the_code_s(
    tmp_path: Path,
) -> None:
    # The example's sections by name, a provider's by its kind (from its `kind = ` line on).
    header = r'^#? ?\[([a-z]+)(?:\.[a-z0-9]+)?\]$|^(?=kind = "([a-z-]+)")'
    parts = re.split(header, page("config.example.toml"), flags=re.M)[1:]
    sections = {name or kind: text for name, kind, text in zip(*[iter(parts)] * 3, strict=True)}
    sections["http-api"] = block(section("http-api.md", "## Webhooks"), "toml")  # a hook's
    for prefix, model in (SECTIONS | KINDS | {"http-api": WebhookSettings}).items():
        # Every key; a value shown (set or commented out) where the model has one of its own
        # is that default, but for the few a deployment sets to its own on purpose.
        text = sections[prefix.split(".")[0]]
        shown = re.findall(r"^#? ?([a-z_]+) = (.+?)(?:[ \t]+#.*)?$", text, re.M)
        assert {field for field, _ in shown} == set(model.model_fields), prefix
        for field, value in shown:
            info = model.model_fields.get(field)
            default = None if info is None or info.is_required() else info.get_default()
            if default not in (None, "", []) and (prefix, field) not in DEPLOYMENTS_OWN:
                check_default(model, field, f"`{value}`", "config.example.toml")
    example = block(page("policies.md"), "toml")
    fields = {(info.alias or name) for name, info in ChannelPolicy.model_fields.items()}
    assert set(tomllib.loads(example)) == fields
    (tmp_path / "receipts.toml").write_text(example, encoding="utf-8")
    assert load_policy_file(tmp_path / "receipts.toml").give_up_after == 4 * 3600
    assert set(load_policy_dir(REPO / "examples" / "policies")) == {"payouts", "receipts"}
    quoted = re.search(r"\(`(receipts\.toml:search_after: [^`]+)`\)", page("policies.md"))
    (tmp_path / "receipts.toml").write_text(example.replace('"5m"', '"30d"', 1), encoding="utf-8")
    with pytest.raises(PolicyLoadError) as refused:
        load_policy_dir(tmp_path)
    assert quoted and str(refused.value).endswith(quoted.group(1))
    stores = section("architecture.md", "Stores")
    port = set(re.findall(r"\(`([a-z_]+)`\)", stores.split("Store URLs pick a backend", 1)[0]))
    assert port == {"jobs", "job_events", "due", "scope_leases"}  # the port's queries
    assert all(callable(getattr(Ledger, name, None)) for name in port)
    urls = re.findall(r"`((?:sqlite|postgresql|memory):[^`]*)`", stores)
    assert len(urls) == 5
    for url in urls:
        parse_store_url(url.replace("relative/path", "x.sqlite").replace("/absolute/path", "/x"))
    line = next(x for x in page("configuration.md").splitlines() if x.startswith("Durations are "))
    durations = [parse_duration(f) for f in re.findall(r'`"([^"]+)"`', line)]
    assert durations == [0.25, 30, 300, 3600, 86400], line
    text = flat(page("how-it-works.md"))
    said = re.search(r"Key `([^`]+)` on `([^`]+)` is always `([^`]+)`", text)
    assert said and message_id_for(said[1], said[2]) == said[3]
    os.mkfifo(tmp_path / "sa.json")  # a secret file that is a FIFO: refused in the page's words
    config = {"providers": {"support": {"credentials_file": "sa.json"}}}
    with pytest.raises(ConfigError) as fifo:
        build_provider(settings_from_dict(config, config_path=tmp_path / "x.toml"), "support")
    printed = str(fifo.value).replace(str(tmp_path), "/etc/sendledger")
    assert printed in flat(page("configuration.md"))


def test_the_webhook_examples_are_what_a_receiver_gets_and_the_snippet_takes_it_once(
    rig: EngineRig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = section("http-api.md", "## Webhooks")
    examples = [json.loads(example) for example in re.findall(r"```json\n(.*?)```", text, re.S)]
    rig.submit("legal", "order-1042")
    job = rig.ledger.get_job("order-1042")
    [requested] = rig.ledger.history("order-1042")
    sent = events.payload("confirmed", job, requested, events.event_id_for(job.id, job.version))
    assert all(list(example) == list(sent) for example in examples)
    [rejected] = [e for e in examples if e["type"] == "rejected"]
    assert rejected["reason"] in events.REJECTED_CODES and rejected["detail"]
    [snippet] = [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "hook.verify(" in b]
    secret = signing.new_secret()
    (tmp_path / "webhook-secret").write_text(secret + "\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    handled: list[dict[str, Any]] = []
    seen = {"already_seen": lambda event_id: event_id in {e["event_id"] for e in handled}}
    scope: dict[str, Any] = {**seen, "handle": handled.append}
    exec(snippet, scope)
    body = json.dumps({"type": "confirmed", "key": "order-1042", "event_id": "evt_1_4"})
    headers = signing.signed_headers(secret, "evt_1_4", datetime.now(UTC), body)
    assert [scope["receive"](body.encode(), headers) for _ in "12"] == [204, 204]
    assert [e["key"] for e in handled] == ["order-1042"]
    assert scope["receive"](body.replace("1042", "1043").encode(), headers) == 401


def test_every_command_shown_parses_and_init_writes_what_the_pages_say(tmp_path: Path) -> None:
    quick = block(section("README.md", "## Quick start"), "sh")
    config = config_text("gmail", you := parse_mailbox("you@example.com"))
    marked = re.findall(r"^# EDIT.*\n(?:#.*\n)*([a-z_]+) =", config, re.M)
    assert marked and f"marked EDIT: {' and '.join(marked)}" in quick
    [credentials] = re.findall(r'credentials_file = "([^"]+)"', config)
    assert f"chmod 600 mail/{credentials}" in quick and f"status {FIRST_KEY} " in quick
    steps = section("operations.md", "## Running under systemd")
    written = {p.path for p in planned_files("gmail", you, installation(tmp_path))}
    assert {"sendledger.toml", "api-tokens", "sendledger.service"} <= written
    assert credentials not in written
    assert f"install -m 600 {credentials} /var/lib/sendledger/" in steps
    unit = unit_text(installation(tmp_path)).splitlines()
    packaged = page("packaging/sendledger.service").splitlines()
    watchdog = re.search(r"`(WatchdogSec=\d+)`", steps)
    assert watchdog and all({"Type=notify", watchdog.group(1)} <= set(u) for u in (unit, packaged))
    layout = re.search(r"layout of `(/opt/[^`]+)` and `(/etc/[^`]+)`", flat(steps))
    assert layout and f"ExecStart={layout[1]}/bin/sendledger --config {layout[2]} run" in packaged
    text = "\n".join(path.read_text(encoding="utf-8") for path in PAGES)
    api = set(re.findall(r"listen[`\s|=\"]+[^0-9\n]*127\.0\.0\.1:(\d+)", text))
    api |= set(re.findall(r'listen = "[^":]+:(\d+)"', config))
    emulator = set(re.findall(r"sendledger emulator \w+ --port (\d+)", text))
    relay = set(re.findall(r"sendledger relay [^\n]*?--port (\d+)", text))
    assert api and emulator and relay and not (api & emulator or api & relay or emulator & relay)
    shown = [argv for path in PAGES for argv in commands(path.read_text(encoding="utf-8"))]
    assert len(shown) > 40
    names = {"NAME": "ops", "HOST:PORT": "127.0.0.1:8025", "KEY": "k", "DIR": "d"}
    for argv in shown:  # a|b|c: one of them; a bare command's name: a mention of it
        argv = [names.get(word, word).split("|")[0] for word in argv]
        command = next((w for w in argv if not w.startswith("-") and not w.endswith(".toml")), "")
        if command == "COMMAND" or (argv == [command] and command in COMMANDS):
            continue
        args = build_parser(command).parse_args(argv)
        for kind in ("send", "search", "token", "history", "other"):
            assert set(filter(None, (getattr(args, kind, None) or "").split(","))) <= set(MODES)


def said(*argv: str, cwd: Path, stdin: str = "") -> tuple[int, str]:
    """Exit code and stderr of `sendledger ARGV` run in this process, in `cwd`."""
    err = io.StringIO()
    streams = mock.patch.multiple(sys, stdin=io.StringIO(stdin), stdout=io.StringIO(), stderr=err)
    with contextlib.chdir(cwd), streams:
        return main(list(argv)), err.getvalue().strip()


def test_the_ten_errors_are_the_lines_the_page_quotes(
    rig: EngineRig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    lines = re.findall(r"^### \d+\. (.+)\n\n```\n(.+)\n```$", page("troubleshooting.md"), re.M)
    monkeypatch.delenv("SENDLEDGER_CONFIG", raising=False)
    monkeypatch.setattr(signal, "signal", lambda *_: None)  # `run` would keep its handlers
    site, mail = tmp_path / "site", tmp_path / "mail"
    mail.mkdir()
    assert said("init", str(site), "--mailbox", "support@example.com", cwd=tmp_path)[0] == 0
    config = site / "sendledger.toml"
    job = json.loads((site / "first-job.json").read_text(encoding="utf-8"))

    def submit(**change: str) -> tuple[int, str]:
        return said("submit", "-", cwd=site, stdin=json.dumps({**job, **change}))

    made = {
        "No config": said("status", "first-job-1", cwd=mail),
        "No store yet": said("status", "first-job-1", cwd=site),
        "No credentials file": said("run", cwd=site),
        "A channel without a policy": submit(channel="receipt"),
        "A job with several problems": submit(to="nope", subject="a\nb"),
    }
    assert said("submit", str(site / "first-job.json"), cwd=site)[0] == 0
    code, text = submit(subject="Another")
    made["The same key with other content"] = (code, re.sub(r"sha256:\w+", "sha256:...", text))
    write_service_account(site / "gmail-service-account.json", token_uri="http://127.0.0.1:1/t")
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        config.write_text(config.read_text().replace("127.0.0.1:8025", f"127.0.0.1:{port}"))
        code, text = said("run", cwd=site)
    made["The API's port is taken"] = (code, text.replace(f":{port} ", ":8025 "))
    policies = 'policies_dir = "policies"'
    config.write_text(config.read_text().replace(policies, f'{policies}\nname = "mail-1"'))
    with open_ledger(settings_for(str(config))) as first:
        held = first.hold_identity("mail-1")
        made["A second daemon with the same name"] = said("run", cwd=site)
        held.release()
    config.write_text(config.read_text().replace("credentials_file =", "credential_file ="))
    made["A misspelled key"] = said("policy", "check", cwd=site)
    with TestClient(create_app(api_context(rig))) as client:
        answer = client.post("/v1/jobs", json={})
    made["No token on an HTTP request"] = (answer.status_code, json.dumps(answer.json()))
    codes = {"The same key with other content": 3, "A second daemon with the same name": 3}
    codes |= {"No token on an HTTP request": 401, "No credentials file": 1}
    codes["The API's port is taken"] = 1  # `run`: its holder may give it back (cli.md)
    assert len(lines) == 10 and set(made) == set(dict(lines))
    for title, line in lines:
        printed = made[title][1].replace(str(mail), "/srv/mail").replace(str(site), "/srv/mail")
        assert (made[title][0], printed) == (codes.get(title, 2), line), f"{title!r}"

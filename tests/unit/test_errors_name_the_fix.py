"""Errors that name the fix (docs/troubleshooting.md): an unknown channel lists the known
ones; an unknown key beside a missing one suggests it; a conflicting resubmit names the
first field that differs; a job with several problems has every one listed, by the CLI's
intake and by a 422; a secret file that is not there says what goes in it."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from hypothesis import given
from hypothesis import strategies as st
from tests.unit.engine_rig import EngineRig, policy
from tests.unit.test_api_routes import AUTH, api_context, job
from tests.unit.test_services import services

from daemon.api.app import create_app
from daemon.api.build import load_tokens
from daemon.bootstrap import build_provider
from daemon.config.settings import ConfigError, Settings, settings_from_dict
from daemon.service_layer.intake import IntakeError, parse_jobs, unknown_channel
from daemon.service_layer.problems import MAX_LISTED
from daemon.service_layer.services import ServiceError
from daemon.webhooks.delivery_threads import hooks_from
from ledger.application import KeyConflict, Ledger
from ledger.content import parse_job
from ledger.vocabulary import PolicyRef, Sender
from policies.loader import PolicySet
from testkit import write_service_account


def _refusal(data: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as refused:
        settings_from_dict(data)
    return str(refused.value)


def test_an_unknown_key_beside_a_missing_one_is_named_with_the_missing_one() -> None:
    provider = {"kind": "gmail", "credential_file": "sa.json", "user": "me"}
    said = _refusal({"providers": {"gmail": provider}})
    assert said == (
        "config: providers.gmail.credential_file: unknown key; did you mean "
        "credentials_file (required, and missing)?"
    )


@pytest.mark.parametrize(
    ("data", "suggested"),
    [
        ({"daemon": {"tik": "1s"}}, "tick"),
        ({"store": {"ulr": "sqlite:///x"}}, "url"),
        ({"providers": {"g": {"credentials_file": "x", "timout": "1s"}}}, "timeout"),
        ({"api": {"listne": "127.0.0.1:1"}}, "listen"),
        # Keys differing only in case: `[API]` or `URL` matched nothing as typed.
        ({"API": {"listen": "127.0.0.1:1"}}, "api"),
        ({"store": {"URL": "sqlite:///x"}}, "url"),
    ],
)
def test_an_unknown_key_close_to_a_known_one_suggests_it(
    data: dict[str, Any], suggested: str
) -> None:
    assert _refusal(data).endswith(f"unknown key; did you mean {suggested}?")


@pytest.mark.parametrize(
    ("table", "said"),
    [
        # Beside a missing `credentials_file`, only it was a candidate: none was said.
        ({"USER": "a@example.com"}, "providers.g.USER: unknown key; did you mean user?"),
        ({"timout": "1s"}, "providers.g.timout: unknown key; did you mean timeout?"),
        ({"credential_file": "sa.json"}, "providers.g.credential_file: unknown key; did you"
         " mean credentials_file (required, and missing)?"),
    ],
)  # fmt: skip
def test_an_unknown_key_beside_a_missing_one_may_be_any_key_of_the_section(
    table: dict[str, Any], said: str
) -> None:
    assert _refusal({"providers": {"g": {"kind": "gmail", **table}}}) == f"config: {said}"


def test_an_unknown_key_like_no_other_is_only_unknown() -> None:
    assert _refusal({"daemon": {"zzzz": 1}}) == "config: daemon.zzzz: unknown key"


def test_an_unknown_channel_lists_the_known_ones() -> None:
    rig = EngineRig(policy("receipts"), policy("notices"))
    try:
        with pytest.raises(ServiceError) as refused:
            services(rig).submit(job("k1", channel="receipt"), by="t")
    finally:
        rig.close()
    assert refused.value.message == (
        "job.channel: no policy file for channel 'receipt' (the channels: notices, receipts)"
    )
    assert unknown_channel(PolicySet(), "x").endswith("(the channels: none: the policies "
                                                      "folder holds no policy file)")  # fmt: skip


SENDER = Sender("Shop <shop@example.com>", "mail.example.com", PolicyRef("receipts", "f" * 16))
BASE = {"channel": "receipts", "key": "k1", "to": "a@example.com", "subject": "S", "body": "B"}


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"subject": "Other"}, "subject"),
        ({"to": "b@example.com"}, "to"),
        ({"body": "C", "subject": "Other"}, "subject"),  # the first in the job's order
        ({"send_at": "2030-01-01T00:00:00Z"}, "send_at"),
        ({"from": "Shop <shop@example.com>"}, "from"),
    ],
)
def test_a_conflicting_resubmit_names_the_first_field_that_differs(
    change: dict[str, str], field: str
) -> None:
    with Ledger("memory://") as ledger:
        ledger.submit(parse_job(BASE), SENDER)
        with pytest.raises(KeyConflict) as refused:
            ledger.submit(parse_job({**BASE, **change}), SENDER)
        assert refused.value.field == field
        assert f"already exists with other content: its {field} differs" in str(refused.value)
        # The same key twice in one batch, too.
        with pytest.raises(KeyConflict) as in_batch:
            ledger.submit_many(
                [
                    (parse_job({**BASE, "key": "k2"}), SENDER),
                    (parse_job({**BASE, **change, "key": "k2"}), SENDER),
                ]
            )
        assert in_batch.value.field == field


#: A broken value for each field, and how its problem starts.
BROKEN = {
    "channel": ("", "must not be empty"),
    "key": ("k\x1b", "must not contain"),
    "to": ("nope", "not a valid email address"),
    "subject": ("a\nb", "must not contain CR or LF"),
    "cc": ("nope", "not a valid email address"),
    "send_at": ("tomorrow", ""),
    "thread_id": ("a b", ""),
}


@given(st.sets(st.sampled_from(sorted(BROKEN)), min_size=1))
def test_every_problem_of_a_job_is_listed_in_the_fields_order(broken: set[str]) -> None:
    data = {**BASE, **{name: BROKEN[name][0] for name in broken}}
    with pytest.raises(IntakeError) as refused:
        parse_jobs(data)
    fields = [problem.field for problem in refused.value.problems]
    assert fields == [name for name in BASE | dict.fromkeys(BROKEN) if name in broken]
    for problem in refused.value.problems:
        assert problem.reason.startswith(BROKEN[problem.field][1]), problem
    assert refused.value.total == len(broken)


def test_unknown_and_missing_fields_are_listed_with_the_rest() -> None:
    with pytest.raises(IntakeError) as refused:
        parse_jobs({"channel": "receipts", "key": "k", "to": "nope", "subjet": "S", "body": "B"})
    assert [str(p) for p in refused.value.problems] == [
        "job.subjet: unknown field; did you mean subject?",
        "job.subject: is required",
        "job.to: not a valid email address: 'nope'",
    ]


@pytest.fixture
def client() -> Iterator[TestClient]:
    rig = EngineRig(policy("receipts"))
    with TestClient(create_app(api_context(rig))) as client:
        yield client
    rig.close()


def test_a_422_lists_every_problem_of_a_job(client: TestClient) -> None:
    body = {**job("k1", channel="receipts"), "to": "nope", "subject": "a\nb", "channel": ""}
    answer = client.post("/v1/jobs", json=body, headers=AUTH)
    assert answer.status_code == 422, answer.text
    assert answer.json()["count"] == 3
    assert [e["field"] for e in answer.json()["errors"]] == ["channel", "to", "subject"]


def test_a_422_of_many_jobs_with_many_problems_stops_listing_at_the_cap(
    client: TestClient,
) -> None:
    body = [{**job(f"k{n}", channel="receipts"), "to": "no", "subject": "a\nb"} for n in range(80)]
    answer = client.post("/v1/jobs", json=body, headers=AUTH)
    assert answer.status_code == 422
    assert answer.json()["count"] == 160 and len(answer.json()["errors"]) == MAX_LISTED


# -- secret files that are not there ---------------------------------------------------

SMTP = {
    "kind": "smtp-imap",
    "smtp_host": "smtp.example.com",
    "imap_host": "imap.example.com",
    "username": "u@example.com",
    "password_file": "mail-password",
}
GRAPH = {"kind": "graph", "tenant_id": "t-1", "client_id": "c-1", "user": "a@example.com"}

#: (the setting, its file, the config that sets it, what reads it, words of the hint)
CASES: list[tuple[str, str, dict[str, Any], Callable[[Settings], object], str]] = [
    (
        "providers.g.credentials_file",
        "sa.json",
        {"providers": {"g": {"credentials_file": "sa.json"}}},
        lambda s: build_provider(s, "g"),
        "put the provider's JSON key there, chmod 600",
    ),
    (
        "providers.m.password_file",
        "mail-password",
        {"providers": {"m": SMTP}},
        lambda s: build_provider(s, "m"),
        "put the mailbox's password there, on its first line, chmod 600 (docs/providers.md \"SMTP",
    ),
    (
        "providers.m365.client_secret_file",
        "graph-secret",
        {"providers": {"m365": {**GRAPH, "client_secret_file": "graph-secret"}}},
        lambda s: build_provider(s, "m365"),
        "put the app registration's client secret there",
    ),
    (
        "providers.m365.certificate_file",
        "graph.pem",
        {"providers": {"m365": {**GRAPH, "certificate_file": "graph.pem"}}},
        lambda s: build_provider(s, "m365"),
        "certificate and its private key there (one PEM file)",
    ),
    (
        "api.token_file",
        "api-tokens",
        {"api": {"listen": "127.0.0.1:8025", "token_file": "api-tokens"}},
        load_tokens,
        "write a name:token line there for each API user",
    ),
    (
        "webhooks.ops.secret_file",
        "hook-secret",
        {"webhooks": {"ops": {"url": "https://hooks.example.com/x", "secret_file": "hook-secret"}}},
        hooks_from,
        "write the receiver's secret there (`sendledger webhooks new-secret`), chmod 600",
    ),
]


@pytest.mark.parametrize(("setting", "file", "data", "read", "hint"), CASES, ids=lambda c: c)
def test_a_missing_secret_file_says_what_goes_in_it(
    tmp_path: Path,
    setting: str,
    file: str,
    data: dict[str, Any],
    read: Callable[[Settings], object],
    hint: str,
) -> None:
    settings = settings_from_dict(data, config_path=tmp_path / "sendledger.toml")
    with pytest.raises(ConfigError) as missing:
        read(settings)
    said = str(missing.value)
    assert f"{setting}: cannot read {tmp_path / file}: No such file or directory; " in said
    assert hint in said and "\n" not in said, said
    # There but unusable (empty): refused as before (the Gmail key by the JSON reader, one
    # level up), and nothing said of putting it there.
    (tmp_path / file).write_text("", encoding="utf-8")
    with pytest.raises((ConfigError, ValueError)) as empty:
        read(settings)
    unusable = str(empty.value)
    assert (setting in unusable or file in unusable) and "there" not in unusable, unusable


# -- a Gmail key file that is there but unusable ---------------------------------------


def test_a_gmail_key_file_that_is_no_key_names_credentials_file(tmp_path: Path) -> None:
    (tmp_path / "sa.json").write_text("{not json", encoding="utf-8")
    data = {"providers": {"g": {"credentials_file": "sa.json", "user": "a@example.com"}}}
    settings = settings_from_dict(data, config_path=tmp_path / "sendledger.toml")
    with pytest.raises(ConfigError) as bad:
        build_provider(settings, "g")
    said = str(bad.value)
    assert said.startswith(f"providers.g.credentials_file: {tmp_path / 'sa.json'}: "), said
    assert "not valid JSON" in said and "\n" not in said, said


def test_a_service_account_without_a_mailbox_address_names_user(tmp_path: Path) -> None:
    write_service_account(tmp_path / "sa.json", token_uri="http://127.0.0.1:9/token")
    data = {"providers": {"g": {"credentials_file": "sa.json", "user": "me"}}}
    settings = settings_from_dict(data, config_path=tmp_path / "sendledger.toml")
    with pytest.raises(ConfigError) as bad:
        build_provider(settings, "g")
    said = str(bad.value)
    assert said.startswith("providers.g.user: "), said
    assert "user must be that mailbox's address, not 'me'" in said, said


@pytest.mark.parametrize(
    "file_uri", ["http://oauth2.example.com/token", "HTTP://10.0.0.5/t", "http://localhost:1/t"]
)
def test_a_key_file_s_own_clear_text_token_uri_needs_allow_http(
    tmp_path: Path, file_uri: str
) -> None:
    """With `token_uri` empty the signed assertion goes to the key file's own token_uri,
    which the settings never saw: an http:// one to another host loaded, and the
    assertion went in clear text. The same rule as the setting's, naming the file's field."""
    write_service_account(tmp_path / "sa.json", token_uri=file_uri)
    table = {"credentials_file": "sa.json", "user": "a@example.com"}
    config = tmp_path / "sendledger.toml"
    settings = settings_from_dict({"providers": {"g": table}}, config_path=config)
    with pytest.raises(ConfigError) as bad:
        build_provider(settings, "g")
    said = str(bad.value)
    assert said.startswith(f"providers.g.credentials_file: {tmp_path / 'sa.json'}: "), said
    assert "its token_uri is http://" in said and "allow_http = true" in said, said
    for loads in ({"allow_http": True}, {"token_uri": "http://127.0.0.1:9/token"}):
        fine = settings_from_dict({"providers": {"g": {**table, **loads}}}, config_path=config)
        build_provider(fine, "g").close()


@pytest.mark.parametrize("file_uri", ["http://127.0.0.1:9/token", "http://[::1]:9/t"])
def test_a_key_file_s_token_uri_to_loopback_loads(tmp_path: Path, file_uri: str) -> None:
    write_service_account(tmp_path / "sa.json", token_uri=file_uri)
    table = {"credentials_file": "sa.json", "user": "a@example.com"}
    data = {"providers": {"g": table}}
    settings = settings_from_dict(data, config_path=tmp_path / "sendledger.toml")
    build_provider(settings, "g").close()

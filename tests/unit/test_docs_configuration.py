"""docs/configuration.md against the settings model, in both directions (docs/development.md
"Writing the docs"): every key of every section, its default and its range are on the page,
every key the page names exists, and config.example.toml names every key, so neither the page
nor the model can change alone."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import socket
import tomllib
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError

from daemon.bootstrap import build_provider
from daemon.cli.init_command import Installation, planned_files, summary, write_all
from daemon.config import environment
from daemon.config.secret_files import secret_files, warn_exposed_secrets
from daemon.config.settings import (
    ApiSettings,
    ConfigError,
    DaemonSettings,
    GmailProviderSettings,
    GraphProviderSettings,
    RetentionSettings,
    Settings,
    SmtpImapProviderSettings,
    StoreSettings,
    WebhookSettings,
    load_settings,
    settings_from_dict,
)
from daemon.config.sizes import parse_size
from daemon.providers.graph_credentials import read_client_secret
from daemon.providers.quota import GMAIL_GET_UNITS, GMAIL_LIST_UNITS, GMAIL_SEND_UNITS
from daemon.providers.smtp_imap import read_password_file
from daemon.webhooks.events import WEBHOOK_TYPES
from daemon.webhooks.signing import SECRET_BYTES
from ledger.addresses import parse_mailbox
from ledger.stores.index import IndexRow
from ledger.stores.library_env import APPLICATION_PREFIX, LIBRARY_VARIABLES, READ_BY_SENDLEDGER
from ledger.vocabulary import FINAL_STATES
from policies.durations import parse_duration
from policies.loader import load_policy_dir

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "configuration.md"
EXAMPLE = REPO / "config.example.toml"

#: The page's prefix of each model's keys; a provider's keys by its kind.
SECTIONS: dict[str, type[BaseModel]] = {
    "store": StoreSettings,
    "daemon": DaemonSettings,
    "api": ApiSettings,
    "retention": RetentionSettings,
    "webhooks.NAME": WebhookSettings,
}
KINDS: dict[str, type[BaseModel]] = {
    "gmail": GmailProviderSettings,
    "smtp-imap": SmtpImapProviderSettings,
    "graph": GraphProviderSettings,
}
#: What each model needs besides the key under test, so that one key can be validated alone.
STUBS: dict[type[BaseModel], dict[str, Any]] = {
    GmailProviderSettings: {"credentials_file": "sa.json"},
    SmtpImapProviderSettings: {
        "kind": "smtp-imap",
        "smtp_host": "smtp.example.com",
        "imap_host": "imap.example.com",
        "username": "u",
        "password_file": "pw",
    },
    GraphProviderSettings: {
        "kind": "graph",
        "tenant_id": "t",
        "client_id": "c",
        "user": "u@example.com",
        "client_secret_file": "secret",
    },
    WebhookSettings: {"url": "https://hooks.example.com/x", "secret_file": "whsec"},
}
#: Defaults the page says in words, and the value each stands for.
PROSE_DEFAULTS: dict[str, tuple[object, ...]] = {
    "unset": (None, ""),
    "unset (off)": (None, ""),
    "unset (any Host)": ([],),
    "required": (),
    "the host name": (socket.gethostname(),),
    "all seven": (list(WEBHOOK_TYPES),),
    "`concurrency`": (None,),
    "Google's": ("",),
    "the file's": ("",),
    "the `\\Sent` folder": ("",),
    "twice `deadline_grace`, at least `1s`": (None,),
}
REQUIRED = "required"
TABLE_KINDS = {"key": "gmail", "smtp-imap key": "smtp-imap", "graph key": "graph"}


def page() -> str:
    return PAGE.read_text(encoding="utf-8")


def tables(text: str) -> list[tuple[list[str], list[list[str]]]]:
    """(header cells, rows of cells) of every table on the page."""
    found: list[tuple[list[str], list[list[str]]]] = []
    block: list[list[str]] = []
    for line in [*text.splitlines(), ""]:
        if line.startswith("|"):
            block.append([cell.strip() for cell in line.strip().strip("|").split("|")])
            continue
        if len(block) > 2:
            found.append((block[0], block[2:]))
        block = []
    return found


def field_of(key: str, kind: str) -> tuple[type[BaseModel], str] | None:
    """The model and field a page key (`daemon.tick`, `providers.NAME.timeout`) names."""
    prefix, _, field = key.rpartition(".")
    model = KINDS[kind] if prefix == "providers.NAME" else SECTIONS.get(prefix)
    if model is None or field not in model.model_fields:
        return None
    return model, field


def model_keys() -> set[tuple[str, str]]:
    """(kind, page key) of every setting; kind is "" outside `[providers.NAME]`."""
    keys = {
        ("", f"{prefix}.{field}")
        for prefix, model in SECTIONS.items()
        for field in model.model_fields
    }
    for kind, model in KINDS.items():
        keys |= {(kind, f"providers.NAME.{field}") for field in model.model_fields}
    return keys


def page_keys() -> Iterator[tuple[str, str, str]]:
    """(kind, key, default cell) of every row of the page's settings tables."""
    for header, rows in tables(page()):
        kind = TABLE_KINDS.get(header[0])
        if kind is None or header[1] != "default":
            continue
        for row in rows:
            keys = re.findall(r"`([^`]+)`", row[0])
            defaults = row[1].split(" / ") if len(keys) > 1 else [row[1]]
            assert len(defaults) == len(keys), row
            for key, default in zip(keys, defaults, strict=True):
                full = key if "." in key else f"{keys[0].rpartition('.')[0]}.{key}"
                yield (kind if full.startswith("providers.") else "", full, default)


def test_every_setting_has_a_row_and_every_row_is_a_setting() -> None:
    listed = [(kind, key) for kind, key, _ in page_keys()]
    # `kind` itself is told once, in the main table, with the three values it takes.
    expected = model_keys() - {
        ("smtp-imap", "providers.NAME.kind"),
        ("graph", "providers.NAME.kind"),
    }
    assert sorted(set(listed) - expected) == [], "rows that are no setting"
    assert sorted(expected - set(listed)) == [], "settings without a row"
    assert len(listed) == len(set(listed)), "a key listed twice"


def literal(cell: str) -> object:
    """A default cell's one backticked value, as a TOML value where it reads as one."""
    text = cell.strip("`")
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def errors_at(model: type[BaseModel], field: str, value: object, **more: object) -> list[str]:
    """The refusals of `value` for `field` of `model` (others are not this field's)."""
    data = {**STUBS.get(model, {}), **more, field: value}
    try:
        model.model_validate(data)
    except ValidationError as exc:
        return [e["msg"] for e in exc.errors() if e["loc"][:1] == (field,)]
    return []


@pytest.mark.parametrize(("kind", "key", "cell"), list(page_keys()), ids=lambda v: str(v))
def test_every_default_on_the_page_is_the_models(kind: str, key: str, cell: str) -> None:
    found = field_of(key, kind or "gmail")
    assert found, key
    model, field = found
    info = model.model_fields[field]
    if cell == REQUIRED:
        assert info.is_required(), f"{key} has a default"
        return
    assert not info.is_required(), f"{key} is required"
    default = info.get_default(call_default_factory=True)
    if cell in PROSE_DEFAULTS:
        assert default in PROSE_DEFAULTS[cell], (key, default)
        return
    assert re.fullmatch(r"`[^`]+`", cell), f"{key}: say {cell!r} as one `value` or add it here"
    value = literal(cell)
    assert errors_at(model, field, value) == [], (key, value)
    validated = getattr(model.model_validate({**STUBS.get(model, {}), field: value}), field)
    assert validated == default, (key, cell, default)


def test_kind_names_the_three_kinds() -> None:
    row = next(r for h, rows in tables(page()) for r in rows if r[0] == "`providers.NAME.kind`")
    assert set(re.findall(r"`(gmail|smtp-imap|graph)`", row[2])) == set(KINDS)


NAMED_KEY = re.compile(
    r"`((?:store|daemon|api|retention)\.[a-z_]+|(?:providers|webhooks)\.NAME\.[a-z_]+)`"
)


def test_every_key_the_page_names_exists() -> None:
    named = set(NAMED_KEY.findall(page()))
    assert named
    missing = [k for k in named if not any(field_of(k, kind) for kind in KINDS)]
    assert missing == []


# -- ranges -------------------------------------------------------------------------------

RANGE = re.compile(r"(?:whole seconds, )?(above )?([^\s,]+(?: byte)?),? (?:to|at most) (\S+)")


def amount(text: str) -> float:
    """A bound as the page writes it: a count, a size or a duration."""
    if re.fullmatch(r"\d+(\.\d+)?", text):
        return float(text)
    if text == "1 byte" or re.fullmatch(r"\d+[KMG]i?B", text):
        return parse_size(text.replace(" byte", ""))
    return parse_duration(text)


def bounds_rows() -> list[tuple[type[BaseModel], str, str]]:
    """(model, field, range text) of every row of the page's range table."""
    out = []
    for header, rows in tables(page()):
        if header[:2] != ["key", "range"]:
            continue
        for row in rows:
            kinds = [k for k in KINDS if re.search(rf"\({k}\b|, {k}\b", row[0])] or list(KINDS)
            for key in re.findall(r"`([^`]+)`", row[0]):
                models = [field_of(key, kind) for kind in kinds]
                assert any(models), key
                out += [(m[0], m[1], row[1]) for m in dict.fromkeys(models) if m]
    return out


def numeric_fields() -> set[tuple[type[BaseModel], str]]:
    models = [*SECTIONS.values(), *KINDS.values()]
    return {
        (model, field)
        for model in models
        for field, info in model.model_fields.items()
        if number_types(info.annotation) <= {int, float}
    }


def number_types(annotation: Any) -> set[Any]:
    """The types a field holds, apart from None (`Annotated[float, ...] | None`: float)."""
    if typing.get_origin(annotation) is typing.Annotated:
        return number_types(typing.get_args(annotation)[0])
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return set().union(*(number_types(a) for a in typing.get_args(annotation))) - {type(None)}
    return {annotation}


def test_every_count_size_and_duration_has_a_range_on_the_page() -> None:
    ranged = [(model, field) for model, field, _ in bounds_rows()]
    assert sorted(map(str, numeric_fields() - set(ranged))) == [], "no range on the page"
    assert sorted(map(str, set(ranged) - numeric_fields())) == []
    assert len(ranged) == len(set(ranged)), "a key given two ranges"


@pytest.mark.parametrize(("model", "field", "text"), bounds_rows(), ids=lambda v: str(v))
def test_each_range_is_what_the_model_takes(model: type[BaseModel], field: str, text: str) -> None:
    match = RANGE.match(text)
    assert match, text
    above, low_text, high_text = match.groups()
    low, high = amount(low_text), amount(high_text)
    whole = text.startswith("whole seconds") or number_types(
        model.model_fields[field].annotation
    ) == {int}
    step = 1.0 if whole else max(high * 1e-6, 0.0005)
    # A webhook's retry_backoff_max must be at least its retry_backoff: keep them apart.
    more: dict[str, object] = {"retry_backoff_max": high} if field == "retry_backoff" else {}

    def number(value: float) -> float:
        return int(value) if whole else value

    assert errors_at(model, field, number(high), **more) == [], (field, high)
    assert errors_at(model, field, number(high + step), **more), (field, "above", high)
    if above:
        assert errors_at(model, field, number(low)), (field, "at", low)
    else:
        assert errors_at(model, field, number(low)) == [], (field, low)
        assert errors_at(model, field, number(low - step)), (field, "below", low)


# -- the environment and the config file --------------------------------------------------


def test_the_variables_the_page_names_are_the_ones_read() -> None:
    text = page()
    for name in environment.OTHER_VARIABLES:
        assert f"`{name}`" in text
    for name in ("SENDLEDGER_STORE__URL", "SENDLEDGER_PROVIDERS__SUPPORT__TIMEOUT"):
        assert f"`{name}`" in text
        assert environment.unknown_variable({name: "x"}, Settings) is None
    assert "`SENDLEDGER_STOR__URL`" in text
    assert environment.unknown_variable({"SENDLEDGER_STOR__URL": "x"}, Settings)


def test_the_duration_forms_on_the_page_parse() -> None:
    line = next(x for x in page().splitlines() if x.startswith("Durations are "))
    forms = re.findall(r'`"([^"]+)"`', line)
    assert [parse_duration(f) for f in forms] == [0.25, 30, 300, 3600, 86400]


def example_sections() -> dict[str, str]:
    """The text of config.example.toml under each (possibly commented) table header, by
    the page's prefix of its keys."""
    out: dict[str, str] = {}
    current = ""
    for line in EXAMPLE.read_text(encoding="utf-8").splitlines():
        header = re.fullmatch(r"#? ?\[([a-z]+)(?:\.[a-z0-9]+)?\]", line.strip())
        if header:
            current = header.group(1)
            continue
        kind = re.fullmatch(r'kind = "([a-z-]+)"', line.strip())
        if current == "providers" and kind:
            current = kind.group(1)
        out[current] = out.get(current, "") + line + "\n"
    return out


def test_the_example_config_names_every_setting() -> None:
    sections = example_sections()
    missing = []
    for prefix, model in [*SECTIONS.items(), *KINDS.items()]:
        text = sections[prefix.split(".")[0]]
        for field in model.model_fields:
            if not re.search(rf"^#? ?{field} =", text, re.M):
                missing.append(f"{prefix}.{field}")
    assert missing == []


# -- claims of the prose ------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "file:///etc/passwd",
        "https://user:pw@example.com/",
        "https://example.com/?q=1",
        "https://example.com/#top",
        "https://exa mple.com/",
        "https://example.com/\x07",
        "https://exämple.com/",
        "https://example.com:0/",
        "https://example.com:65536/",
        "https://example.com:port/",
    ],
)
def test_the_endpoint_urls_the_page_refuses_are_refused(url: str) -> None:
    for field in ("api_endpoint", "token_uri"):
        assert errors_at(GmailProviderSettings, field, url), (field, url)
    assert errors_at(GmailProviderSettings, "api_endpoint", "https://example.com:1/v1") == []


@pytest.mark.parametrize("provider", ["gmail", "smtp-imap", "graph"])
def test_init_writes_the_policies_and_mailbox_the_page_says(provider: str, tmp_path: Path) -> None:
    mailbox = parse_mailbox("shop@shop.example")
    here = Installation(tmp_path, ["sendledger"], "user", "group")
    write_all(tmp_path, planned_files(provider, mailbox, here))
    settings = load_settings(tmp_path / "sendledger.toml")
    (name, config), *others = settings.providers.items()
    assert others == [] and config.kind == provider
    user = config.username if isinstance(config, SmtpImapProviderSettings) else config.user
    assert user == "shop@shop.example"
    policies = load_policy_dir(tmp_path / "policies", known_providers=[name])
    assert {(p.channel, p.on_unknown, p.irreversible) for p in policies.values()} == {
        ("receipts", "retry", False),
        ("notices", "review", True),
    }
    assert {p.from_address for p in policies.values()} == {"shop@shop.example"}
    assert (tmp_path / "api-tokens").read_text(encoding="utf-8").startswith("admin:")
    job = json.loads((tmp_path / "first-job.json").read_text(encoding="utf-8"))
    assert (job["key"], job["channel"], job["to"]) == ("first-job-1", "receipts", user)
    said = summary(provider, mailbox, here, planned_files(provider, mailbox, here))
    steps = [line.split()[3:5] for line in said.splitlines() if line.startswith("  sendledger ")]
    assert steps == [
        ["run"],
        ["submit", str(tmp_path / "first-job.json")],
        ["status", "first-job-1"],
    ]


def file_settings() -> set[str]:
    """Every `*_file` setting, as the page names it."""
    return {key for _, key in model_keys() if key.endswith("_file")}


def test_the_files_bullet_names_every_secret_file_setting() -> None:
    bullet = next(p for p in page().split("\n- ") if p.startswith("**Files.**"))
    assert set(NAMED_KEY.findall(bullet)) == file_settings()


def test_every_secret_file_setting_is_warned_about(tmp_path: Path) -> None:
    """The daemon's start-up warning covers every `*_file` setting (secret_files), and a
    file only its owner can use is not warned about."""
    names = ("gmail", "smtp", "graph")
    settings = settings_from_dict(
        {
            "store": {"encryption_key_file": "store.key"},
            "api": {"token_file": "api-tokens"},
            "providers": {
                "gmail": {**STUBS[GmailProviderSettings]},
                "smtp": {**STUBS[SmtpImapProviderSettings]},
                "graph": {**STUBS[GraphProviderSettings]},
                "cert": {
                    **STUBS[GraphProviderSettings],
                    "client_secret_file": None,
                    "certificate_file": "graph.pem",
                },
            },
            "webhooks": {"ops": {**STUBS[WebhookSettings]}},
        },
        config_path=tmp_path / "sendledger.toml",
    )
    listed = dict(secret_files(settings))
    covered = {re.sub(r"^(providers|webhooks)\.[^.]+\.", r"\1.NAME.", s) for s in listed}
    assert covered == file_settings()
    assert set(names) <= {s.split(".")[1] for s in listed if s.startswith("providers.")}
    for path in listed.values():
        path.write_text("x\n", encoding="utf-8")
        path.chmod(0o600)
    assert warn_exposed_secrets(settings) == []
    for path in listed.values():
        path.chmod(0o640)
    assert sorted(warn_exposed_secrets(settings)) == sorted(listed.values())


def meaning_of(key: str, kind: str = "") -> str:
    """The meaning cell of `key`'s row (in the table of `kind`'s keys, for a provider)."""
    for header, rows in tables(page()):
        if TABLE_KINDS.get(header[0]) == (kind or "gmail"):
            for row in rows:
                if row[0].startswith(f"`{key}`"):
                    return row[2]
    raise AssertionError(f"no row for {key}")


def test_every_choice_of_a_setting_is_on_its_row() -> None:
    for kind, key, _ in page_keys():
        found = field_of(key, kind or "gmail")
        assert found
        model, field = found
        annotation = model.model_fields[field].annotation
        if typing.get_origin(annotation) is typing.Literal and field != "kind":
            choices = set(typing.get_args(annotation))
            shown = set(re.findall(r"`([^`]+)`", meaning_of(key, kind)))
            assert choices <= shown, (key, choices - shown)


def test_the_figures_of_the_rows_are_the_codes() -> None:
    assert set(re.findall(r"`([a-z]+)`", meaning_of("webhooks.NAME.events"))) == set(WEBHOOK_TYPES)
    assert len(WEBHOOK_TYPES) == 7  # "all seven"
    assert f"{SECRET_BYTES[0]}-{SECRET_BYTES[1]} bytes" in meaning_of("webhooks.NAME.secret_file")
    quota = meaning_of("providers.NAME.quota_units_per_second")
    assert f"send {GMAIL_SEND_UNITS:g}, list/get {GMAIL_LIST_UNITS:g}" in quota
    assert GMAIL_GET_UNITS == GMAIL_LIST_UNITS


def test_the_job_index_holds_no_content() -> None:
    """What the job index keeps in the clear beside encrypted events ("Encryption at rest"):
    a new column would have to be named on the page, and never an address or a subject."""
    said = {
        "key": "key",
        "job_id": "key",  # derived from the key
        "channel": "channel",
        "state": "state",
        "message_id": "Message-ID",
        "due_at": "times",
        "created_at": "times",
        "updated_at": "times",
        "purged_at": "times",
        "version": "version",
        "attempts": "attempt count",
        "reason": "reason",
        "watch_until": "times",
        "watch_mailbox": "digest",  # of the sender's mailbox: never the address
        "mailbox": "From mailbox as a digest",  # keyed by the store's key: no address
    }
    assert {f.name for f in dataclasses.fields(IndexRow)} == set(said)
    sentence = " ".join(page().split("the job index keeps", 1)[1].split(")", 1)[0].split())
    assert all(word in sentence for word in said.values()), sentence


def variable(key: str) -> str:
    return "SENDLEDGER_" + key.replace("NAME", "x").replace(".", "__").upper()


def test_every_key_has_its_variable() -> None:
    """ "Every key can be overridden by SENDLEDGER_<SECTION>__<KEY>": no key's variable is
    refused as unknown."""
    for _, key in model_keys():
        assert environment.unknown_variable({variable(key): "1"}, Settings) is None, key


@pytest.mark.parametrize(
    ("key", "value", "read"),
    [
        ("store.url", "sqlite:///env.sqlite", lambda s: s.store.url),
        ("daemon.tick", "2s", lambda s: s.daemon.tick),
        ("api.max_body", "1KB", lambda s: s.api.max_body),
        ("retention.every", "1h", lambda s: s.retention.every),
        ("providers.NAME.timeout", "5s", lambda s: s.providers["x"].timeout),
        ("webhooks.NAME.timeout", "5s", lambda s: s.webhooks["x"].timeout),
    ],
)
def test_a_variable_overrides_the_file(
    key: str, value: str, read: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "sendledger.toml"
    config.write_text(
        '[store]\nurl = "sqlite:///file.sqlite"\n[daemon]\ntick = "1s"\n'
        '[providers.x]\ncredentials_file = "sa.json"\ntimeout = "1s"\n'
        '[webhooks.x]\nurl = "https://h.example.com/"\nsecret_file = "s"\ntimeout = "1s"\n',
        encoding="utf-8",
    )
    before = read(load_settings(config))
    monkeypatch.setenv(variable(key), value)
    after = read(load_settings(config))
    assert after != before
    section, _, field = key.rpartition(".")
    model = KINDS["gmail"] if section == "providers.NAME" else SECTIONS[section]
    assert after == getattr(model.model_validate({**STUBS.get(model, {}), field: value}), field)


def test_a_password_or_client_secret_is_the_files_first_line(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    path.write_text("first line\nsecond line\n", encoding="utf-8")
    assert read_password_file(path) == "first line"
    assert read_client_secret(path) == "first line"


@pytest.mark.parametrize(
    ("kind", "setting"),
    [
        ("gmail", "credentials_file"),
        ("smtp-imap", "password_file"),
        ("graph", "client_secret_file"),
    ],
)
def test_a_fifo_as_a_providers_secret_is_refused_in_the_pages_words(
    kind: str, setting: str, tmp_path: Path
) -> None:
    """The example message of "Files", for every kind's secret: refused naming the
    setting and what the file is, without opening it for a blocking read."""
    fifo = tmp_path / "secret"
    os.mkfifo(fifo)
    model = KINDS[kind]
    config = {**STUBS.get(model, {}), setting: "secret"}
    settings = settings_from_dict(
        {"providers": {"support": config}}, config_path=tmp_path / "sendledger.toml"
    )
    with pytest.raises(ConfigError) as caught:
        build_provider(settings, "support")
    assert str(caught.value) == (
        f"providers.support.{setting}: cannot read {fifo}: a named pipe (FIFO), not a regular file"
    )
    example = (
        "providers.support.credentials_file: cannot read /etc/sendledger/sa.json: "
        "a named pipe (FIFO), not a regular file"
    )
    assert example in " ".join(page().split())


def test_the_library_variables_the_page_names_are_the_refused_ones() -> None:
    section = page().split("### Only sendledger's settings configure the store", 1)[1]
    section = section.split("\n### ", 1)[0]
    named = set(re.findall(r"`([A-Z][A-Z_]+\*?)`", section))
    assert f"`{APPLICATION_PREFIX}`" in section  # "also prefixed"
    named.discard(APPLICATION_PREFIX)
    read = named & READ_BY_SENDLEDGER
    assert read == set(READ_BY_SENDLEDGER)
    for name in named - read:
        if name.endswith("*"):
            assert any(v.startswith(name[:-1]) for v in LIBRARY_VARIABLES), name
        else:
            assert name in LIBRARY_VARIABLES, name
    assert "`ledger/stores/library_env.py`" in section  # where the full list is


def test_the_states_a_purge_takes_are_the_final_ones() -> None:
    """ "Settled for good (confirmed, abandoned, cancelled)": the states `purge` accepts."""
    words = {"confirmed", "abandoned", "cancelled"}
    assert {str(state) for state in FINAL_STATES} == words
    text = " ".join(page().split())
    assert "settled for good (confirmed, abandoned, cancelled)" in text
    assert "settled for good (confirmed, abandoned or cancelled, no verification due)" in text
    assert "only jobs that are confirmed, abandoned or cancelled are purged" in text

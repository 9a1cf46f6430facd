"""docs/providers.md against the code it describes (docs/development.md "Writing the docs"):
the provider kinds against the settings' discriminator, each kind's key table (keys,
required ones, defaults, bounds) against its settings model, the same keys against
config.example.toml, which providers read the Message-ID back, the Gmail scopes, the
probe's options and recommendation, and what a draft that cannot be created does in the
daemon. Each comparison goes both ways, so neither the page nor the code can change alone."""

from __future__ import annotations

import argparse
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, get_args

import pytest
from pydantic import BaseModel, ValidationError
from tests.unit.docs_page import CODE, DocsPage, flat, table
from tests.unit.engine_rig import EngineRig, policy

from daemon.config.settings import (
    _PROVIDER_TAGS,
    ConfigError,
    DaemonSettings,
    GmailProviderSettings,
    GraphProviderSettings,
    SmtpImapProviderSettings,
    settings_from_dict,
)
from daemon.doubles.fake_drafts import FakeDraftsProvider
from daemon.exit_codes import EXIT_BAD_INPUT, CliError
from daemon.providers.base import (
    DEFAULT_READBACK_FIRST,
    DEFAULT_READBACK_RATE,
    SendKind,
    SendOutcome,
)
from daemon.providers.gmail import DRAFT_SCOPES, SCOPES, GmailProvider
from daemon.providers.gmail_drafts import COMPOSE_SCOPE
from daemon.providers.graph import GraphProvider
from daemon.providers.graph_classify import after_draft_delete
from daemon.providers.graph_classify import classify_create_response as graph_create
from daemon.providers.graph_classify import classify_send_response as graph_send
from daemon.providers.smtp_classify import Stage, classify_smtp
from daemon.providers.smtp_imap import SmtpImapProvider
from daemon.tools import probe
from ledger.vocabulary import JobState

REPO = Path(__file__).resolve().parents[2]
PAGE = DocsPage("providers.md")
section = PAGE.section


MODELS: dict[str, type[BaseModel]] = {
    "gmail": GmailProviderSettings,
    "smtp-imap": SmtpImapProviderSettings,
    "graph": GraphProviderSettings,
}


def test_the_kinds_are_the_settings_kinds() -> None:
    intro = flat(section("Providers"))
    named = re.search(r"chosen by `kind` in `\[providers\.NAME\]`: (.*?); a table", intro)
    assert named
    assert CODE.findall(named.group(1)) == list(_PROVIDER_TAGS) == list(MODELS)
    for kind, model in MODELS.items():
        assert get_args(model.model_fields["kind"].annotation) == (kind,)
    assert "a table without `kind` is `gmail`" in intro
    untyped = settings_from_dict({"providers": {"p": {"credentials_file": "x.json"}}})
    assert isinstance(untyped.providers["p"], GmailProviderSettings)
    assert "any other `kind` is refused at load, naming it" in intro
    with pytest.raises(ConfigError, match=r"providers\.p: kind: expected"):
        settings_from_dict({"providers": {"p": {"kind": "exchange"}}})


def example_sections() -> dict[str, str]:
    """config.example.toml's provider tables by kind, commented-out keys included."""
    text = (REPO / "config.example.toml").read_text(encoding="utf-8")
    parsed = tomllib.loads(text)["providers"]
    found: dict[str, str] = {}
    for name, table_ in parsed.items():
        body = re.search(rf"^\[providers\.{name}\]\n(.*?)(?=^\[|\Z)", text, re.M | re.S)
        assert body
        found[table_.get("kind", "gmail")] = body.group(1)
    return found


def test_config_example_names_every_key_of_each_kind() -> None:
    sections = example_sections()
    assert set(sections) == set(MODELS)
    for kind, model in MODELS.items():
        keys = set(re.findall(r"^#? ?([a-z_]+) = ", sections[kind], re.M))
        assert keys == set(model.model_fields), kind


#: Each kind's key table on the page, and the least a valid table of that kind holds.
TABLES: dict[str, tuple[str, dict[str, Any]]] = {
    "gmail": ("Gmail keys", {"credentials_file": "sa.json"}),
    "smtp-imap": (
        "SMTP + IMAP setup",
        {
            "smtp_host": "smtp.example.com",
            "imap_host": "imap.example.com",
            "username": "me@example.com",
            "password_file": "pw",
        },
    ),
    "graph": (
        "Graph keys",
        {"tenant_id": "t", "client_id": "c", "user": "u@example.com", "client_secret_file": "s"},
    ),
}


def bounds(meaning: str) -> tuple[float, float, str] | None:
    """`(1..64)` or `(0..60s)` in a meaning cell: the bounds the key accepts."""
    found = re.search(r"\((\d+)\.\.(\d+)(s?)\)", meaning)
    return (float(found.group(1)), float(found.group(2)), found.group(3)) if found else None


@pytest.mark.parametrize("kind", list(TABLES))
def test_each_key_table_is_the_kinds_settings(kind: str) -> None:
    title, required = TABLES[kind]
    model = MODELS[kind]
    rows = {
        CODE.findall(key)[0]: (default, meaning) for key, default, meaning in table(section(title))
    }
    assert set(rows) == set(model.model_fields) - {"kind"}
    least = model.model_validate({"kind": kind, **required})
    for key, (default, meaning) in rows.items():
        field = model.model_fields[key]
        if default == "required":
            assert field.is_required(), key
        elif default == "":
            assert not field.is_required() and field.default is None, key
        else:
            written = tomllib.loads(f"v = {CODE.findall(default)[0]}")["v"]
            given = model.model_validate({"kind": kind, **required, key: written})
            assert getattr(given, key) == getattr(least, key), key
        limits = bounds(meaning)
        if limits:
            low, high, unit = limits
            for value, ok in ((low, True), (high, True), (high + 1, False)):
                written_value: Any = f"{value:g}{unit}" if unit else int(value)
                try:
                    model.model_validate({"kind": kind, **required, key: written_value})
                except ValidationError:
                    assert not ok, (key, value)
                else:
                    assert ok, (key, value)


def test_only_gmail_and_graph_read_the_message_id_back() -> None:
    rows = {row[0]: row[1:] for row in table(section("What each kind does"))}
    gmail, smtp, graph = rows["read-back of the Message-ID"]
    assert GmailProvider.response_ids_readable and GraphProvider.response_ids_readable
    assert not SmtpImapProvider.response_ids_readable
    assert smtp.startswith("none:")
    assert "`readback_first`" in gmail and "`readback_rate`" in gmail
    # Graph keeps the port's defaults: no keys of its own change them.
    assert (GraphProvider.readback_first, GraphProvider.readback_rate) == (
        DEFAULT_READBACK_FIRST,
        DEFAULT_READBACK_RATE,
    )
    assert f"the first {DEFAULT_READBACK_FIRST}, then {DEFAULT_READBACK_RATE}" in graph
    assert not {"readback_first", "readback_rate"} & set(GraphProviderSettings.model_fields)


def test_the_scopes_named_are_the_ones_asked_for() -> None:
    setup = flat(section("Gmail setup"))
    assert re.findall(r"`(https://www.googleapis.com/auth/[a-z.]+)`", setup) == SCOPES
    drafts = flat(section("Sending through drafts (`send_via`)"))
    assert f"`{COMPOSE_SCOPE}` besides the two above" in drafts
    assert [*SCOPES, COMPOSE_SCOPE] == DRAFT_SCOPES


@pytest.mark.parametrize(
    ("lag", "recommended"), [(0.3, 60.0), (20.0, 60.0), (21.0, 120.0), (60.0, 180.0)]
)
def test_the_probe_recommends_three_times_the_lag_in_whole_minutes(
    lag: float, recommended: float
) -> None:
    assert "(3 x the lag, whole minutes, at least 1m)" in flat(
        section("Checking a provider: `sendledger probe`")
    )
    assert probe.recommend_search_after(lag) == recommended


def test_the_probe_options_and_defaults() -> None:
    parser = argparse.ArgumentParser()
    probe.register(parser.add_subparsers())
    [sub] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    options = {o: a for a in sub.choices["probe"]._actions for o in a.option_strings}
    text = flat(section("Checking a provider: `sendledger probe`"))
    assert "`sendledger probe --provider NAME --to YOU@EXAMPLE.COM`" in text
    assert {"--provider", "--to", "--yes", "--max-wait", "--interval", "--from", "--json"} <= set(
        options
    )
    for option in ("--max-wait", "--interval"):
        default = options[option].default
        assert f"`{option}`" in text and f"default `{default}`" in text, option
    gmail = flat(section("The probe on a gmail provider"))
    assert 'With `--json` the drafts path is under `"drafts"`' in gmail
    assert "`--from MAILBOX`" in flat(section("Gmail setup"))


def refused_probe(tmp_path: Path, user: str, **given: Any) -> CliError:
    """How `sendledger probe` refuses to start on a gmail provider whose `user` is given,
    with no terminal to ask on: its CliError."""
    config = tmp_path / "sendledger.toml"
    (tmp_path / "policies").mkdir()
    config.write_text(
        '[daemon]\npolicies_dir = "policies"\n[providers.support]\ncredentials_file = "sa.json"\n'
        f'user = "{user}"\n',
        encoding="utf-8",
    )
    fields = {"from_addr": None, "yes": False, "max_wait": "10m", "interval": "2s", **given}
    args = argparse.Namespace(
        config=str(config), provider="support", to="you@example.com", json=False, **fields
    )
    with pytest.raises(CliError) as refused:
        probe.cmd_probe(args)
    return refused.value


def test_the_probe_without_yes_and_without_a_terminal_is_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("sys.stdin.isatty", lambda: False, raising=False)
    refused = refused_probe(tmp_path, "me@example.com")
    assert refused.code == EXIT_BAD_INPUT == 2
    assert "--yes" in str(refused)
    assert "refuses to run without `--yes` or an interactive `y` (exit 2)" in flat(
        section("Checking a provider: `sendledger probe`")
    )


def test_the_probe_of_a_from_placeholder_provider_needs_from(tmp_path: Path) -> None:
    refused = refused_probe(tmp_path, "{from}", yes=True)
    assert refused.code == EXIT_BAD_INPUT
    assert str(refused).startswith("--from: ")
    assert "`sendledger probe` on such a provider needs `--from MAILBOX`" in flat(
        section("Gmail setup")
    )


@pytest.fixture
def drafts_rig() -> Iterator[tuple[EngineRig, FakeDraftsProvider]]:
    """An engine rig whose provider is the in-memory drafts provider, one job submitted."""
    rig = EngineRig(policy("receipts"))
    rig.engine.close()
    drafts = FakeDraftsProvider("fake", clock=rig.clock)
    rig.provider = drafts
    rig.engine = rig.new_engine()
    rig.submit("receipts", "k1")
    yield rig, drafts
    rig.close()


def test_a_draft_that_cannot_be_created_is_no_claim(
    drafts_rig: tuple[EngineRig, FakeDraftsProvider],
) -> None:
    """A failed drafts.create records nothing: the job stays due and the next tick sends it."""
    assert "5xx and rate limits nothing is recorded, the job stays due" in flat(
        section("Sending through drafts (`send_via`)")
    )
    rig, drafts = drafts_rig
    drafts.fail_creates(1)
    rig.tick(errors=1)
    assert rig.events("k1") == ["Requested"]
    assert rig.job("k1").state is JobState.REQUESTED and drafts.draft_sends == 0
    rig.tick()
    assert rig.job("k1").state is JobState.CONFIRMED
    assert drafts.draft_sends == 1 and rig.copies("k1") == 1


def test_a_draft_refused_for_good_goes_to_review_without_a_claim(
    drafts_rig: tuple[EngineRig, FakeDraftsProvider],
) -> None:
    """A permanent refusal of drafts.create (a 4xx, a missing scope) is not asked again
    every tick: the job goes to review (`rejected`), never claimed, nothing sent."""
    assert "a refusal for good (other 4xx, a missing scope) sends the job to review" in flat(
        section("Sending through drafts (`send_via`)")
    )
    rig, drafts = drafts_rig
    drafts.refuse_creates(1)
    rig.tick()
    job = rig.job("k1")
    assert rig.events("k1") == ["Requested", "Escalated"]
    assert job.state is JobState.REVIEW and job.reason == "rejected"
    rig.advance_and_tick(3600)
    assert drafts.drafts_created == 0 and drafts.draft_sends == 0


def test_policy_check_refuses_retry_on_a_client_copy_provider(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from daemon.cli.job_commands import cmd_policy_check

    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "receipts.toml").write_text(
        'provider = "mail"\nfrom = "a@example.com"\nmessage_id_domain = "example.com"\n'
        'on_unknown = "retry"\n',
        encoding="utf-8",
    )
    config = tmp_path / "sendledger.toml"
    settings = (
        '[daemon]\npolicies_dir = "policies"\n[providers.mail]\nkind = "smtp-imap"\n'
        'smtp_host = "smtp.example.com"\nimap_host = "imap.example.com"\n'
        'username = "a@example.com"\npassword_file = "pw"\nsent_copy = "{copy}"\n'
    )
    config.write_text(settings.format(copy="client"), encoding="utf-8")
    args = argparse.Namespace(config=str(config), dir=None, json=False)
    assert cmd_policy_check(args) == EXIT_BAD_INPUT
    assert "receipts.toml:on_unknown: " in capsys.readouterr().err
    config.write_text(settings.format(copy="server"), encoding="utf-8")
    assert cmd_policy_check(args) == 0
    assert "(`file:on_unknown: reason`)" in flat(section("Where the sent copy comes from"))


def test_a_graph_send_fits_its_claims_deadline_by_default() -> None:
    """A claim's deadline is the provider's timeout plus daemon.deadline_grace; a Graph send
    is up to three requests plus confirm_wait, which the defaults leave room for."""
    graph = GraphProviderSettings.model_validate({"kind": "graph", **TABLES["graph"][1]})
    grace = DaemonSettings.model_fields["deadline_grace"].default
    assert graph.timeout + grace >= 3 * graph.timeout + graph.confirm_wait
    assert (grace, graph.timeout, graph.confirm_wait) == (30.0, 10.0, 3.0)
    assert "(the defaults do: 30s, 2 x 10s + 3s)" in section("Graph keys")


def kind_column(kind: str) -> dict[str, str]:
    """The matrix's cells for one kind, by row name."""
    rows = table(section("What each kind does"))
    column = list(MODELS).index(kind) + 1
    return {row[0]: row[column] for row in rows}


SMTP_STAGES = {"EHLO": Stage.HELLO, "AUTH": Stage.AUTH, "MAIL": Stage.MAIL}
SMTP_STAGES |= {"RCPT": Stage.RCPT, "DATA": Stage.DATA}


def smtp(stage: Stage, code: int | None, text: str = "") -> SendOutcome:
    return classify_smtp(stage, code, text, message_id="<job-1@mail.example.com>")


def test_the_smtp_column_is_the_smtp_classification() -> None:
    cells = kind_column("smtp-imap")
    refused = re.search(r"to ((?:[A-Z]+, )*[A-Z]+ or [A-Z]+);", cells["not sent"])
    assert refused
    named = re.split(r", | or ", refused.group(1))
    assert named == list(SMTP_STAGES)
    for stage in SMTP_STAGES.values():
        assert (smtp(stage, 450).kind, smtp(stage, 450).transient) == (SendKind.REJECTED, True)
        assert (smtp(stage, 550).kind, smtp(stage, 550).transient) == (SendKind.REJECTED, False)
        assert smtp(stage, 421).unavailable and smtp(stage, 421).transient
    assert "4xx (transient; 421 also unavailable) or 5xx (permanent)" in cells["not sent"]
    # Anything before the final "." without a reply (refused, reset, timeout) sent nothing.
    before_dot = [s for s in Stage if s is not Stage.END_OF_DATA]
    assert all(smtp(s, None).kind is SendKind.REJECTED for s in before_dot)
    assert "anything before the final `.`" in cells["not sent"]
    assert "after the final `.`, before the reply" in cells["ambiguous"]
    assert smtp(Stage.END_OF_DATA, None, "timed out").kind is SendKind.UNKNOWN
    queued = smtp(Stage.END_OF_DATA, 250, "2.0.0 Ok: queued as 4XyZ12abC")
    plain = smtp(Stage.END_OF_DATA, 250, "2.0.0 Ok")
    assert (queued.kind, queued.provider_message_id) == (SendKind.CONFIRMED, "4XyZ12abC")
    assert plain.provider_message_id == "<job-1@mail.example.com>"
    assert "id: the queue id in the reply, else our Message-ID" in cells["confirmed by response"]
    after = cells["refused after data"]
    assert "`4xx`: transient" in after and "`5xx`: permanent" in after
    assert smtp(Stage.END_OF_DATA, 452).transient
    assert not smtp(Stage.END_OF_DATA, 554).transient


def test_the_graph_column_is_the_graph_classification() -> None:
    cells = kind_column("graph")
    ambiguous, not_sent = cells["ambiguous"], cells["not sent"]
    wait = {"Retry-After": "5"}
    assert "5xx (a 503 without Retry-After too)" in ambiguous
    for status in (500, 502, 503):
        assert graph_send(status, {}, b"").kind is SendKind.UNKNOWN
    assert "a 202 whose copy is not filed within `confirm_wait`" in ambiguous
    assert graph_send(202, {}, b"").kind is SendKind.UNKNOWN
    assert "a refused send whose draft is then gone" in ambiguous
    assert after_draft_delete(graph_send(400, {}, b""), 404).kind is SendKind.UNKNOWN
    assert after_draft_delete(graph_send(400, {}, b""), 204).kind is SendKind.REJECTED
    assert "429 and 503 with Retry-After (transient, unavailable" in not_sent
    for status in (429, 503):
        outcome = graph_send(status, wait, b"")
        assert (outcome.kind, outcome.transient, outcome.unavailable) == (
            SendKind.REJECTED,
            True,
            True,
        )
        assert outcome.retry_after == 5.0
    assert "401 (transient" in not_sent
    assert (graph_send(401, {}, b"").kind, graph_send(401, {}, b"").transient) == (
        SendKind.REJECTED,
        True,
    )
    assert "other 4xx (permanent)" in not_sent
    for status in (400, 403, 404):
        assert (graph_send(status, {}, b"").kind, graph_send(status, {}, b"").transient) == (
            SendKind.REJECTED,
            False,
        )
    assert "any failure of the token or of the draft's creation" in not_sent
    for status in (400, 401, 429, 500, 503):
        created = graph_create(status, {}, b"")
        assert not isinstance(created, str) and created.kind is SendKind.REJECTED


def test_init_writes_a_graph_provider_as_the_page_sets_one_up() -> None:
    """`sendledger init --provider graph` names the permissions step 3 names, and its
    timeout leaves a send its three requests and confirm_wait within the claim's deadline."""
    from daemon.cli.init_command import config_text
    from ledger.addresses import parse_mailbox

    steps = flat(section("Microsoft Graph setup"))
    permissions = re.search(r"\*Application\* permissions (.*?), then \*Grant", steps)
    assert permissions
    named = re.findall(r"`(Mail\.\w+)`", permissions.group(1))
    assert named == ["Mail.Send", "Mail.ReadWrite"]
    written = config_text("graph", parse_mailbox("you@example.com"))
    assert re.search(r"permissions Mail\.Send and Mail\.ReadWrite for `user`", written)
    loaded = tomllib.loads(written)
    graph = loaded["providers"]["m365"]
    settings = settings_from_dict(
        {"daemon": loaded.get("daemon", {}), "providers": {"m365": graph}}
    )
    provider = settings.providers["m365"]
    assert isinstance(provider, GraphProviderSettings)
    grace = settings.daemon.deadline_grace
    assert provider.timeout + grace >= 3 * provider.timeout + provider.confirm_wait

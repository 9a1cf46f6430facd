"""docs/performance.md against the bench scripts that measured its figures (docs/development.md
"Writing the docs"): the figures are measurements and are not re-run here, but every
`--variant` and every option the page names must still exist in the script's argparse (a
figure whose variant is gone can no longer be produced), every variant the script offers is
on the page, the runs the page describes are the scripts' defaults, and the settings and
constants it quotes are the code's."""

from __future__ import annotations

import argparse
import ast
import re
from functools import cache
from pathlib import Path

from daemon.cli import COMMANDS, build_parser
from daemon.config.settings import StoreSettings
from daemon.providers.quota import GMAIL_SEND_UNITS
from daemon.providers.transport import DEFAULT_MAX_IDLE

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "bench"
PAGE = REPO / "docs" / "performance.md"
SPAN = re.compile(r"`([^`]+)`")
SCRIPT = re.compile(r"^(?:bench/)?(\w+\.py)\b")
OPTION = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
# Variants the page says are gone, with the sentence that says so.
GONE = {"email-package-mime": "the `--variant email-package-mime` that measured it is gone"}


def page() -> str:
    return re.sub(r"\s+", " ", PAGE.read_text(encoding="utf-8"))


@cache
def script_tree(name: str) -> ast.Module:
    return ast.parse((BENCH / name).read_text(encoding="utf-8"))


def options(name: str) -> set[str]:
    """The `--options` a bench script's argparse defines."""
    return {
        arg.value
        for node in ast.walk(script_tree(name))
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument"
        for arg in node.args[:2]
        if isinstance(arg, ast.Constant) and str(arg.value).startswith("--")
    }


def defaults(name: str) -> dict[str, object]:
    """`--option` -> its literal default, for the options that have one."""
    found = {}
    for node in ast.walk(script_tree(name)):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
            for kw in node.keywords:
                if kw.arg == "default" and isinstance(kw.value, ast.Constant):
                    found[node.args[0].value] = kw.value.value  # type: ignore[attr-defined]
    return found


def constant(name: str, variable: str) -> object:
    for node in script_tree(name).body:
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == variable for t in targets):
                return ast.literal_eval(node.value)  # type: ignore[arg-type]
    raise AssertionError(f"no {variable} in bench/{name}")


def variants() -> set[str]:
    """The keys of bench/pipeline.py's VARIANTS (what `--variant` chooses from)."""
    for node in script_tree("pipeline.py").body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "VARIANTS":
            assert isinstance(node.value, ast.Dict)
            return {ast.literal_eval(key) for key in node.value.keys if key is not None}
    raise AssertionError("no VARIANTS in bench/pipeline.py")


def cli_options(words: list[str]) -> set[str]:
    """The options of `sendledger WORDS...` (a command and its sub-command)."""
    parser: argparse.ArgumentParser = build_parser(words[0])
    found: set[str] = set()
    for word in words[:2]:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        if word not in sub.choices:
            break
        parser = sub.choices[word]
        found |= {o for action in parser._actions for o in action.option_strings}
    return found


def named_options() -> list[tuple[str, str, str]]:
    """(span, option, what defines it) for every `--option` in a backticked span: the script
    or command the span starts with, else the last one a span before it named."""
    out, context = [], ""
    for span in SPAN.findall(page()):
        first = span.removeprefix('HISTORY_ARGS="').split()[0]
        if script := SCRIPT.match(first):
            context = script.group(1)
        elif first in COMMANDS:
            context = " ".join(w for w in span.split()[:2] if not w.startswith("-"))
        elif span.startswith('HISTORY_ARGS="'):
            context = "history.py"
        for option in OPTION.findall(span):
            if option != "--variant":
                out.append((span, option, context))
    return out


def test_every_variant_the_page_names_is_one_the_pipeline_bench_offers() -> None:
    named = set(re.findall(r"`--variant ([\w-]+)`", page()))
    for variant, sentence in GONE.items():
        assert sentence in page()
        assert variant not in variants()
    assert named - set(GONE) == variants()


def test_every_option_the_page_names_is_in_its_scripts_or_commands_parser() -> None:
    found = named_options()
    assert {context for *_, context in found} >= {"pipeline.py", "mailboxes.py", "history.py"}
    wrong = []
    for span, option, context in found:
        known = options(context) if context.endswith(".py") else cli_options(context.split())
        if option not in known:
            wrong.append(f"`{span}`: {option} is not an option of {context or 'anything'}")
    assert wrong == []


def test_the_option_checker_sees_a_gone_option() -> None:
    assert "--breakdown" in options("profile_pipeline.py")
    assert "--waves" not in options("pipeline.py")
    assert "--older-than" in cli_options(["admin", "purge"])
    assert "--state" in cli_options(["audit"])


def test_the_runs_the_page_describes_are_the_scripts_defaults() -> None:
    text = page()
    latency = defaults("cli_latency.py")
    assert (latency["--rounds"], latency["--keys"]) == (15, 100)
    assert "median of 15 processes each" in text and "status` of 100 keys" in text
    assert constant("cli_latency.py", "GOAL") == 0.25
    pipeline = defaults("pipeline.py")
    assert (pipeline["--n"], pipeline["--concurrency"]) == (2000, 4)
    assert "**(a)** 2,000 jobs, zero latency" in text and "concurrency 4)" in text
    assert constant("pipeline.py", "LATENCY") == 0.2
    assert "**(b)** 200 ms per Gmail API call, concurrency 16 and 64" in text
    assert pipeline["--latency-concurrency"] == "16,64"
    assert (constant("pipeline.py", "CPU_GOAL"), constant("pipeline.py", "LATENCY_GOAL")) == (
        0.5,
        0.85,
    )
    assert "| >= 0.5x the bare loop (moonshot 0.8) |" in text
    assert text.count("| >= 0.85 of ideal |") == 2  # (b) at concurrency 16 and 64
    assert pipeline["--idle-sends"] == 200
    assert "closes connections idle for 100 ms, 200 sends" in text
    mailboxes = defaults("mailboxes.py")
    assert (mailboxes["--mailboxes"], mailboxes["--seconds"], mailboxes["--rounds"]) == (
        200,
        20.0,
        3,
    )
    assert "about 20 s of jobs, SQLite." in text and "median of 3 rounds." in text
    daemons = defaults("daemons.py")
    assert (daemons["--jobs"], daemons["--daemons"], daemons["--rounds"]) == (1000, "1,2,3", 2)
    assert daemons["--functions"] == "off,on"
    assert "1,000 jobs with 20% faults" in text and "median of 2 rounds" in text
    faults = constant("soak.py", "FAULTS")
    assert isinstance(faults, dict) and sum(faults.values()) - faults["pass"] == 20
    assert "concurrency = 8" in (BENCH / "soak.py").read_text(encoding="utf-8")
    assert "(concurrency 8 each)" in text
    history = defaults("history.py")
    assert (history["--jobs"], history["--rounds"]) == (1_000_000, 5)
    assert "median of 5." in text
    assert constant("history.py", "SCHEMA") == 1
    assert "~/.cache/sendledger-bench/history-v1/" in text


def test_the_settings_and_constants_the_page_quotes_are_the_codes() -> None:
    text = page()
    store = StoreSettings()
    assert (store.pool_size, store.max_overflow, store.lock_timeout) == (5, 5, 5)
    assert "`store.pool_size` (default 5)" in text and "`store.max_overflow` (5)" in text
    assert "`store.lock_timeout` (default `5s`, whole seconds)" in text
    assert DEFAULT_MAX_IDLE == 4.0 and "Idle connections (over 4 s)" in text
    # "store calls wait up to 10 s for a connection": eventsourcing's pool wait, which the
    # PostgreSQL backend sets.
    source = (REPO / "src" / "ledger" / "stores" / "postgres.py").read_text(encoding="utf-8")
    assert '"POSTGRES_CONNECT_TIMEOUT": "10"' in source and "wait up to 10 s" in text
    # 250 quota units/s, a send 100: 2.5 sends/s; with "{from}" a bucket of 150 when
    # bench/mailboxes.py was measured, of one send now.
    assert GMAIL_SEND_UNITS == 100.0
    assert "250 quota units/s is 2.5 sends/s" in text
    assert "a bucket of 150 units refilled at 250/s" in text
    assert "It now holds one send (and its draft step)" in text
    assert "capacity = GMAIL_SEND_UNITS + draft_units if self.per_mailbox" in (
        REPO / "src" / "daemon" / "providers" / "gmail.py"
    ).read_text(encoding="utf-8")


def test_the_scripts_the_page_puts_in_make_bench_are_there() -> None:
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    bench = makefile.split("\nbench:", 1)[1].split("\n\n", 1)[0]
    said = re.findall(r"`bench/(\w+\.py)`\)?[ ,]*\(?(?:part of|in) `make bench`", page())
    assert set(said) == {
        "pipeline.py",
        "daemons.py",
        "mailboxes.py",
        "history.py",
        "smtp_senders.py",
    }
    for script in said:
        assert f"bench/{script}" in bench


def test_every_table_follows_a_paragraph_that_names_its_bench_script() -> None:
    # A figure names the script that measured it: each table, or its lead-in (the paragraph
    # before it), names a bench script.
    text = PAGE.read_text(encoding="utf-8")
    parts = re.split(r"\n((?:\|.*\n)+)", text)
    tables = parts[1::2]
    assert len(tables) >= 9  # the split found the tables (one per measured run)
    for lead_in, table in zip(parts[0::2], tables, strict=False):
        paragraph = lead_in.rsplit("\n\n", 1)[-1]
        assert re.search(r"`(?:bench/)?\w+\.py", paragraph + table), paragraph


def test_the_metrics_the_page_names_are_the_exporters() -> None:
    metrics = (REPO / "src" / "daemon" / "api" / "metrics.py").read_text(encoding="utf-8")
    named = set(re.findall(r"`(sendledger_\w+)`", page()))
    assert named == {
        "sendledger_jobs",
        "sendledger_open_jobs",
        "sendledger_quota_available_units",
        "sendledger_circuit_open",
    }
    for name in named:
        assert f'"{name}"' in metrics, name

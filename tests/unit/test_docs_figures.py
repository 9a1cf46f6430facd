"""The figures the docs quote in prose are the code's (docs/development.md "Writing the
docs"): one table, FIGURES, of each number a page writes, the words that find it, and the
constant or default it is. A constant changed and a page left saying the old number fails
here, naming both; a page reworded keeps passing as long as the number is still there.
The lists a page writes in prose (sorts, chart series, settled states) are the code's too."""

# ruff: noqa: F401 - the names FIGURES' expressions use are imported for them
from __future__ import annotations

import argparse
import ast
import inspect
import re
import sys
import tomllib

import pytest
from tests.unit.docs_page import CODE, REPO, flat, page

from daemon.api import overview, signin_limit
from daemon.api.auth import SESSION_SECONDS
from daemon.api.roles import PAGE_ROLE
from daemon.cli.init_command import config_text
from daemon.config.settings import (
    DaemonSettings,
    GmailProviderSettings,
    GraphProviderSettings,
    StoreSettings,
)
from daemon.providers.base import DEFAULT_READBACK_FIRST, DEFAULT_READBACK_RATE
from daemon.providers.quota import GMAIL_GET_UNITS, GMAIL_LIST_UNITS, GMAIL_SEND_UNITS
from daemon.providers.transport import DEFAULT_MAX_IDLE
from daemon.service_layer.intake import MAX_LISTED
from daemon.service_layer.listing import LIMIT_DEFAULT, LIMIT_MAX
from daemon.service_layer.read_models import CONTENT_PAGE
from daemon.service_layer.services import SORTS, TRIAGE_NOTE, Services
from daemon.tools import demo, probe
from daemon.webhooks.events import WEBHOOK_TYPES
from daemon.webhooks.signing import SECRET_BYTES
from daemon.webhooks.status import COUNT_LIMIT
from daemon.webhooks.worker import Hook
from ledger import attachments, content, extra_headers, keys
from ledger.addresses import parse_mailbox
from ledger.stores.positions import LOCK_WAIT_MS
from ledger.vocabulary import FINAL_STATES
from policies.loader import MAX_POLICY_BYTES
from sendledger.client import Client
from testkit.graph_emulator import GraphEmulator


def probe_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    probe.register(parser.add_subparsers())
    [sub] = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return sub.choices["probe"]


def bench(script: str, option: str) -> object:
    for node in ast.walk(ast.parse((REPO / "bench" / script).read_text(encoding="utf-8"))):
        call = isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument"
        if call and ast.literal_eval(node.args[0]) == option:  # type: ignore[attr-defined]
            return next(ast.literal_eval(k.value) for k in node.keywords if k.arg == "default")
    raise AssertionError(f"no {option} in bench/{script}")


def bench_constant(script: str, name: str) -> object:
    tree = ast.parse((REPO / "bench" / script).read_text(encoding="utf-8"))
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        if any(getattr(t, "id", "") == name for t in targets):
            return ast.literal_eval(node.value)  # type: ignore[attr-defined]
    raise AssertionError(f"no {name} in bench/{script}")


GMAIL = GmailProviderSettings.model_fields
GRAPH = GraphProviderSettings.model_fields
CLIENT = inspect.signature(Client).parameters
STORE = StoreSettings()
PROBE = {o: a.default for a in probe_parser()._actions for o in a.option_strings}
QUOTA = GMAIL["quota_units_per_second"].default
GRACE = DaemonSettings.model_fields["deadline_grace"].default
LEASE = Hook("h", "https://a/", "whsec_a", frozenset(), timeout=1.0).lease
FIFTH = {4: "fifth"}[inspect.signature(GraphEmulator).parameters["mailbox_concurrency"].default]
LATENCY_CONCURRENCY = str(bench("pipeline.py", "--latency-concurrency")).split(",")[0]
FAULTS: dict[str, int] = bench_constant("soak.py", "FAULTS")  # type: ignore[assignment]
SOAK_FAULTS = sum(FAULTS.values()) - FAULTS["pass"]
DAEMONS = re.sub(r",(\d+)$", r" and \1", str(bench("daemons.py", "--daemons"))).replace(",", ", ")
SOAK_CONCURRENCY = int(
    re.search(r"concurrency = (\d+)", (REPO / "bench" / "soak.py").read_text())[1]
)
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
EVENTSOURCING = re.search(r"eventsourcing\[postgres\]>=([\d.]+),", str(PROJECT["dependencies"]))[1]
PYTHON = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["requires-python"][2:]
#: page | words with the figure as their one group | what it is (a Python expression).
FIGURES = r"""
cli.md | \(at most (\d+), each value | content.MAX_EXTRA_HEADERS
cli.md | each value at most ([\d,]+) characters, names | content.MAX_HEADER_VALUE
cli.md | characters, names at most (\d+)\) | extra_headers.MAX_HEADER_NAME
cli.md | a list of at most (\d+) message ids | content.MAX_REFERENCES
cli.md | `-`, `_`; at most (\d+)\) | content.MAX_THREAD_ID_LENGTH
cli.md | more than (\d+) characters without a space | extra_headers.MAX_WORD
cli.md | or is longer than (\d+) characters; a `send_at` | extra_headers.MAX_MESSAGE_ID
cli.md | only dots\), longer than (\d+) characters | attachments.MAX_FILENAME
cli.md | Gmail's defaults (\d+) MB | GMAIL['max_message_bytes'].default // 1000000
cli.md | Gmail's defaults \d+ MB and (\d+) | GMAIL['max_recipients'].default
cli.md | emoji without joiners are fine; at most (\d+) characters | content.MAX_KEY_LENGTH
cli.md | a token's name in `api.token_file`; at most (\d+) characters | keys.MAX_NAME_LENGTH
cli.md | lone surrogates and more than (\d+) characters | keys.MAX_NOTE_LENGTH
cli.md | reading the store a page of (\d+) jobs a query | CONTENT_PAGE
configuration.md | `whsec_<base64>` \((\d+)-\d+ bytes | SECRET_BYTES[0]
configuration.md | `whsec_<base64>` \(\d+-(\d+) bytes | SECRET_BYTES[1]
configuration.md | \(send (\d+), list/get | GMAIL_SEND_UNITS
configuration.md | list/get (\d+)\) | GMAIL_LIST_UNITS
http-api.md | after (\d+) failed attempts from one address | signin_limit.FAILURES
http-api.md | from one address within (\d+) minutes | signin_limit.WINDOW / 60
http-api.md | at most (\d+) errors | MAX_LISTED
http-api.md | `limit` 1 to (\d+) \(default | LIMIT_MAX
http-api.md | `limit` 1 to \d+ \(default (\d+)\) | LIMIT_DEFAULT
http-api.md | `retries` more times \(default (\d+)\) | CLIENT['retries'].default
http-api.md | `backoff` seconds \(default ([\d.]+)\) | CLIENT['backoff'].default
http-api.md | at most `max_backoff` \((\d+)\) | CLIENT['max_backoff'].default
http-api.md | `timeout` \(default (\d+) s\) | CLIENT['timeout'].default
http-api.md | prints a fresh secret \((\d+) random bytes\) | 32
http-api.md | lease in the store \(max\((\d+) s, 3 \u00d7 timeout\)\) | LEASE
http-api.md | (\d+) ms at the very most | LOCK_WAIT_MS
http-api.md | counted up to ([\d,]+) | COUNT_LIMIT
review.md | ; (\d+) a page\. | Services.review_queue.__kwdefaults__['per_page']
review.md | among the (\d+) most recently | Services.find_jobs.__kwdefaults__['scan']
review.md | content \(To, Subject\) of (\d+) jobs a query | CONTENT_PAGE
review.md | session cookie for (\d+) hours | SESSION_SECONDS // 3600
review.md | after (\d+) failed attempts within | signin_limit.FAILURES
review.md | failed attempts within (\d+) minutes | signin_limit.WINDOW / 60
review.md | until the oldest failure is (\d+) minutes old | signin_limit.WINDOW / 60
review.md | with the note "([^"]+)" | TRIAGE_NOTE
review.md | every page of `/ui/` needs `(\w+)` | PAGE_ROLE.value
providers.md | fixed \(the first (\d+), then | DEFAULT_READBACK_FIRST
providers.md | fixed \(the first \d+, then ([\d.]+); | DEFAULT_READBACK_RATE
providers.md | the defaults do: (\d+)s, | GRACE
providers.md | the defaults do: \d+s, 2 x (\d+)s | GRAPH['timeout'].default
providers.md | the defaults do: \d+s, 2 x \d+s \+ (\d+)s | GRAPH['confirm_wait'].default
providers.md | `--max-wait` \(default `(\w+)` | PROBE['--max-wait']
providers.md | `--interval`, default `(\w+)` | PROBE['--interval']
operations.md | runs the same (\w+) jobs on the Microsoft | {12: 'twelve'}[len(demo.JOBS)]
operations.md | and so does a (\w+) request in flight | FIFTH
performance.md | `store.pool_size` \(default (\d+)\) | STORE.pool_size
performance.md | `store.max_overflow` \((\d+)\) | STORE.max_overflow
performance.md | Idle connections \(over (\d+) s\) | DEFAULT_MAX_IDLE
performance.md | (\d+) quota units/s is | QUOTA
performance.md | quota units/s is ([\d.]+) sends/s | QUOTA / GMAIL_SEND_UNITS
performance.md | a bucket of (\d+) units refilled | QUOTA - GMAIL_SEND_UNITS
performance.md | \*\*\(a\)\*\* ([\d,]+) jobs, zero latency | bench('pipeline.py', '--n')
performance.md | (\d+) ms per Gmail API call | bench_constant('pipeline.py', 'LATENCY') * 1000
performance.md | call, concurrency (\d+) and \d+ | LATENCY_CONCURRENCY
performance.md | idle for 100 ms, (\d+) sends | bench('pipeline.py', '--idle-sends')
performance.md | `make bench`\): ([\d,]+) jobs with | bench('daemons.py', '--jobs')
performance.md | about (\d+) s of jobs, SQLite | bench('mailboxes.py', '--seconds')
performance.md | median of (\d+) processes each | bench('cli_latency.py', '--rounds')
performance.md | status` of (\d+) keys in one | bench('cli_latency.py', '--keys')
performance.md | ~/.cache/sendledger-bench/history-v(\d+)/ | bench_constant('history.py', 'SCHEMA')
policies.md | A policy file is at most (\d+) MiB | MAX_POLICY_BYTES // 2 ** 20
performance.md | \| >= ([\d.]+)x the bare loop | bench_constant('pipeline.py', 'CPU_GOAL')
performance.md | \| >= ([\d.]+) of ideal \| 74 | bench_constant('pipeline.py', 'LATENCY_GOAL')
performance.md | The goal, `status KEY` <= ([\d.]+) s | bench_constant('cli_latency.py', 'GOAL')
performance.md | in `make bench`\): (\d+) mailboxes | bench('mailboxes.py', '--mailboxes')
performance.md | ceiling\); median of (\d+) rounds | bench('mailboxes.py', '--rounds')
performance.md | alternating, median of (\d+) rounds | bench('daemons.py', '--rounds')
performance.md | modes\), (\d, \d and \d) daemon processes | DAEMONS
performance.md | jobs with (\d+)% faults | SOAK_FAULTS
performance.md | daemon processes \(concurrency (\d+) each\) | SOAK_CONCURRENCY
performance.md | settled jobs against one of ([\d,]+) | bench('history.py', '--jobs')
performance.md | process of its own, median of (\d+)\. | bench('history.py', '--rounds')
http-api.md | \(about ([\d,]+) levels\) | sys.getrecursionlimit()
http-api.md | longer than ([\d,]+) digits | sys.get_int_max_str_digits()
README.md | eventsourcing.readthedocs.io/\) ([\d.]+) | EVENTSOURCING
development.md | Requirements: Python >= ([\d.]+) | PYTHON
"""


def number(text: object) -> object:
    """A figure as a page writes it or as the code holds it, comparable: 2,000 and 2000.0
    are 2000."""
    plain = str(text).replace(",", "")
    try:
        value = float(plain)
    except ValueError:
        return plain
    return int(value) if value == int(value) else value


ROWS = [line.split(" | ") for line in FIGURES.strip().splitlines()]


@pytest.mark.parametrize(("name", "words", "value"), ROWS, ids=[r[1][:40] for r in ROWS])
def test_each_figure_a_page_quotes_is_the_code_s(name: str, words: str, value: object) -> None:
    found = re.findall(words, flat(page(name)))
    assert found, f"{name}: no {words!r}: reworded? then change FIGURES"
    assert {number(f) for f in found} == {number(eval(value))}, (name, words, value)


def test_the_lists_a_page_writes_in_prose_are_the_code_s() -> None:
    review = flat(page("review.md"))
    sorts = re.search(r"sort by (\w+), (\w+), (\w+) or (\w+);", review)
    shown = {"since": "age", "key": "key", "reason": "reason", "channel": "channel"}
    assert sorts and set(sorts.groups()) == {shown[s.lstrip("-")] for s in SORTS}
    chart = re.search(r"chart of (\w+) \(\w+\), (\w+), (\w+) and (\w+) \(", review)
    assert chart and list(chart.groups()) == [name for name, _, _ in overview.SERIES]
    configuration = flat(page("configuration.md"))
    settled = re.findall(r"settled for good \((\w+), (\w+),? (?:or )?(\w+)", configuration)
    assert settled and all(set(words) == {str(s) for s in FINAL_STATES} for words in settled)
    row = next(
        r for r in page("configuration.md").splitlines() if r.startswith("| `webhooks.NAME.events`")
    )
    assert set(re.findall(r"`([a-z]+)`", row.split("|")[3])) == set(WEBHOOK_TYPES)
    count = ("six", "seven", "eight").index(row.split("|")[2].strip().removeprefix("all ")) + 6
    assert count == len(WEBHOOK_TYPES)  # the default, "all seven"
    assert GMAIL_GET_UNITS == GMAIL_LIST_UNITS  # "list/get": one figure for both
    graph = (
        flat(page("providers.md"))
        .split("*Application* permissions", 1)[1]
        .split(", then *Grant")[0]
    )
    written = config_text("graph", parse_mailbox("you@example.com"))
    permissions = re.findall(r"`(Mail\.\w+)`", graph)
    assert permissions and f"permissions {' and '.join(permissions)} for `user`" in written
    grace = DaemonSettings.model_fields["deadline_grace"].default
    assert grace >= 2 * GRAPH["timeout"].default + GRAPH["confirm_wait"].default
    for outcome in CODE.findall(
        flat(page("operations.md")).split("OUTCOME column says", 1)[1].split(";")[0]
    ):
        assert f'"{outcome}"' in (REPO / "src" / "daemon" / "tools" / "demo.py").read_text(), (
            outcome
        )

"""The figures, lists and tables of names the pages write are the code's: a row holds a page,
the words that find them and the code they are (docs/development.md "Writing the docs")."""

# ruff: noqa: F401 - the names FIGURES' and LISTS' expressions use are imported for them
from __future__ import annotations

import ast
import dataclasses
import inspect
import re
import sys
import tomllib
from contextlib import closing

import pytest
from tests.unit.docs_code import EVENTS, FIELDS, KEYS, KINDS, SECTIONS, bench, parsers
from tests.unit.docs_page import CODE, PAGES, flat, keyed, page, section
from tests.unit.engine_rig import EngineRig
from tests.unit.test_services import LEGAL, OTHER, in_review, services

from daemon import from_settings, systemd
from daemon.api import auth, overview, roles, signin_limit
from daemon.cli.init_command import config_text
from daemon.config import environment, settings, stop_bound
from daemon.providers import base, gmail, outcomes, quota, smtp_submit, transport
from daemon.service_layer import guidance, listing, problems, read_models
from daemon.service_layer.services import SORTS, TRIAGE_NOTE, Services
from daemon.tools import demo
from daemon.webhooks import events, signing, status, worker
from ledger import addresses, attachments, characters, content, copies, display, extra_headers, keys
from ledger.stores import positions, url
from ledger.vocabulary import FINAL_STATES, OPEN_STATES, EscalationReason, JobState
from policies import loader, model
from sendledger.client import Client
from testkit import graph_emulator, relay, smtp_relay


def triage_actions() -> set[str]:
    """The actions triage takes: one copy, none, a dry run and a failed search."""
    with closing(EngineRig(LEGAL, OTHER)) as rig:
        in_review(rig, "one", copies=1)
        in_review(rig, "none", copies=0)
        seen = {item.action for item in services(rig).triage(by="ops", dry_run=True)}
        seen |= {item.action for item in services(rig).triage(by="ops")}
        rig.provider.fail_searches(1)
        return seen | {item.action for item in services(rig).triage(by="ops")}


GMAIL, GRAPH = KINDS["gmail"].model_fields, KINDS["graph"].model_fields
CLIENT = {n: p.default for n, p in inspect.signature(Client).parameters.items()}
PROBE = {o: a.default for a in parsers()[("probe",)]._actions for o in a.option_strings}
QUOTA = GMAIL["quota_units_per_second"].default
GRACE = SECTIONS["daemon"].model_fields["deadline_grace"].default
STOP = (stop_bound.STOP_LOCK_WAITS, url.DEFAULT_LOCK_TIMEOUT, settings.DEFAULT_STOP_TIMEOUT)
WAITS = (GRACE, GRAPH["timeout"].default, GRAPH["confirm_wait"].default)
HEADERS = (content.MAX_EXTRA_HEADERS, content.MAX_HEADER_VALUE, extra_headers.MAX_HEADER_NAME)
SIGN_IN = (signin_limit.FAILURES, signin_limit.WINDOW / 60)
LEASE = worker.Hook("h", "https://a/", "whsec_a", frozenset(), timeout=1.0).lease
EMULATOR = inspect.signature(graph_emulator.GraphEmulator).parameters
FIFTH = {4: "fifth"}[EMULATOR["mailbox_concurrency"].default]
LATENCY_CONCURRENCY = str(bench("pipeline.py")["--latency-concurrency"]).split(",")[0]
SOAK_FAULTS = sum(v for k, v in bench("soak.py")["FAULTS"].items() if k != "pass")
DAEMONS = re.sub(r",(\d+)$", r" and \1", str(bench("daemons.py")["--daemons"])).replace(",", ", ")
SOAK_CONCURRENCY = int(re.findall(r"concurrency = (\d+)", page("bench/soak.py"))[0])
PROJECT = tomllib.loads(page("pyproject.toml"))["project"]
EVENTSOURCING = re.findall(r"eventsourcing\[postgres\]>=([\d.]+),", str(PROJECT["dependencies"]))[0]
SECRETS = {key for _, key in KEYS if key.endswith("_file")}
DEMO = ast.walk(ast.parse(page("src/daemon/tools/demo.py")))
DEMO_STRINGS = {n.value for n in DEMO if isinstance(n, ast.Constant)}
GRAPH_CONFIG = config_text("graph", addresses.parse_mailbox("you@example.com"))
PERMISSIONS = re.findall(r"permissions (Mail\.\w+) and (Mail\.\w+) for `user`", GRAPH_CONFIG)[0]
CHECKED = [f.name for f in dataclasses.fields(EVENTS["Checked"]) if f.name != "timestamp"]
SORTED_BY = {{"since": "age"}.get(s, s) for s in (s.lstrip("-") for s in SORTS)}
ROUTES = {f"{m} {p}": r.value for (m, p), r in roles.ROUTE_ROLES.items()}
ROUTES["/ui/"] = roles.PAGE_ROLE.value
REASONS = {r.value: [guidance.MEANING[r], guidance.NEXT[r]] for r in EscalationReason}
OWNED = {*extra_headers.OWNED_HEADERS, "content-*"} - {"message-id"}
CRASH = page("tests/e2e/test_crash_matrix.py")
CRASH_MODES = ast.literal_eval(re.findall(r"^MODES: .+? = (\(.*?\n\))", CRASH, re.M | re.S)[0])
POLICY_EVENTS = {k for k, fields in FIELDS.items() if {"policy", "fingerprint"} <= fields}
#: page (`*`: every page) | words with the figures as their groups | what they are (a Python
#: expression; a tuple for several groups).
FIGURES = r"""
cli.md | \(at most (\d+), each value at most ([\d,]+) \w+, names at most (\d+)\) | HEADERS
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
* | (?:the store a page|\(To, Subject\)) of (\d+) jobs a query | read_models.CONTENT_PAGE
configuration.md | `whsec_<base64>` \((\d+)-(\d+) bytes | signing.SECRET_BYTES
configuration.md | \(send (\d+), list/get (\d+)\) | (quota.GMAIL_SEND_UNITS, quota.GMAIL_LIST_UNITS)
configuration.md | list/get (\d+)\) | quota.GMAIL_GET_UNITS
configuration.md | `webhooks.NAME.events` \| all (\w+) \| | {7: 'seven'}[len(events.WEBHOOK_TYPES)]
* | after (\d+) failed attempts (?:from one address )?within (\d+) minutes | SIGN_IN
http-api.md | at most (\d+) errors | problems.MAX_LISTED
http-api.md | `limit` 1 to (\d+) \(default (\d+)\) | (listing.LIMIT_MAX, listing.LIMIT_DEFAULT)
http-api.md | `retries` more times \(default (\d+)\) | CLIENT['retries']
http-api.md | `backoff` seconds \(default ([\d.]+)\) | CLIENT['backoff']
http-api.md | at most `max_backoff` \((\d+)\) | CLIENT['max_backoff']
http-api.md | `timeout` \(default (\d+) s\) | CLIENT['timeout']
http-api.md | prints a fresh secret \((\d+) random bytes\) | 32
http-api.md | lease in the store \(max\((\d+) s, 3 \u00d7 timeout\)\) | LEASE
http-api.md | (\d+) ms at the very most | positions.LOCK_WAIT_MS
http-api.md | counted up to ([\d,]+) | status.COUNT_LIMIT
http-api.md | \(about ([\d,]+) levels\) | sys.getrecursionlimit()
http-api.md | longer than ([\d,]+) digits | sys.get_int_max_str_digits()
review.md | ; (\d+) a page\. | Services.review_queue.__kwdefaults__['per_page']
review.md | among the (\d+) most recently | Services.find_jobs.__kwdefaults__['scan']
review.md | session cookie for (\d+) hours | auth.SESSION_SECONDS // 3600
review.md | until the oldest failure is (\d+) minutes old | signin_limit.WINDOW / 60
review.md | with the note "([^"]+)" | TRIAGE_NOTE
review.md | every page of `/ui/` needs `(\w+)` | roles.PAGE_ROLE.value
providers.md | fixed \(the first (\d+), then | base.DEFAULT_READBACK_FIRST
providers.md | fixed \(the first \d+, then ([\d.]+); | base.DEFAULT_READBACK_RATE
providers.md | the defaults do: (\d+)s, 2 x (\d+)s \+ (\d+)s | WAITS
providers.md | `--max-wait` \(default `(\w+)` | PROBE['--max-wait']
providers.md | `--interval`, default `(\w+)` | PROBE['--interval']
providers.md | goes in groups of (\d+)\s+commands | smtp_submit.PIPELINE_GROUP
operations.md | runs the same (\w+) jobs on the Microsoft | {12: 'twelve'}[len(demo.JOBS)]
* | at most ([\d,]+) long as (?:ASCII )?JSON | characters.MAX_RECORDED
how-it-works.md | the mark within\s+the ([\d,]+); | characters.MAX_RECORDED
how-it-works.md | A log line quotes less: (\d+) characters | display.MAX_QUOTED
* | the first (\d+)(?= found| kept, all counted|, `complete` false) | copies.COPIES_KEPT
* | (?:(?:once|until) it has(?: found)?|stopped reading at) (\d+) | outcomes.SEARCH_STOPS_AT
* | A search that reads (\d+) messages that are not? copies | outcomes.SEARCH_READS_MAX
how-it-works.md | characters of plain text, up to (\d+) emoji | characters.MAX_RECORDED // 12
operations.md | wait(?:s longer:|ing) up to (\d+) s | from_settings.SERVICE_START_WAIT
configuration.md | a service's start \(`run`, `api`\) for (\d+) s | from_settings.SERVICE_START_WAIT
performance.md | `run` or `api`: (\d+) s | from_settings.SERVICE_START_WAIT
operations.md | each within `store.connect_timeout`, plus (\d+) | systemd.START_MARGIN
operations.md | and so does a (\w+) request in flight | FIFTH
operations.md | held by another session (\w+) times in a row | {6: 'six'}[STOP[0]]
operations.md | the defaults, (\d+) \u00d7 (\d+) s, fit (\d+) s | STOP
performance.md | `store.pool_size` \(default (\d+)\) | SECTIONS['store']().pool_size
performance.md | `store.max_overflow` \((\d+)\) | SECTIONS['store']().max_overflow
performance.md | Idle connections \(over (\d+) s\) | transport.DEFAULT_MAX_IDLE
performance.md | (\d+) quota units/s is ([\d.]+) sends/s | (QUOTA, QUOTA / quota.GMAIL_SEND_UNITS)
performance.md | a bucket of (\d+) units refilled | QUOTA - quota.GMAIL_SEND_UNITS
performance.md | \*\*\(a\)\*\* ([\d,]+) jobs, zero latency | bench('pipeline.py')['--n']
performance.md | (\d+) ms per Gmail API call | bench('pipeline.py')['LATENCY'] * 1000
performance.md | call, concurrency (\d+) and \d+ | LATENCY_CONCURRENCY
performance.md | idle for 100 ms, (\d+) sends | bench('pipeline.py')['--idle-sends']
performance.md | \): ([\d,]+) jobs with (\d+)% faults | (bench('daemons.py')['--jobs'], SOAK_FAULTS)
performance.md | (\d, \d and \d) daemon processes \(concurrency (\d+) | (DAEMONS, SOAK_CONCURRENCY)
performance.md | about (\d+) s of jobs, SQLite | bench('mailboxes.py')['--seconds']
performance.md | median of (\d+) processes each | bench('cli_latency.py')['--rounds']
performance.md | status` of (\d+) keys in one | bench('cli_latency.py')['--keys']
performance.md | ~/.cache/sendledger-bench/history-v(\d+)/ | bench('history.py')['SCHEMA']
performance.md | restarts over ([\d,]+) and ([\d,]+) waiting | bench('bounce_restart.py')['JOBS']
performance.md | start behind them, (\d+) check workers | bench('bounce_restart.py')['WORKERS']
performance.md | \| >= ([\d.]+)x the bare loop | bench('pipeline.py')['CPU_GOAL']
performance.md | \| >= ([\d.]+) of ideal \| 74 | bench('pipeline.py')['LATENCY_GOAL']
performance.md | The goal, `status KEY` <= ([\d.]+) s | bench('cli_latency.py')['GOAL']
performance.md | in `make bench`\): (\d+) mailboxes | bench('mailboxes.py')['--mailboxes']
performance.md | ceiling\); median of (\d+) rounds | bench('mailboxes.py')['--rounds']
performance.md | alternating, median of (\d+) rounds | bench('daemons.py')['--rounds']
performance.md | settled jobs against one of ([\d,]+) | bench('history.py')['--jobs']
performance.md | process of its own, median of (\d+)\. | bench('history.py')['--rounds']
policies.md | A policy file is at most (\d+) MiB | loader.MAX_POLICY_BYTES // 2 ** 20
README.md | eventsourcing.readthedocs.io/\) ([\d.]+) | EVENTSOURCING
development.md | Requirements: Python >= ([\d.]+) | PROJECT['requires-python'][2:]
"""
#: page | words with the list as their one group (split at commas, "or", "and"; its code
#: spans if it has any) or as their groups | what it is: a list (in order), a set, `~= ` a
#: set in any case, `<= ` a set the list is part of, `>= ` a set part of the list.
LISTS = r"""
review.md | sort by (\w+, \w+, \w+ or \w+); | SORTED_BY
review.md | chart of (\w+) \(\w+\), (\w+), (\w+) and (\w+) \( | [s[0] for s in overview.SERIES]
review.md | \(`action`: ([^)]+)\) | triage_actions()
review.md | `Checked` event \(([^)]+)\) | [f for f in CHECKED if not f.startswith('originator')]
configuration.md | settled for good \((\w+), (\w+),? (?:or )?(\w+) | {str(s) for s in FINAL_STATES}
configuration.md | \| `webhooks.NAME.events` \| all \w+ \| (.*?) \| | set(events.WEBHOOK_TYPES)
configuration.md | \*\*Files\.\*\* Every secret file \(([^)]+)\) | SECRETS
configuration.md | (`SENDLEDGER_[A-Z_]+`) | >= set(environment.OTHER_VARIABLES)
providers.md | \*Application\* permissions (`Mail\.\w+`) \(.*?\) and (`Mail\.\w+`) | PERMISSIONS
providers.md | by `kind` in `\[providers\.NAME\]`: (.*?); a table | list(settings._PROVIDER_TAGS)
providers.md | (`https://[^`]+` and `https://[^`]+`) | gmail.SCOPES
providers.md | drafts need (`https://[^`]+`) besides the two | gmail.DRAFT_SCOPES[2:]
operations.md | OUTCOME column says (.*?); | <= DEMO_STRINGS
operations.md | Relay modes: (.*?) A comma-separated | list(relay.MODES)
operations.md | Relay modes: (.*?) A comma-separated | >= set(demo.SEND_FAULTS)
operations.md | behind the SMTP fault relay \(([^)]+)\) | list(smtp_relay.SMTP_MODES)
operations.md | behind the SMTP fault relay \(([^)]+)\) | set(demo.SMTP_FAULTS)
operations.md | open jobs per state \(([^)]+)\) | [str(s) for s in OPEN_STATES]
operations.md | `(circuit_\w+)` | <= set(SECTIONS['daemon'].model_fields)
operations.md | reason `([a-z-]+)` | <= {r.value for r in EscalationReason}
how-it-works.md | States shown to users: (.*?)\. | [s.value for s in JobState]
how-it-works.md | records a policy's decision \((.*?)\) | POLICY_EVENTS
how-it-works.md | for each of (.*?); each ends | list(CRASH_MODES)
how-it-works.md | \| promise ((?:\| `[^`]+` )+)\| | list(model.OnUnknown.__args__)
cli.md | Required: ((?:`\w+`(?:,\s)?)+)\. | list(content.REQUIRED_FIELDS)
cli.md | `\{"Name": "value"\}`: (.+?) \(at most | [*extra_headers.ALLOWED_HEADERS.values(), 'X-*']
cli.md | \(`headers\.Message-ID: [^`]+`; also (.+?): use | ~= OWNED
cli.md | display name with any of (.+?) must be in double | set(addresses._SPECIALS)
"""
#: page | section | the first cell of its table's header | its rows' first cells (a list in
#: order or a set), or every row as {first cell: the next cell, or [all the other cells]}.
TABLES = r"""
http-api.md | ### Roles | role | [role.value for role in auth.Role]
http-api.md | ### Roles | route | ROUTES
http-api.md | ## Webhooks | type | [entry.type for entry in events.WEBHOOK_EVENTS]
http-api.md | ## Webhooks | `rejected` reason | list(events.REJECTED_CODES)
review.md | ## Review: check, resend, triage, cancel | Reason | REASONS
"""
FIGURE_ROWS, LIST_ROWS, TABLE_ROWS = (
    [pytest.param(*row.split(" | "), id=row[:60]) for row in t.strip().splitlines()]
    for t in (FIGURES, LISTS, TABLES)
)


def number(text: object) -> object:
    """A figure as written or held, comparable (2,000 and 2000.0 are 2000); several: a tuple."""
    if isinstance(text, tuple):
        return tuple(map(number, text))
    if not re.fullmatch(r"\d+(\.\d+)?", plain := str(text).replace(",", "")):
        return plain
    return int(float(plain)) if float(plain).is_integer() else float(plain)


def found(name: str, words: str) -> list[str | tuple[str, ...]]:
    text = "\n".join(p.read_text(encoding="utf-8") for p in PAGES) if name == "*" else page(name)
    hits = re.findall(words, flat(text))
    assert hits, f"{name}: no {words!r}: reworded? then change the table"
    return hits


@pytest.mark.parametrize(("name", "words", "value"), FIGURE_ROWS)
def test_each_figure_a_page_quotes_is_the_code_s(name: str, words: str, value: str) -> None:
    written, code = {number(f) for f in found(name, words)}, number(eval(value))
    assert written == {code}, f"{name}: {words!r} says {written}, the code {value} is {code}"


def items(hit: str | tuple[str, ...]) -> list[str]:
    """A list as written: its groups, or its code spans, or its words between commas."""
    if isinstance(hit, tuple):
        return [i for group in hit for i in items(group)]
    return CODE.findall(hit) or [w for w in re.split(r",?\s+(?:or|and)\s+|,\s*", hit) if w]


def differs(where: str, written: list[str] | dict[str, list[str]], value: str) -> str | None:
    """What is wrong with a list a page writes against LISTS' or TABLES' `value`."""
    op, expression = value.split(" ", 1) if value[:3] in ("<= ", ">= ", "~= ") else ("", value)
    code = eval(expression)
    if isinstance(code, dict):  # a table's rows: their first cell, or every cell
        assert isinstance(written, dict), written
        whole = isinstance(next(iter(code.values())), list)
        rows = {k: cells if whole else cells[0] for k, cells in dict(written).items()}
        both = {k: (rows.get(k), code.get(k)) for k in {*rows, *code}}
        wrong = {k: pair for k, pair in both.items() if pair[0] != pair[1]}
        return f"{where}: (page, code) differ at {wrong}" if wrong else None
    ordered = not op and not isinstance(code, set | frozenset)
    case = str.lower if op == "~=" else str
    written, code = [case(w) for w in written], [case(str(c)) for c in code]
    compare = {"<=": set.issubset, ">=": set.issuperset}.get(op, set.__eq__)
    ok = written == code if ordered else compare(set(written), set(code))
    more, fewer = sorted(set(written) - set(code)), sorted(set(code) - set(written))
    return None if ok else f"{where} {written}: {more} more, {fewer} fewer than {op} {expression}"


@pytest.mark.parametrize(("name", "words", "value"), LIST_ROWS)
def test_the_lists_a_page_writes_in_prose_are_the_code_s(name: str, words: str, value: str) -> None:
    written = [i for hit in found(name, words) for i in items(hit)]
    assert not (wrong := differs(f"{name}: {words!r} lists", written, value)), wrong


@pytest.mark.parametrize(("name", "heading", "first", "value"), TABLE_ROWS)
def test_each_table_s_rows_are_the_code_s(name: str, heading: str, first: str, value: str) -> None:
    where = f"{name} {heading!r}, table {first!r}"
    assert not (wrong := differs(where, keyed(section(name, heading), first), value)), wrong

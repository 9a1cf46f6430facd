"""Whether the docs tests catch the drifts they are there to catch: a mutation harness for
tests/unit/test_docs_*.py (and their reader, tests/unit/docs_page.py), so a change that
makes those tests smaller can show it still catches everything the current ones catch.

    .venv/bin/python scripts/docs_mutations.py [--root TREE] [--only NAME,...] [--jobs N]
                                               [--first] [--json]

A mutation is one realistic drift between the docs and the code, written as data below
(MUTATIONS): a plain text replacement of `old` by `new` in one file, on either side: a
page changed and the code left (a default reverted in docs/configuration.md, an option
renamed in docs/cli.md, a link broken, a test cited that does not exist, an example's
printed error reworded), or the code changed and the page left (a default in
src/daemon/config/settings.py, an option of the CLI, a route, an exit code, a bench
script's default, a line of the Makefile's bench recipe, a constant a page quotes).

`--root` tests another checkout (default: the one this script is in). Before anything
runs, every mutation's `old` must occur exactly once in its file of that tree; one that
does not is stale (the text it changes was reworded): the script names it and exits 2.
Then the tree is copied to a fresh temporary folder (without .git, .venv, caches and
*.egg-info) and the docs tests run there unmutated, which must pass (else exit 1); then
each mutation gets its own fresh copy with the one replacement made, and

    <root>/.venv/bin/python -m pytest -q -p no:cacheprovider -rfE tests/unit/test_docs_*.py

runs inside it with PYTHONPATH=<copy>/src:<copy>, so the copy's own source and tests are
imported (the venv's editable install points at /work/main/src; PYTHONPATH comes first).
A root without a .venv uses the venv of the tree this script is in, else the interpreter
that runs the script (a git worktree has no .venv of its own). The mutation is
caught when pytest fails; the test files with a failed test (or a collection error) are
the ones that caught it: every such file, since the run does not stop at the first failure
unless `--first` is given (pytest -x: faster, names only the first file in file order).

`--jobs` runs that many mutations at once (default 2; one run is 20 to 40 s). The table
lists each mutation, the file it changes, caught (yes/NO) and the test files that caught
it (`domain` for tests/unit/test_docs_domain.py); then per test file how many mutations
it caught and how many only it caught, and `N mutations, M caught`. `--json` prints the
same as JSON. Exit 0 only when every mutation is caught, 1 otherwise.

A mutation that is not caught is a fact the docs tests do not check (or no longer check):
either a test lost it, or the mutation is not one the tests were meant to catch.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
TESTS = "tests/unit/test_docs_*.py"
#: The short names of the test files, as the table shows them.
TEST_FILES = ("domain", "examples", "figures", "interface", "paths", "settings")
IGNORED = shutil.ignore_patterns(
    ".git", ".venv", "__pycache__", "*.egg-info", ".mypy_cache", ".ruff_cache", ".pytest_cache"
)
IGNORED_TOP = {"mutants"}  # mutmut's work tree: no docs test reads it
RUN_TIMEOUT = 900.0


@dataclass(frozen=True)
class Mutation:
    name: str
    path: str
    old: str
    new: str
    why: str


@dataclass
class Result:
    name: str
    path: str
    caught: bool
    by: list[str]
    seconds: float
    why: str
    tests: list[str]


M = Mutation
MUTATIONS: tuple[Mutation, ...] = (
    # -- settings: the key, range and field tables against the models ----------------------
    M(
        "settings-code-concurrency-default",
        "src/daemon/config/settings.py",
        "concurrency: int = Field(default=4, ge=1, le=256)",
        "concurrency: int = Field(default=8, ge=1, le=256)",
        "daemon.concurrency's default raised, configuration.md still says 4",
    ),
    M(
        "settings-code-circuit-failures-default",
        "src/daemon/config/settings.py",
        "circuit_failures: int = Field(default=3, ge=1, le=1000)",
        "circuit_failures: int = Field(default=5, ge=1, le=1000)",
        "daemon.circuit_failures' default changed, the key table left at 3",
    ),
    M(
        "settings-example-pool-size",
        "config.example.toml",
        "# pool_size = 5\n",
        "# pool_size = 8\n",
        "config.example.toml's commented-out pool_size no longer the default it shows",
    ),
    M(
        "settings-code-connection-max-age-default",
        "src/daemon/config/settings.py",
        "connection_max_age: Grace = 300.0",
        "connection_max_age: Grace = 600.0",
        'connection_max_age\'s default changed, config.example.toml still shows "5m"',
    ),
    M(
        "settings-code-smtp-port-default",
        "src/daemon/config/settings.py",
        "smtp_port: int = Field(default=587, ge=1, le=65535)",
        "smtp_port: int = Field(default=465, ge=1, le=65535)",
        "smtp-imap's smtp_port default moved to implicit TLS, the tables say 587",
    ),
    M(
        "settings-code-sent-copy-choice",
        "src/daemon/config/settings.py",
        'sent_copy: Literal["server", "client"] = "server"',
        'sent_copy: Literal["server", "client", "both"] = "server"',
        "a new choice of sent_copy that no row names",
    ),
    M(
        "settings-code-batch-size-range",
        "src/daemon/config/settings.py",
        "batch_size: int = Field(default=200, ge=1, le=100_000)",
        "batch_size: int = Field(default=200, ge=1, le=10_000)",
        "daemon.batch_size's upper bound lowered, the range table says 100000",
    ),
    M(
        "settings-code-policy-confirm-misses",
        "src/policies/model.py",
        "confirm_misses: PositiveInt = 2",
        "confirm_misses: PositiveInt = 3",
        "a policy's confirm_misses default changed, policies.md's field table says 2",
    ),
    M(
        "settings-code-policy-max-attempts-bound",
        "src/policies/model.py",
        "MAX_ATTEMPTS = 1000",
        "MAX_ATTEMPTS = 500",
        "max_attempts' bound halved, policies.md says 1 to 1000",
    ),
    M(
        "settings-docs-tick-default",
        "docs/configuration.md",
        "| `daemon.tick` | `1s` |",
        "| `daemon.tick` | `2s` |",
        "daemon.tick's documented default is not the model's",
    ),
    M(
        "settings-docs-imap-port-default",
        "docs/configuration.md",
        "| `providers.NAME.imap_port` | `993` |",
        "| `providers.NAME.imap_port` | `143` |",
        "the smtp-imap table gives IMAP's plain port as the default",
    ),
    M(
        "settings-docs-batch-size-range",
        "docs/configuration.md",
        "| `daemon.batch_size` | 1 to 100000 |",
        "| `daemon.batch_size` | 1 to 10000 |",
        "the range table's upper bound is not the model's",
    ),
    M(
        "settings-docs-api-max-body",
        "docs/http-api.md",
        "| `api.max_body` | `40MB` |",
        "| `api.max_body` | `4MB` |",
        "http-api.md's [api] table gives another max_body default",
    ),
    M(
        "settings-docs-webhook-example-default",
        "docs/http-api.md",
        'retry_backoff_max = "5m"',
        'retry_backoff_max = "10m"',
        "the webhook example shows a retry_backoff_max that is not the default",
    ),
    # -- interface: the CLI, exit codes, routes, metrics, client, review actions ----------
    M(
        "interface-docs-cancel-option",
        "docs/cli.md",
        "sendledger cancel KEY [--note TEXT]",
        "sendledger cancel KEY [--comment TEXT]",
        "the command list renames cancel's --note",
    ),
    M(
        "interface-docs-skip-choices",
        "docs/cli.md",
        "sendledger webhooks skip NAME [--to next|end] [--json]",
        "sendledger webhooks skip NAME [--to next|last] [--json]",
        "webhooks skip --to lists a choice the parser does not have",
    ),
    M(
        "interface-code-triage-dry-run",
        "src/daemon/cli/service.py",
        'p.add_argument("--dry-run", action="store_true", help="search, record nothing")',
        'p.add_argument("--simulate", action="store_true", help="search, record nothing")',
        "review triage's --dry-run renamed in the parser, cli.md left",
    ),
    M(
        "interface-code-emulator-history-lag",
        "src/daemon/cli/testkit_doubles.py",
        '"--history-lag", default="0"',
        '"--index-history-lag", default="0"',
        "emulator gmail's --history-lag renamed, the command list left",
    ),
    M(
        "interface-code-events-route",
        "src/daemon/api/jobs.py",
        '"/jobs/{key:key}/events",',
        '"/jobs/{key:key}/trail",',
        "a route's path changed, the route table left",
    ),
    M(
        "interface-code-metric-name",
        "src/daemon/api/metrics.py",
        '"sendledger_duplicates", "Jobs found sent two or more times"',
        '"sendledger_duplicate_copies", "Jobs found sent two or more times"',
        "a metric renamed in the registry, the metric table left",
    ),
    M(
        "interface-code-recorded-metric-label",
        "src/daemon/api/recorded_metrics.py",
        'labels=["purpose", "result"],',
        'labels=["purpose", "copies"],',
        "a label of a counter read at scrape time renamed, the metric table left",
    ),
    M(
        "interface-code-unknown-job-exit",
        "src/daemon/exit_codes.py",
        "EXIT_UNKNOWN_JOB = 4",
        "EXIT_UNKNOWN_JOB = 5",
        "the unknown-job exit code changed, cli.md and the help's epilog left",
    ),
    M(
        "interface-code-client-method",
        "src/sendledger/client.py",
        "def submit_many(",
        "def submit_all(",
        "a client call renamed, http-api.md's client section left",
    ),
    M(
        "interface-docs-listing-fields",
        "docs/http-api.md",
        '"updated", "version", "purged"}]',
        '"updated", "version"}]',
        "GET /v1/jobs' listed job drops a field the OpenAPI schema has",
    ),
    M(
        "interface-docs-limit",
        "docs/cli.md",
        "| extra headers | 50 |",
        "| extra headers | 64 |",
        "the limits table's header count is not the intake's",
    ),
    M(
        "interface-docs-refusal-status",
        "docs/architecture.md",
        "not found: 4 / 404",
        "not found: 4 / 410",
        'architecture.md "One service layer" maps not-found to another HTTP status',
    ),
    M(
        "interface-docs-review-action-route",
        "docs/review.md",
        "`POST /v1/review/{key}/check`",
        "`POST /v1/review/{key}/search`",
        "review.md's action table names a route that is not served",
    ),
    # -- domain: events, tick, guarantees, architecture, providers, make, bench ------------
    M(
        "domain-docs-event-name",
        "docs/how-it-works.md",
        "| `LeaseRenewed` |",
        "| `LeaseExtended` |",
        "the event table names an event the job does not have",
    ),
    M(
        "domain-docs-escalation-reason",
        "docs/how-it-works.md",
        "`handle-unreliable`, `no-policy`, `render-mismatch`",
        "`handle-unreliable`, `render-mismatch`",
        "the Escalated row drops a reason",
    ),
    M(
        "domain-docs-tick-step",
        "docs/how-it-works.md",
        "4. **verify**",
        "4. **recount**",
        "a tick step named as no engine step is",
    ),
    M(
        "domain-docs-guarantee-columns",
        "docs/how-it-works.md",
        "| promise | `retry` | `search-then-review` | `review` |",
        "| promise | `search-then-review` | `retry` | `review` |",
        "the guarantee table's columns are not on_unknown's order",
    ),
    M(
        "domain-docs-event-version",
        "docs/architecture.md",
        "`Attempted` is at version 3",
        "`Attempted` is at version 4",
        "architecture.md gives Attempted a class_version it does not have",
    ),
    M(
        "domain-docs-capability-default",
        "docs/architecture.md",
        "`timeout` (30 s)",
        "`timeout` (60 s)",
        "a provider capability's default written wrong",
    ),
    M(
        "domain-docs-layout-package",
        "docs/development.md",
        "- `src/policies/`: the policy model",
        "- `src/policy/`: the policy model",
        "the layout names a package that is not in src/",
    ),
    M(
        "domain-code-capability-default",
        "src/daemon/providers/base.py",
        "    timeout: float = 30.0",
        "    timeout: float = 20.0",
        "ProviderBase's timeout changed, architecture.md says 30 s",
    ),
    M(
        "domain-code-confirmed-via",
        "src/ledger/vocabulary.py",
        'OPERATOR = "operator"',
        'OPERATOR = "human"',
        "a ConfirmedVia value renamed, the Confirmed row left",
    ),
    M(
        "domain-code-make-bench-line",
        "Makefile",
        "\t$(BIN)/python bench/render.py\n",
        "",
        "a script dropped from make bench, development.md's list left",
    ),
    M(
        "domain-code-make-target",
        "Makefile",
        "mutation: $(STAMP)",
        "mutants: $(STAMP)",
        "a make target renamed, development.md still runs `make mutation`",
    ),
    # -- figures: numbers and lists in prose, tables of names -------------------------------
    M(
        "figures-code-pipeline-group",
        "src/daemon/providers/smtp_submit.py",
        "PIPELINE_GROUP = 32",
        "PIPELINE_GROUP = 16",
        'providers.md says RCPTs go "in groups of 32"',
    ),
    M(
        "figures-code-signin-failures",
        "src/daemon/api/signin_limit.py",
        "FAILURES = 5",
        "FAILURES = 10",
        "the sign-in limit changed, http-api.md and review.md say 5",
    ),
    M(
        "figures-code-bench-rounds",
        "bench/cli_latency.py",
        'parser.add_argument("--rounds", type=int, default=15,',
        'parser.add_argument("--rounds", type=int, default=21,',
        "a bench script's default changed, performance.md says a median of 15",
    ),
    M(
        "figures-code-policy-size",
        "src/policies/loader.py",
        "MAX_POLICY_BYTES = 1024 * 1024",
        "MAX_POLICY_BYTES = 2 * 1024 * 1024",
        "policies.md says a policy file is at most 1 MiB",
    ),
    M(
        "figures-code-triage-note",
        "src/daemon/service_layer/services.py",
        'TRIAGE_NOTE = "triage: one copy found"',
        'TRIAGE_NOTE = "triage: a copy found"',
        "review.md quotes triage's note",
    ),
    M(
        "figures-code-session-hours",
        "src/daemon/api/auth.py",
        "SESSION_SECONDS = 8 * 3600",
        "SESSION_SECONDS = 12 * 3600",
        "review.md says the session cookie lasts 8 hours",
    ),
    M(
        "figures-code-bench-goal",
        "bench/pipeline.py",
        "LATENCY_GOAL = 0.85",
        "LATENCY_GOAL = 0.9",
        "performance.md's goal row quotes the bench's goal",
    ),
    M(
        "figures-docs-pipeline-group",
        "docs/providers.md",
        "goes in groups of 32",
        "goes in groups of 64",
        "the pipelining figure is not PIPELINE_GROUP",
    ),
    M(
        "figures-docs-session-hours",
        "docs/review.md",
        "session cookie for 8 hours",
        "session cookie for 12 hours",
        "the session figure is not SESSION_SECONDS",
    ),
    M(
        "figures-docs-states-list",
        "docs/how-it-works.md",
        "States shown to users: `requested`, `attempted`, `unknown`,",
        "States shown to users: `requested`, `unknown`,",
        "the list of states drops one",
    ),
    M(
        "figures-docs-bench-median",
        "docs/performance.md",
        "median of 15 processes each",
        "median of 11 processes each",
        "cli_latency's rounds written wrong",
    ),
    M(
        "figures-docs-route-role",
        "docs/http-api.md",
        "| `GET /v1/review` | review |",
        "| `GET /v1/review` | read |",
        "the roles table gives a route another role than ROUTE_ROLES",
    ),
    # -- examples: commands parse, examples run, quoted errors are said -------------------
    M(
        "examples-docs-quoted-error",
        "docs/troubleshooting.md",
        "(the channels: notices, receipts)",
        "(the channels: receipts, notices)",
        "a quoted error is not the line sendledger prints",
    ),
    M(
        "examples-code-error-wording",
        "src/daemon/from_settings.py",
        '"`sendledger submit` creates it"',
        '"`sendledger submit` makes it"',
        "the no-store error reworded, troubleshooting.md quotes the old line",
    ),
    M(
        "examples-code-policy-error",
        "src/daemon/service_layer/intake.py",
        'f"no policy file for channel {channel!r}',
        'f"no policy for channel {channel!r}',
        "the missing-policy error reworded, troubleshooting.md quotes the old line",
    ),
    M(
        "examples-docs-client-keyword",
        "docs/http-api.md",
        'client.cancel("order-1043", note="order withdrawn")',
        'client.cancel("order-1043", reason="order withdrawn")',
        "the client example passes a keyword cancel does not take",
    ),
    M(
        "examples-code-client-keyword",
        "src/sendledger/client.py",
        'self, key: str, note: str = "", *, expected_version: int | None = None',
        'self, key: str, comment: str = "", *, expected_version: int | None = None',
        "Client.cancel's note renamed, the client example left",
    ),
    M(
        "examples-docs-durations",
        "docs/configuration.md",
        'Durations are `"250ms"`, `"30s"`',
        'Durations are `"250ms"`, `"45s"`',
        "the durations example is not what parse_duration gives in order",
    ),
    M(
        "examples-docs-message-id",
        "docs/how-it-works.md",
        "`<job-3bf8b157c4238eefe5ae4a66eca81c6b@mail.example.com>`",
        "`<job-3bf8b157c4238eefe5ae4a66eca81c6c@mail.example.com>`",
        "the Message-ID example is not message_id_for's",
    ),
    M(
        "examples-code-message-id",
        "src/ledger/message_id.py",
        "hexdigest()[:32]",
        "hexdigest()[:30]",
        "the Message-ID recipe changed, how-it-works.md's example left",
    ),
    M(
        "examples-docs-healthz-brief",
        "docs/http-api.md",
        '"policies": true, "providers": true}}',
        '"policies": true, "provider": true}}',
        "/healthz's brief answer shown with a key it does not have",
    ),
    M(
        "examples-code-watchdog",
        "packaging/sendledger.service",
        "WatchdogSec=60",
        "WatchdogSec=30",
        "the packaged unit's watchdog is not the one operations.md names",
    ),
    M(
        "examples-docs-quick-start-option",
        "README.md",
        "init mail --mailbox you@example.com",
        "init mail --mailbox-address you@example.com",
        "the quick start runs init with an option it does not have",
    ),
    M(
        "examples-docs-policy-example",
        "docs/policies.md",
        'give_up_after = "4h"',
        'give_up_after = "6h"',
        "policies.md's example no longer loads to give_up_after = 4h",
    ),
    # -- paths: links, anchors, named paths and names, citations --------------------------
    M(
        "paths-docs-link",
        "docs/development.md",
        "[Back to the README](../README.md)",
        "[Back to the README](../READ.md)",
        "a link to a file that is not there",
    ),
    M(
        "paths-docs-anchor",
        "docs/configuration.md",
        "[Stored mail](#stored-mail-file-modes-encryption-daemon-names)",
        "[Stored mail](#stored-mail)",
        "a link to a heading that is not there",
    ),
    M(
        "paths-docs-source-path",
        "docs/http-api.md",
        "(`daemon/webhooks/events.py`)",
        "(`daemon/webhooks/event.py`)",
        "a page names a source file that does not exist",
    ),
    M(
        "paths-docs-readme-list",
        "README.md",
        "- [Review](docs/review.md): check",
        "- Review: check",
        "the README no longer links to every page",
    ),
    M(
        "paths-code-docstring-member",
        "src/daemon/engine/bounces.py",
        "(`SendJob.record_bounce`, saved",
        "(`SendJob.note_bounce`, saved",
        "a docstring names a method the class does not have",
    ),
    M(
        "paths-code-package-docstring",
        "src/daemon/engine/__init__.py",
        "around one ``runner``;",
        "around one ``runners``;",
        "a package docstring names a module it does not have",
    ),
    M(
        "paths-code-citation",
        "src/daemon/exit_codes.py",
        '(docs/cli.md "Exit codes")',
        '(docs/cli.md "Exit statuses")',
        "a docstring cites a section cli.md does not have",
    ),
    M(
        "paths-docs-architecture-path",
        "docs/architecture.md",
        "`daemon/api/jobs.py`, `api/review.py`",
        "`daemon/api/job.py`, `api/review.py`",
        "architecture.md names a module that is not there",
    ),
    # -- checked: every section's row in "What checks this page", and what it names -------
    M(
        "checked-docs-row-removed",
        "docs/development.md",
        "| [Property tests](#property-tests) | `tests/unit/test_hypothesis_profile.py`, "
        "`tests/unit/test_job_properties.py::"
        "test_a_timeout_inside_a_property_test_is_reported_as_the_timeout` |\n",
        "",
        "a section with prose and no row naming what checks it",
    ),
    M(
        "checked-docs-checked-by-line",
        "docs/development.md",
        "the test after the files its worker ran first.\n",
        "the test after the files its worker ran first.\n"
        "Checked by: `tests/unit/test_hypothesis_profile.py`\n",
        "a `Checked by:` line in the prose instead of a row",
    ),
    M(
        "checked-docs-row-names-nothing",
        "docs/development.md",
        "| [Property tests](#property-tests) | `tests/unit/test_hypothesis_profile.py`, "
        "`tests/unit/test_job_properties.py::"
        "test_a_timeout_inside_a_property_test_is_reported_as_the_timeout` |",
        "| [Property tests](#property-tests) | the profile's own test |",
        "a row that names no test, bench script or command",
    ),
    M(
        "checked-docs-row-section-gone",
        "docs/development.md",
        "| [Property tests](#property-tests) |",
        "| [Property checks](#property-tests) |",
        "a row for a section the page does not have",
    ),
    M(
        "checked-docs-not-a-command",
        "docs/development.md",
        "`make test`, `make demo` |",
        "`make test`, `.venv/bin/sendledger demo` |",
        "a row names something that is not a test path, `make TARGET` or `sendledger COMMAND`",
    ),
    M(
        "checked-docs-make-target",
        "docs/performance.md",
        "`bench/soak.py`, `make soak`, `tests",
        "`bench/soak.py`, `make chaos`, `tests",
        "a row names a make target the Makefile does not have",
    ),
    M(
        "checked-docs-make-target-operations",
        "docs/operations.md",
        "| `make demo`, `tests/e2e/test_tools_cli.py",
        "| `make demonstrate`, `tests/e2e/test_tools_cli.py",
        "a row names a make target the Makefile does not have",
    ),
    # -- one for each docs test the ones above do not reach --------------------------------
    M(
        "domain-docs-gmail-outcome",
        "docs/how-it-works.md",
        "| `Rejected`, transient, unavailable: not sent |",
        "| `Rejected`, permanent, unavailable: not sent |",
        "the Gmail outcome table calls a refused connection permanent",
    ),
    M(
        "domain-docs-layer-module",
        "docs/architecture.md",
        "job_json, retention, guidance,\n",
        "job_json, retention,\n",
        "the layer list drops a module of the service layer",
    ),
    M(
        "domain-docs-typed-decision-command",
        "docs/architecture.md",
        "(`cancel`) | none | Cancelled |",
        "(`withdraw`) | none | Cancelled |",
        "the typed decisions table names a command the job does not have",
    ),
    M(
        "domain-docs-invariant-number",
        "docs/architecture.md",
        "1. **At most one provider call",
        "0. **At most one provider call",
        "the invariants are no longer numbered 1 to n",
    ),
    M(
        "domain-docs-smtp-stage",
        "docs/providers.md",
        "to EHLO, AUTH, MAIL, RCPT or DATA;",
        "to EHLO, AUTH, MAIL, RCPT or BDAT;",
        "the SMTP stages name one the classifier does not have",
    ),
    M(
        "domain-docs-bench-option",
        "docs/performance.md",
        "(`profile_pipeline.py --breakdown`, 2 runs)",
        "(`profile_pipeline.py --break-down`, 2 runs)",
        "performance.md names an option the bench script does not have",
    ),
    M(
        "examples-docs-fifo-error",
        "docs/configuration.md",
        "a named pipe (FIFO), not a regular file",
        "a FIFO, not a regular file",
        "the quoted FIFO refusal is not what sendledger says",
    ),
    M(
        "examples-docs-webhook-payload",
        "docs/http-api.md",
        '"event_id": "evt_5b1c...e2_4"',
        '"id": "evt_5b1c...e2_4"',
        "a webhook example's key is not the payload's",
    ),
    M(
        "interface-docs-status-field",
        "docs/cli.md",
        '"verifying","provider_message_ids"',
        '"verifying","provider_ids"',
        "status --json's fields listed with one the answer does not have",
    ),
    M(
        "interface-docs-error-status",
        "docs/http-api.md",
        "| 409 | a key known",
        "| 410 | a key known",
        "the error table gives a status no route answers",
    ),
    M(
        "interface-docs-webhook-status-field",
        "docs/http-api.md",
        "`--json` gives, per webhook: `name`, `configured`",
        "`--json` gives, per webhook: `name`, `enabled`",
        "webhooks status --json listed with a field it does not have",
    ),
    M(
        "settings-docs-page-key",
        "docs/performance.md",
        "(`providers.NAME.quota_units_per_second` is the",
        "(`providers.NAME.quota_units_per_sec` is the",
        "a page names a provider setting that does not exist",
    ),
    M(
        "settings-docs-index-word",
        "docs/configuration.md",
        "times, version, attempt count, reason",
        "times, version, reason",
        "the list of what the index keeps in the clear drops the attempt count",
    ),
    # -- one for each kind of fact a docs test checks that none of the above reaches --------
    M(
        "settings-docs-choice-renamed",
        "docs/configuration.md",
        "`client`: the daemon APPENDs",
        "`copy`: the daemon APPENDs",
        "the key table names a choice of sent_copy the model does not have (and not `client`)",
    ),
    M(
        "settings-docs-row-dropped",
        "docs/configuration.md",
        "| `daemon.tick` | `1s` | how often the daemon looks for due work |\n",
        "",
        "a setting of the model with no row in configuration.md's key tables",
    ),
    M(
        "settings-docs-provider-table-default",
        "docs/providers.md",
        '| `timeout` | `"30s"` | every provider call',
        '| `timeout` | `"60s"` | every provider call',
        "providers.md's Gmail key table gives timeout another default than the model's",
    ),
    M(
        "settings-docs-policy-default",
        "docs/policies.md",
        "| `irreversible` | `false` |",
        "| `irreversible` | `true` |",
        "policies.md's field table reverts irreversible's default",
    ),
    M(
        "settings-docs-library-variable",
        "docs/configuration.md",
        "`COMPRESSOR_TOPIC`",
        "`COMPRESSION_TOPIC`",
        "the page names an eventsourcing variable the library does not read",
    ),
    M(
        "domain-docs-event-field",
        "docs/how-it-works.md",
        "`content_hash`, `policy` and `fingerprint`, `submitted_by`",
        "`content_digest`, `policy` and `fingerprint`, `submitted_by`",
        "the Requested row names a field the event does not have",
    ),
    M(
        "domain-docs-readback",
        "docs/providers.md",
        "| none: a `250` names no stored copy",
        "| a `250` names no stored copy",
        "the kinds table says SMTP reads its sends back, the provider does not",
    ),
    M(
        "domain-docs-bench-variant",
        "docs/performance.md",
        "`--variant no-fsync`",
        "`--variant no-sync`",
        "performance.md names a pipeline variant the bench does not offer",
    ),
    M(
        "domain-docs-postgres-url",
        "docs/development.md",
        "@127.0.0.1:5432/sendledger_test`",
        "@127.0.0.1:5433/sendledger_test`",
        "the private PostgreSQL's URL is not the one tests/conftest.py uses",
    ),
    M(
        "examples-docs-fault-mode",
        "docs/operations.md",
        "--send drop-response,fail-before-forward,pass --search pass",
        "--send drop-response,fail-before-send,pass --search pass",
        "a shown emulator command names a fault mode the relay does not have",
    ),
    M(
        "examples-docs-policy-error-quote",
        "docs/policies.md",
        "must be at most 7d, got '30d'`",
        "must be at most 7 days, got '30d'`",
        "the quoted policy error is not what the loader says",
    ),
    M(
        "examples-docs-systemd-install",
        "docs/operations.md",
        "install -m 600 gmail-service-account.json /var/lib/sendledger/",
        "install -m 600 gmail-service-account.json /etc/sendledger/",
        "the systemd steps put the secret where init's config does not look",
    ),
    M(
        "interface-docs-positional-optional",
        "docs/cli.md",
        "sendledger history KEY [--json]",
        "sendledger history [KEY] [--json]",
        "the command list shows a required argument as optional",
    ),
    M(
        "interface-docs-optional-field",
        "docs/cli.md",
        "Optional: `html`, `cc`, `reply_to`, and:",
        "Optional: `html`, `reply_to`, and:",
        "the optional job fields drop one the intake takes",
    ),
    M(
        "interface-docs-route-status",
        "docs/http-api.md",
        "`status --json`; 404 unknown key |",
        "`status --json` |",
        "a route's row drops a status the route answers",
    ),
    M(
        "interface-docs-query-param",
        "docs/http-api.md",
        "`GET /v1/jobs?state=&channel=&since=&limit=&cursor=`",
        "`GET /v1/jobs?state=&channel=&since=&limit=&after=`",
        "the listing's query names a parameter the route does not take",
    ),
    M(
        "interface-docs-client-error-status",
        "docs/http-api.md",
        "| `Conflict` | 409 |",
        "| `Conflict` | 410 |",
        "the client's error table maps a status to another error class than the client",
    ),
    M(
        "interface-docs-metric-label",
        "docs/http-api.md",
        "| `sendledger_open_jobs` | gauge | `state`, `channel` (",
        "| `sendledger_open_jobs` | gauge | `state`, `provider` (",
        "the metric table gives a metric labels the registry does not",
    ),
    M(
        "interface-docs-alert-metric",
        "docs/alerts.yml",
        "sendledger_provider_handle_reliable == 0",
        "sendledger_handle_reliable == 0",
        "an alert's expression uses a metric that is not exposed",
    ),
    M(
        "interface-docs-review-button",
        "docs/review.md",
        '"Check the mailbox now"',
        '"Search the mailbox now"',
        "review.md names a button the templates do not have",
    ),
    M(
        "interface-code-epilog",
        "src/daemon/cli/__init__.py",
        '"130 interrupted."',
        '"131 interrupted."',
        "the help's epilog gives an exit code cli.md and the code do not have",
    ),
    M(
        "paths-docs-test-name",
        "docs/how-it-works.md",
        "test_docs_domain.py::test_the_tick_s_steps_are_the_engine_s_in_order",
        "test_docs_domain.py::test_the_tick_steps_are_the_engine_s",
        "a page names a test function that does not exist",
    ),
    M(
        "domain-code-make-demo-deps",
        "Makefile",
        "demo: $(RUN_STAMP)",
        "demo: $(STAMP)",
        "make demo installs the [test] extra, development.md says it installs only what runs",
    ),
    M(
        "domain-code-ci-run",
        ".ci/run",
        'export CI="${CI:-true}"\n',
        "",
        ".ci/run no longer sets CI before make test, as development.md says it does",
    ),
    M(
        "interface-docs-metric-page",
        "docs/performance.md",
        "(`sendledger_quota_available_units`)",
        "(`sendledger_quota_units`)",
        "performance.md names a metric the registry does not expose",
    ),
    M(
        "interface-docs-invalid-fields",
        "docs/http-api.md",
        '"field", "reason"}], "count"}',
        '"field", "message"}], "count"}',
        "the 422 row shows a field error with a key the schema does not have",
    ),
    M(
        "figures-docs-owned-header",
        "docs/cli.md",
        "`To`, `Cc`, `Bcc`, `Date`,",
        "`To`, `Cc`, `Date`,",
        "the headers sendledger writes itself lose one (a list compared in any case)",
    ),
    M(
        "figures-docs-reason-meaning",
        "docs/review.md",
        "so the daemon does not know how to send it.",
        "so the daemon cannot send it.",
        "the Reason table's meaning is not the guidance the review page shows",
    ),
    M(
        "paths-docs-page-citation",
        "docs/cli.md",
        '(docs/operations.md "Stopping")',
        '(docs/operations.md "Stopping it")',
        "a page cites a section another page does not have",
    ),
    M(
        "figures-code-graph-confirm-wait",
        "src/daemon/config/settings.py",
        "confirm_wait: _GraphSeconds = Field(default=3.0, ge=0, le=60)",
        "confirm_wait: _GraphSeconds = Field(default=15.0, ge=0, le=60)",
        "Graph's confirm_wait raised past what deadline_grace covers (2 x timeout + it)",
    ),
)


def stale(root: Path, mutations: Sequence[Mutation]) -> list[str]:
    """The mutations whose `old` does not occur exactly once in their file of `root`."""
    found = []
    for m in mutations:
        path = root / m.path
        text = path.read_text(encoding="utf-8") if path.is_file() else None
        count = 0 if text is None else text.count(m.old)
        if count != 1 or m.old == m.new:
            where = "no such file" if text is None else f"`old` occurs {count} times"
            found.append(f"{m.name}: {m.path}: {where}" if m.old != m.new else f"{m.name}: no-op")
    names = [m.name for m in mutations]
    twice = sorted({n for n in names if names.count(n) > 1})
    found += [f"{n}: the name is used twice" for n in twice]
    return found


def python_of(root: Path) -> Path:
    """The root's venv, else this tree's, else the interpreter running this script (a git
    worktree has no .venv of its own)."""
    for venv in (root, HERE):
        if (python := venv / ".venv" / "bin" / "python").exists():
            return python
    return Path(sys.executable)


def copy_tree(root: Path, into: Path) -> Path:
    copy = into / "tree"
    copy.mkdir()
    for entry in sorted(root.iterdir()):
        if entry.name in IGNORED_TOP or IGNORED(str(root), [entry.name]):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.copytree(entry, copy / entry.name, ignore=IGNORED, symlinks=True)
        else:
            shutil.copy2(entry, copy / entry.name, follow_symlinks=False)
    return copy


def catchers(output: str) -> list[str]:
    """The docs test files with a failed test or an error, by their short names."""
    hits = re.findall(r"^(?:FAILED|ERROR) tests/unit/test_docs_(\w+)\.py", output, re.M)
    return sorted(set(hits))


def failed_tests(output: str) -> list[str]:
    """The failed tests as `file::function` (parameters dropped; a collection error: the file)."""
    hits = re.findall(r"^(?:FAILED|ERROR) tests/unit/test_docs_(\w+)\.py(?:::(\w+))?", output, re.M)
    return sorted({f"{file}::{test}" if test else file for file, test in hits})


def run_tests(root: Path, mutation: Mutation | None, first: bool) -> tuple[bool, list[str], str]:
    """Copy `root`, apply `mutation` (None: the tree as it is), run the docs tests:
    (failed, the files that failed, pytest's output)."""
    with tempfile.TemporaryDirectory(prefix="docs-mutation-") as scratch:
        copy = copy_tree(root, Path(scratch))
        if mutation is not None:
            target = copy / mutation.path
            text = target.read_text(encoding="utf-8")
            target.write_text(text.replace(mutation.old, mutation.new, 1), encoding="utf-8")
        tests = sorted(str(p.relative_to(copy)) for p in copy.glob(TESTS))
        command = [str(python_of(root)), "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfE"]
        command += ["-x"] * first + tests
        env = {**os.environ, "PYTHONPATH": f"{copy / 'src'}{os.pathsep}{copy}"}
        env["PYTHONDONTWRITEBYTECODE"] = "1"
        env.pop("SENDLEDGER_CONFIG", None)
        try:
            done = subprocess.run(
                command,
                cwd=copy,
                env=env,
                capture_output=True,
                text=True,
                timeout=RUN_TIMEOUT,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            out = exc.stdout if isinstance(exc.stdout, str) else ""
            return True, [*catchers(out), "timeout"], out
        output = done.stdout + done.stderr
        return done.returncode != 0, catchers(output), output


def run_one(root: Path, mutation: Mutation, first: bool) -> Result:
    start = time.monotonic()
    failed, by, output = run_tests(root, mutation, first)
    spent = round(time.monotonic() - start, 1)
    return Result(
        mutation.name, mutation.path, failed, by, spent, mutation.why, failed_tests(output)
    )


def counts(results: Sequence[Result]) -> dict[str, dict[str, int]]:
    """Per test file: the mutations it caught, and those only it caught."""
    files = sorted({*TEST_FILES, *(f for r in results for f in r.by)})
    return {
        f: {
            "caught": sum(f in r.by for r in results),
            "alone": sum(r.by == [f] for r in results),
        }
        for f in files
    }


def show(results: Sequence[Result], seconds: float) -> None:
    name_width = max(len(r.name) for r in results)
    path_width = max(len(r.path) for r in results)
    print(f"{'mutation':<{name_width}}  {'file':<{path_width}}  caught  by")
    for r in results:
        caught = "yes" if r.caught else "NO"
        by = ", ".join(r.by) if r.by else ("-" if not r.caught else "(pytest failed, no file)")
        print(f"{r.name:<{name_width}}  {r.path:<{path_width}}  {caught:<6}  {by}")
    print()
    for name, c in counts(results).items():
        print(f"test_docs_{name}.py: caught {c['caught']}, alone {c['alone']}")
    missed = [r.name for r in results if not r.caught]
    if missed:
        print("not caught: " + ", ".join(missed))
    print(f"{len(results)} mutations, {sum(r.caught for r in results)} caught ({seconds:.0f} s)")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=HERE, help="the checkout to test")
    parser.add_argument("--only", default="", help="these mutations (comma-separated names)")
    parser.add_argument("--jobs", type=int, default=2, help="mutations run at once (2)")
    parser.add_argument("--first", action="store_true", help="pytest -x: only the first file")
    parser.add_argument("--json", action="store_true", help="the results as JSON")
    args = parser.parse_args(argv)
    root: Path = args.root.resolve()
    wanted = [n for n in args.only.split(",") if n]
    unknown = sorted(set(wanted) - {m.name for m in MUTATIONS})
    if unknown:
        print(f"no such mutation: {', '.join(unknown)}", file=sys.stderr)
        return 2
    mutations = [m for m in MUTATIONS if not wanted or m.name in wanted]
    problems = stale(root, MUTATIONS)
    if problems:
        print(f"stale mutations in {root} (`old` must occur exactly once):", file=sys.stderr)
        print("\n".join(f"  {p}" for p in problems), file=sys.stderr)
        return 2
    start = time.monotonic()
    failed, _, output = run_tests(root, None, False)
    if failed:
        print(output[-4000:], file=sys.stderr)
        print(f"the docs tests fail on an unmutated copy of {root}: nothing to measure")
        return 1
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        results = list(pool.map(lambda m: run_one(root, m, args.first), mutations))
    seconds = time.monotonic() - start
    if args.json:
        summary = {"mutations": len(results), "caught": sum(r.caught for r in results)}
        found = {
            "root": str(root),
            "seconds": round(seconds, 1),
            "results": [asdict(r) for r in results],
            "by_file": counts(results),
            "summary": summary,
        }
        print(json.dumps(found, indent=2))
    else:
        show(results, seconds)
    return 0 if all(r.caught for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())

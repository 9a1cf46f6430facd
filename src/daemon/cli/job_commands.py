"""Commands over the ledger: submit, status, history, policy check, admin.

`status` and `history` read only the `[store]` section (`served_from_store`), `submit`
the whole settings; what only one command uses (the policy checker, the settings model,
the renderer) is imported by that command (docs/cli.md "Many keys, one process").
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, TypeVar

from daemon.cli import admin_copy, admin_purge, output
from daemon.cli.parsers import add_command, login_name
from daemon.exit_codes import (
    EXIT_BAD_INPUT,
    EXIT_OK,
    EXIT_UNKNOWN_JOB,
    bad_input,
)
from daemon.from_settings import judge_store_url, open_ledger, settings_for, store_settings_for
from daemon.service_layer.doors import command_services, store_services
from daemon.service_layer.intake import decode_jobs
from daemon.service_layer.read_models import timeline_details
from daemon.service_layer.services import Services
from ledger.display import printable
from policies.files import BYTE_ORDER_MARK, starts_with_a_mark

if TYPE_CHECKING:
    from daemon.config.settings import Settings
    from daemon.config.store_section import StoreSource
    from ledger.application import Ledger


def register(sub: Any) -> None:
    p = sub.add_parser("submit", help="record a send job (idempotent on its key)")
    p.add_argument("file", nargs="?", default="-", help="job JSON file, or - for stdin")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_submit)

    p = add_command(sub, "status", cmd_status, "jobs' current state, in one process")
    p.add_argument(
        "key", nargs="+", metavar="KEY", help="a job's key, as it was submitted; several: a list"
    )
    add_command(sub, "history", cmd_history, "a job's events, oldest first", key=True)

    policy = sub.add_parser("policy", help="channel policies").add_subparsers(
        dest="policy_command", metavar="COMMAND", required=True
    )
    p = add_command(policy, "check", cmd_policy_check, "validate a folder of policy files")
    p.add_argument("dir", nargs="?", help="policies folder (default: daemon.policies_dir)")

    admin = sub.add_parser("admin", help="maintenance").add_subparsers(
        dest="admin_command", metavar="COMMAND", required=True
    )
    add_command(admin, "rebuild-index", cmd_rebuild_index, "recreate the job index from the events")
    add_command(admin, "new-key", _cmd_new_key, "print a fresh store encryption key")
    admin_purge.register(admin)
    admin_copy.register(admin)


# -- submit -------------------------------------------------------------------------


def _read_jobs(source: str, limit: int) -> object:
    """The decoded job JSON of a file or stdin, of at most `limit` bytes (`api.max_body`,
    the bound of a request body: `submit /dev/zero` was read into memory until the
    machine ran out of it)."""
    where = "stdin" if source == "-" else source
    try:
        raw = _stdin_bytes(limit) if source == "-" else _file_bytes(source, limit)
    except OSError as exc:
        raise bad_input(f"cannot read {source}: {exc.strerror}") from None
    if raw is None:
        raise bad_input(f"job: {where}: larger than api.max_body ({limit} bytes)")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise bad_input(f"{where}: not UTF-8") from None
    if not text.strip():
        # Most often `submit` with no FILE and nothing piped in: JSON's own words
        # ("Expecting value at line 1") would not say so.
        raise bad_input(f"job: {where} is empty: give a job JSON file, or pipe the JSON in")
    if starts_with_a_mark(text):
        raise bad_input(f"job: {where}: {BYTE_ORDER_MARK}")
    try:
        return decode_jobs(text)
    except json.JSONDecodeError as exc:
        at = f"line {exc.lineno}, column {exc.colno}"
        raise bad_input(f"job: not valid JSON: {exc.msg} at {at}") from None
    except (ValueError, RecursionError) as exc:
        # An integer too long to convert, or nesting deeper than the parser goes.
        reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise bad_input(f"job: not valid JSON: {reason}") from None


#: How much one read asks for: a bound of 40 MB is not one allocation of 40 MB per read.
CHUNK = 1 << 20


def _bounded(stream: BinaryIO, limit: int) -> bytes | None:
    """Up to `limit` bytes of `stream`, read to its end; None once it holds more (one
    byte past the bound is all that is read of it: a pipe or a device has no size)."""
    chunks: list[bytes] = []
    size = 0
    while size <= limit:
        chunk = stream.read(min(CHUNK, limit + 1 - size))
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        size += len(chunk)
    return None


def _file_bytes(source: str, limit: int) -> bytes | None:
    # A pipe (`submit <(...)`, a FIFO) is read as a file is: it ends when its writer does.
    with open(source, "rb") as stream:
        return _bounded(stream, limit)


def _stdin_bytes(limit: int) -> bytes | None:
    """Standard input's bytes, read as UTF-8 as a file is: the locale's encoding (Latin-1
    under `LANG=en_US.ISO-8859-1`) would turn the same bytes into other text, stored so or
    refused for a control character nobody typed, and a later `submit FILE` of the very
    job would conflict with it."""
    raw = getattr(sys.stdin, "buffer", None)
    if raw is None:  # a text stream put in its place (an embedding program's)
        text = sys.stdin.read(limit + 1)
        data = text.encode("utf-8", "surrogateescape")
        return data if len(data) <= limit else None
    return _bounded(raw, limit)


T = TypeVar("T")


def cmd_submit(args: argparse.Namespace) -> int:
    from daemon.service_layer.doors import command_intake

    settings = settings_for(args.config)
    data = _read_jobs(args.file, settings.api.max_body)
    valid = command_intake(settings).validate(data)  # refused jobs never open the store
    submitted = _serve(
        settings,
        lambda ledger: command_services(settings, ledger),
        lambda s: s.record(valid, by=login_name()),
        create=True,
    )
    for warning in submitted.warnings:
        output.error(warning)  # stderr: stdout stays the answer (--json)
    if args.json:
        # The answer has the shape of the question: a list (even of one) gives a list.
        print(output.dumps(submitted.body()))
    else:
        for result in submitted.results:
            verb = "created" if result.created else "exists "
            print(f"{verb} {printable(result.key)}  {result.message_id}  {result.state}")
    return EXIT_OK


# -- status / history ----------------------------------------------------------------


def _serve(
    source: StoreSource,
    services: Callable[[Ledger], Services],
    call: Callable[[Services], T],
    *,
    create: bool = False,
    writes: bool = True,
) -> T:
    """`call` on the services of `source`'s store (a refusal is mapped by `main`, as every
    error of the tree). `create`: a missing SQLite store is created (submit); `writes`:
    False for a command that only reads (it never raises the store's event format)."""
    with open_ledger(source, create=create, writes=writes) as ledger:
        return call(services(ledger))


def served(args: argparse.Namespace, call: Callable[[Services], T]) -> T:
    """`call` on the services of the command's config and store (the whole settings:
    policies, providers)."""
    settings = settings_for(args.config)
    return _serve(settings, lambda ledger: command_services(settings, ledger), call)


def served_from_store(args: argparse.Namespace, call: Callable[[Services], T]) -> T:
    """`served` for a command that reads no policy and searches no mailbox: only the
    config's `[store]` is read (`daemon/from_settings.py: store_settings_for`)."""
    return _serve(store_settings_for(args.config), store_services, call, writes=False)


def cmd_status(args: argparse.Namespace) -> int:
    keys: list[str] = args.key
    if len(keys) == 1:
        status = served_from_store(args, lambda s: s.status(keys[0]))
        print(output.dumps(status) if args.json else output.key_values(status.items()))
        return EXIT_OK
    # Several keys: one process and one store, read a page of jobs a query; the known
    # ones answered in the order given (a list with --json), the unknown named after.
    found, unknown = served_from_store(args, lambda s: s.statuses(keys))
    if args.json:
        print(output.dumps(found))
    else:
        print("\n\n".join(output.key_values(status.items()) for status in found))
    if unknown:
        sys.stdout.flush()
        names = ", ".join(repr(key) for key in unknown)
        output.error(f"no job with key{'s' if len(unknown) > 1 else ''} {names}")
        return EXIT_UNKNOWN_JOB
    return EXIT_OK


def cmd_history(args: argparse.Namespace) -> int:
    records = served_from_store(args, lambda s: s.history(args.key))
    if args.json:
        print(output.dumps(records))
        return EXIT_OK
    for record in records:
        shown = ", ".join(f"{k}={_short(v)}" for k, v in timeline_details(record))
        print(f"{record['version']:>3}  {record['at']}  {record['type']:<12}  {printable(shown)}")
    return EXIT_OK


def _short(text: str) -> str:
    return text if len(text) <= 60 else text[:57] + "..."


# -- policy check ----------------------------------------------------------------------


def cmd_policy_check(args: argparse.Namespace) -> int:
    from daemon.config.sender_mailboxes import other_senders
    from policies.check import check_policies, render_table, summary_rows

    known: set[str] | None = None
    client_copy: set[str] = set()
    directory: Path
    settings: Settings | None = None
    secrets: list[str] = []
    if args.dir:
        directory = Path(args.dir)
        try:
            settings = settings_for(args.config)
            known, client_copy = set(settings.providers), settings.client_copy_providers()
        except Exception:
            # Checking a folder must work without a config; provider names then go unchecked.
            known = None
    else:
        from daemon.secret_reads import secret_problems

        settings = settings_for(args.config)
        directory, known = settings.policies_dir, set(settings.providers)
        client_copy = settings.client_copy_providers()
        judge_store_url(settings)  # the whole file is judged, as `run` judges it
        # ... and the secret files run reads at its start, as it reads them: a key file
        # not put in place yet was said first by the daemon's start.
        secrets = secret_problems(settings)
    policies, problems = check_policies(directory, known, client_copy)
    if problems or secrets:
        for problem in [*map(str, problems), *secrets]:
            print(problem, file=sys.stderr)
        return EXIT_BAD_INPUT
    assert policies is not None
    rows = summary_rows(policies)
    if args.json:
        print(output.dumps(rows))
    else:
        print(render_table(rows))  # never empty: a folder without a policy is refused
    for line in other_senders(settings, policies) if settings is not None else []:
        output.error(f"warning: {line}")
    return EXIT_OK


# -- admin -----------------------------------------------------------------------------


def cmd_rebuild_index(args: argparse.Namespace) -> int:
    def progress(count: int) -> None:
        if not args.json:
            print(f"... {count} jobs", file=sys.stderr, flush=True)

    with open_ledger(store_settings_for(args.config), create=False) as ledger:
        count = ledger.rebuild_index(progress)
    if args.json:
        print(output.dumps({"jobs": count}))
    else:
        print(f"index rebuilt from the events: {count} jobs")
    return EXIT_OK


def _cmd_new_key(args: argparse.Namespace) -> int:
    from ledger.stores.cipher import new_key

    key = new_key()
    print(output.dumps({"key": key}) if args.json else key)
    return EXIT_OK


__all__ = ["register", "served", "served_from_store"]

"""Commands over the ledger: submit, status, history, policy check, admin."""

from __future__ import annotations

import argparse
import dataclasses
import getpass
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from daemon import output, retention
from daemon.context import (
    load_policies,
    message_limits,
    open_ledger,
    settings_for,
    thread_providers,
)
from daemon.errors import (
    EXIT_BAD_INPUT,
    EXIT_OK,
    bad_input,
)
from daemon.intake import (
    IntakeError,
    channel_sender,
    check_messages,
    decode_jobs,
    parse_jobs,
    senders_for,
    submit_jobs,
)
from daemon.parsers import add_command
from daemon.secret_files import cmd_new_key
from ledger.application import Ledger, Sender, utcnow
from ledger.content import JobContent
from ledger.job import SendJob
from ledger.vocabulary import JobState
from policies.check import check_policies, render_table, summary_rows
from policies.loader import PolicySet


def register(sub: Any) -> None:
    p = sub.add_parser("submit", help="record a send job (idempotent on its key)")
    p.add_argument("file", nargs="?", default="-", help="job JSON file, or - for stdin")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_submit)

    add_command(sub, "status", cmd_status, "a job's current state", key=True)
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
    add_command(admin, "new-key", cmd_new_key, "print a fresh store encryption key")
    retention.register(admin)


# -- submit -------------------------------------------------------------------------


def _read_jobs(source: str) -> tuple[list[JobContent], bool]:
    """The jobs, and whether they came as a list (the answer then is a list too)."""
    try:
        text = sys.stdin.read() if source == "-" else Path(source).read_text(encoding="utf-8")
    except OSError as exc:
        raise bad_input(f"cannot read {source}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise bad_input(f"{source}: not UTF-8") from None
    try:
        data = decode_jobs(text)
    except json.JSONDecodeError as exc:
        raise bad_input(f"job: not valid JSON: {exc.msg} at line {exc.lineno}") from None
    except (ValueError, RecursionError) as exc:
        # An integer too long to convert, or nesting deeper than the parser goes.
        reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise bad_input(f"job: not valid JSON: {reason}") from None
    try:
        return parse_jobs(data), isinstance(data, list)
    except IntakeError as exc:
        raise bad_input(str(exc)) from None


def sender_for(policies: PolicySet, channel: str) -> Sender:
    return _senders(lambda: [channel_sender(policies, channel)])[0]


def _senders(find: Callable[[], list[Sender]]) -> list[Sender]:
    try:
        return find()
    except IntakeError as exc:
        # The CLI has always named only the field here ("channel: ...").
        problem = exc.problems[0]
        raise bad_input(f"{problem.field}: {problem.reason}") from None


def cmd_submit(args: argparse.Namespace) -> int:
    jobs, batch = _read_jobs(args.file)
    settings = settings_for(args.config)
    policies = load_policies(settings)
    threads = thread_providers(settings)
    senders = _senders(lambda: senders_for(policies, jobs, batch=False, thread_providers=threads))
    try:
        check_messages(policies, jobs, senders, message_limits(settings), batch=batch, at=utcnow())
    except IntakeError as exc:
        raise bad_input(str(exc)) from None
    with open_ledger(settings) as ledger:
        by = getpass.getuser()
        results = [result.as_dict() for result in submit_jobs(ledger, jobs, senders, by=by)]
    if args.json:
        # The answer has the shape of the question: a list (even of one) gives a list.
        print(output.dumps(results if batch else results[0]))
    else:
        for result in results:
            verb = "created" if result["created"] else "exists "
            print(f"{verb} {result['key']}  {result['message_id']}  {result['state']}")
    return EXIT_OK


# -- status / history ----------------------------------------------------------------


def job_status(job: SendJob) -> dict[str, Any]:
    status: dict[str, Any] = {
        "key": job.key,
        "channel": job.channel,
        "state": job.state.value,
        "message_id": job.message_id,
        "attempts": job.attempts,
    }
    if job.reason:
        status["reason"] = job.reason
    status.update(
        {
            "due_at": output.iso(job.due_at),
            "created": output.iso(job.created_on),
            "updated": output.iso(job.modified_on),
            "version": job.version,
            "searches": job.searches,
            "misses": job.misses,
            "duplicate": job.duplicate,
            "verifying": job.verifying,
            "provider_message_ids": list(job.provider_message_ids),
            "submitted_by": job.submitted_by,
        }
    )
    if job.purged_at is None:
        status.update(to=list(job.content.to), subject=job.content.subject)
    else:
        # Its content is gone (README "Retention"): say so rather than show it empty.
        status["purged"] = {"at": output.iso(job.purged_at), "by": job.purged_by}
    if job.content.send_at is not None:
        status["send_at"] = job.content.send_at
    return status


def cmd_status(args: argparse.Namespace) -> int:
    with open_ledger(settings_for(args.config), create=False) as ledger:
        status = job_status(ledger.get_job(args.key))
    if args.json:
        print(output.dumps(status))
    else:
        print(output.key_values(status.items()))
    return EXIT_OK


def review_rows(ledger: Ledger) -> list[dict[str, Any]]:
    """The jobs in review, as `review list --json` and `GET /v1/review` show them; a job
    that was to be sent at a given time says when (`send_at`)."""
    rows = []
    for r in ledger.jobs(state=JobState.REVIEW):
        row: dict[str, Any] = {
            "key": r.key,
            "channel": r.channel,
            "reason": r.reason,
            "since": output.iso(r.updated_at),
            "message_id": r.message_id,
        }
        send_at = ledger.get_job(r.key).content.send_at
        if send_at is not None:
            row["send_at"] = send_at
        rows.append(row)
    return rows


_EVENT_BASE_FIELDS = {"originator_id", "originator_version", "timestamp", "originator_topic"}


def event_record(event: Any) -> dict[str, Any]:
    record: dict[str, Any] = {
        "type": type(event).__name__,
        "version": event.originator_version,
        "at": output.iso(event.timestamp),
    }
    for field in dataclasses.fields(event):
        if field.name not in _EVENT_BASE_FIELDS:
            value = getattr(event, field.name)
            record[field.name] = output.iso(value) if hasattr(value, "astimezone") else value
    return record


def cmd_history(args: argparse.Namespace) -> int:
    with open_ledger(settings_for(args.config), create=False) as ledger:
        records = [event_record(e) for e in ledger.history(args.key)]
    if args.json:
        print(output.dumps(records))
        return EXIT_OK
    for record in records:
        details = {k: v for k, v in record.items() if k not in ("type", "version", "at")}
        shown = ", ".join(f"{k}={_short(v)}" for k, v in details.items() if k not in _BULKY)
        print(f"{record['version']:>3}  {record['at']}  {record['type']:<12}  {shown}")
    return EXIT_OK


_BULKY = {"body", "html", "content_hash", "fingerprint"}


def _short(value: object) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 60 else text[:57] + "..."


# -- policy check ----------------------------------------------------------------------


def cmd_policy_check(args: argparse.Namespace) -> int:
    known: set[str] | None = None
    client_copy: set[str] = set()
    directory: Path
    if args.dir:
        directory = Path(args.dir)
        try:
            loaded = settings_for(args.config)
            known, client_copy = set(loaded.providers), loaded.client_copy_providers()
        except Exception:
            # Checking a folder must work without a config; provider names then go unchecked.
            known = None
    else:
        settings = settings_for(args.config)
        directory, known = settings.policies_dir, set(settings.providers)
        client_copy = settings.client_copy_providers()
    policies, problems = check_policies(directory, known, client_copy)
    if problems:
        for problem in problems:
            print(str(problem), file=sys.stderr)
        return EXIT_BAD_INPUT
    assert policies is not None
    rows = summary_rows(policies)
    if args.json:
        print(output.dumps(rows))
    else:
        print(render_table(rows) if rows else f"no policies in {directory}")
    return EXIT_OK


# -- admin -----------------------------------------------------------------------------


def cmd_rebuild_index(args: argparse.Namespace) -> int:
    def progress(count: int) -> None:
        if not args.json:
            print(f"... {count} jobs", file=sys.stderr, flush=True)

    with open_ledger(settings_for(args.config), create=False) as ledger:
        count = ledger.rebuild_index(progress)
    if args.json:
        print(output.dumps({"jobs": count}))
    else:
        print(f"index rebuilt from the events: {count} jobs")
    return EXIT_OK


__all__ = ["event_record", "job_status", "register", "review_rows", "sender_for"]

"""Commands over the ledger: submit, status, history, policy check, admin."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from daemon import output
from daemon.context import load_policies, open_ledger, settings_for
from daemon.errors import (
    EXIT_BAD_INPUT,
    EXIT_OK,
    bad_input,
)
from daemon.parsers import add_command
from ledger.application import Sender
from ledger.content import JobContent, JobInputError, parse_job
from ledger.job import SendJob
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


# -- submit -------------------------------------------------------------------------


def _read_jobs(source: str) -> list[JobContent]:
    try:
        text = sys.stdin.read() if source == "-" else Path(source).read_text(encoding="utf-8")
    except OSError as exc:
        raise bad_input(f"cannot read {source}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise bad_input(f"{source}: not UTF-8") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise bad_input(f"job: not valid JSON: {exc.msg} at line {exc.lineno}") from None
    items = data if isinstance(data, list) else [data]
    if not items:
        raise bad_input("job: an empty list")
    jobs = []
    # Validate every job before writing any: a bad batch leaves nothing half-written.
    for index, item in enumerate(items):
        try:
            jobs.append(parse_job(item))
        except JobInputError as exc:
            where = f"job[{index}]." if isinstance(data, list) else "job."
            raise bad_input(f"{where}{exc}") from None
    return jobs


def sender_for(policies: PolicySet, channel: str) -> Sender:
    policy = policies.get(channel)
    if policy is None:
        raise bad_input(f"channel: no policy file for channel {channel!r}")
    return policy.sender


def cmd_submit(args: argparse.Namespace) -> int:
    jobs = _read_jobs(args.file)
    settings = settings_for(args.config)
    policies = load_policies(settings)
    senders = [sender_for(policies, job.channel) for job in jobs]
    with open_ledger(settings) as ledger:
        results = [
            ledger.submit(job, sender).as_dict() for job, sender in zip(jobs, senders, strict=True)
        ]
    if args.json:
        print(output.dumps(results if len(results) > 1 else results[0]))
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
            "to": list(job.content.to),
            "subject": job.content.subject,
        }
    )
    return status


def cmd_status(args: argparse.Namespace) -> int:
    with open_ledger(settings_for(args.config)) as ledger:
        status = job_status(ledger.get_job(args.key))
    if args.json:
        print(output.dumps(status))
    else:
        print(output.key_values(status.items()))
    return EXIT_OK


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
    with open_ledger(settings_for(args.config)) as ledger:
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
    directory: Path
    if args.dir:
        directory = Path(args.dir)
        try:
            known = set(settings_for(args.config).providers)
        except Exception:
            # Checking a folder must work without a config; provider names then go unchecked.
            known = None
    else:
        settings = settings_for(args.config)
        directory, known = settings.policies_dir, set(settings.providers)
    policies, problems = check_policies(directory, known)
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

    with open_ledger(settings_for(args.config)) as ledger:
        count = ledger.rebuild_index(progress)
    if args.json:
        print(output.dumps({"jobs": count}))
    else:
        print(f"index rebuilt from the events: {count} jobs")
    return EXIT_OK


__all__ = ["event_record", "job_status", "register", "sender_for"]

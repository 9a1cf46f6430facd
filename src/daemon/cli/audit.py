"""`sendledger audit`: jobs (or their events) matching filters, streamed as JSON lines,
CSV or a table.

Job filters read the job index page by page (key order, `Ledger.jobs`), so memory stays
flat however many jobs match. `--event TYPE` reads the event log for that event type only
(`Ledger.job_events`).

CSV is opened by spreadsheets, which run a cell that starts with `=`, `+`, `-` or `@` as a
formula (`=HYPERLINK(...)` in a key) and treat a leading TAB or CR the same way; each such
cell is written with a `'` in front (OWASP "CSV Injection"). Cells are made printable as
the table's are (docs/cli.md "Audit output"); `--format json` gives every value exactly.
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from daemon.cli import output
from daemon.config.moments import parse_moment
from daemon.exit_codes import EXIT_OK, bad_input
from daemon.from_settings import open_ledger, store_settings_for
from daemon.service_layer.read_models import channel_unknown
from ledger.application import Ledger
from ledger.display import iso, printable
from ledger.job import JobState, SendJob
from ledger.stores.index import IndexRow

JOB_COLUMNS = [
    "key",
    "channel",
    "state",
    "attempts",
    "reason",
    "message_id",
    "created",
    "updated",
]
EVENT_COLUMNS = ["at", "event", "version", "key", "channel", "state", "message_id"]
#: A cell starting with one of these is a formula to a spreadsheet (OWASP "CSV Injection").
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")

EVENT_TYPES = sorted(
    name
    for name, value in vars(SendJob).items()
    if isinstance(value, type) and hasattr(value, "TOPIC") and name not in ("Event", "Created")
)


def register(sub: Any) -> None:
    p = sub.add_parser("audit", help="jobs or events matching filters, for audits")
    p.add_argument("--state", choices=[s.value for s in JobState], help="only jobs in this state")
    p.add_argument("--channel", help="only this channel's jobs")
    p.add_argument("--event", choices=EVENT_TYPES, help="list events of this type instead")
    p.add_argument("--since", help="ISO 8601 time or date (UTC), or a duration ago: 24h, 7d")
    p.add_argument("--until", help="same forms as --since; exclusive")
    p.add_argument(
        "--format",
        choices=["table", "json", "csv"],
        default="table",
        help="table (default), json (JSON lines, exact values) or csv (for spreadsheets)",
    )
    # Every other read command takes --json; a user who types it here means the same.
    p.add_argument(
        "--json", dest="format", action="store_const", const="json", help="--format json"
    )
    p.set_defaults(func=cmd_audit)


def parse_when(option: str, value: str | None, now: datetime) -> datetime | None:
    if value is None:
        return None
    try:
        return parse_moment(value, now)
    except ValueError as exc:
        raise bad_input(f"{option}: {exc}") from None


def cmd_audit(args: argparse.Namespace) -> int:
    now = datetime.now(UTC)
    since = parse_when("--since", args.since, now)
    until = parse_when("--until", args.until, now)
    if since and until and since >= until:
        raise bad_input("--since: must be before --until")
    with open_ledger(store_settings_for(args.config), create=False, writes=False) as ledger:
        if args.event:
            columns = EVENT_COLUMNS
            records = _events(ledger, args.event, args.state, args.channel, since, until)
        else:
            columns = JOB_COLUMNS
            records = _jobs(ledger, args.state, args.channel, since, until)
        shown = _emit(records, columns, args.format)
        if channel_unknown(ledger, args.channel, bool(shown)):
            output.no_job_of_channel(args.channel)
    return EXIT_OK


def _job_record(row: IndexRow) -> dict[str, Any]:
    return {
        "key": row.key,
        "channel": row.channel,
        "state": row.state,
        "attempts": row.attempts,
        "reason": row.reason,
        "message_id": row.message_id,
        "created": iso(row.created_at),
        "updated": iso(row.updated_at),
    }


def _jobs(
    ledger: Ledger,
    state: str | None,
    channel: str | None,
    since: datetime | None,
    until: datetime | None,
) -> Iterator[dict[str, Any]]:
    for row in ledger.jobs(state=state, channel=channel, since=since, until=until):
        yield _job_record(row)


def _events(
    ledger: Ledger,
    event_type: str,
    state: str | None,
    channel: str | None,
    since: datetime | None,
    until: datetime | None,
) -> Iterator[dict[str, Any]]:
    # The job of each event, loaded by its id (an index lookup in the events table);
    # the job index has no job_id index, and a scan per event would grow with history.
    # Cached for a page's worth of events, so memory stays flat.
    jobs: dict[Any, SendJob] = {}
    for event in ledger.job_events(types=[event_type], since=since, until=until):
        job = jobs.get(event.originator_id)
        if job is None:
            if len(jobs) >= ledger.page_size:
                jobs.clear()
            job = jobs[event.originator_id] = ledger.repository.get(event.originator_id)
        if (state and job.state.value != state) or (channel and job.channel != channel):
            continue
        yield {
            "at": iso(event.timestamp),
            "event": event_type,
            "version": event.originator_version,
            "key": job.key,
            "channel": job.channel,
            "state": job.state.value,
            "message_id": job.message_id,
        }


def csv_cell(value: object) -> str:
    """One CSV cell: printable, and never a formula (a `'` before a formula's start)."""
    raw = "" if value is None else str(value)
    # Judged on the value itself: a leading TAB or CR is also shown escaped (`\x09`).
    return ("'" if raw.startswith(FORMULA_STARTS) else "") + printable(raw)


def _emit(records: Iterator[dict[str, Any]], columns: list[str], fmt: str) -> int:
    """Writes the records in `fmt`; how many there were."""
    if fmt == "json":
        # JSON lines, one record each, written as they are read.
        count = 0
        for record in records:
            sys.stdout.write(output.dumps(record) + "\n")
            count += 1
        return count
    if fmt == "csv":
        # Lines end in LF, as every spreadsheet reads them: the writer's own CR LF met the
        # net under stdout (`output.guard_streams`), which shows a CR as `\x0d`. A cell
        # holds none (it is printable), so LF is never inside one.
        writer = csv.DictWriter(
            sys.stdout, fieldnames=columns, extrasaction="ignore", lineterminator="\n"
        )
        writer.writeheader()
        count = 0
        for record in records:
            writer.writerow({name: csv_cell(value) for name, value in record.items()})
            count += 1
        return count
    rows = list(records)
    print(output.table(rows, columns) if rows else "no matching jobs")
    return len(rows)

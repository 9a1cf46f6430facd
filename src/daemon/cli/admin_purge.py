"""`sendledger admin purge` (docs/configuration.md "Retention"): a human's purge, by age or
by key. What a purge does to a job is `Ledger.purge` (`ledger/redaction.py`); the daemon's
periodic purge is `daemon/service_layer/retention.py`."""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
from collections.abc import Iterator
from datetime import datetime, timedelta

from daemon.cli import output
from daemon.cli.parsers import add_command, login_name
from daemon.exit_codes import EXIT_CONFLICT, EXIT_INTERRUPTED, EXIT_OK, CliError, bad_input
from daemon.from_settings import open_ledger, settings_for
from ledger.application import ConcurrentUpdate, Ledger, PurgeResult
from ledger.content import JobInputError
from ledger.display import iso
from ledger.job import TransitionError, check_name
from policies.durations import DurationError, format_duration, parse_duration_with_unit


def register(admin: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = add_command(
        admin,
        "purge",
        cmd_admin_purge,
        "forget the content of settled jobs, keep their trail (docs/configuration.md 'Retention')",
    )
    p.add_argument(
        "--older-than",
        metavar="DURATION",
        help="jobs settled (confirmed, abandoned or cancelled) longer ago than this, e.g. 30d",
    )
    p.add_argument(
        "--key",
        action="append",
        default=[],
        metavar="KEY",
        help="this settled job, whatever its age (repeatable: an erasure request)",
    )
    p.add_argument(
        "--dry-run", action="store_true", help="say what would be purged, change nothing"
    )
    p.add_argument("--by", help="who purges (default: the OS user)")


def cmd_admin_purge(args: argparse.Namespace) -> int:
    if args.older_than is None and not args.key:
        raise bad_input("admin purge: give --older-than DURATION or --key KEY")
    if args.older_than is not None and args.key:
        raise bad_input("admin purge: --older-than and --key exclude each other")
    older_than = None
    if args.older_than is not None:
        try:
            # As retention.purge_after: at most 100 years, so the cut-off is a real date.
            # A unit is required: a purge cannot be undone, and "90" is days in mind.
            older_than = parse_duration_with_unit(args.older_than, 0.0, 36525 * 86400.0)
        except DurationError as exc:
            raise bad_input(f"--older-than: {exc}") from None
    by = args.by or login_name()
    try:
        # Checked before anything is read: a dry run, or a run that finds nothing to
        # purge, would otherwise take a name the run with work then refuses.
        check_name(by)
    except JobInputError as exc:
        raise bad_input(f"--by: {exc.reason}") from None
    with open_ledger(settings_for(args.config), create=False) as ledger:
        if older_than is None:
            return _purge_keys(ledger, args, by)
        before = ledger.clock() - timedelta(seconds=older_than)
        rule = f"admin purge --older-than {format_duration(older_than)}"
        if args.dry_run:
            keys = [row.key for row in ledger.purgeable(before)]
            _report_dry_run(args, keys, before)
            return EXIT_OK

        def progress(count: int) -> None:
            print(f"... {count} jobs purged", file=sys.stderr, flush=True)

        with ctrl_c_between_steps() as asked:
            result = ledger.purge_settled(
                before, by=by, rule=rule, progress=progress, stop=lambda: bool(asked)
            )
    _report(args, result, before)
    if asked:
        output.error(
            f"interrupted: {result.purged} jobs purged, each whole; the others are as they "
            "were: run the same command again to purge them"
        )
        return EXIT_INTERRUPTED
    return EXIT_OK


@contextlib.contextmanager
def ctrl_c_between_steps() -> Iterator[list[int]]:
    """A Ctrl-C ends a purge by age after the job it is purging (each is one transaction),
    so the command can say how many it purged: a KeyboardInterrupt raised inside the
    purge said nothing. The list it yields holds the signal once asked; a second Ctrl-C
    interrupts at once, as it always did."""
    asked: list[int] = []

    def ask(signum: int, _frame: object) -> None:
        asked.append(signum)  # a list append takes no lock: safe in a handler
        signal.signal(signal.SIGINT, signal.default_int_handler)

    previous = signal.signal(signal.SIGINT, ask)
    try:
        yield asked
    finally:
        signal.signal(signal.SIGINT, previous)


def _purge_keys(ledger: Ledger, args: argparse.Namespace, by: str) -> int:
    # A key given twice is one erasure request, not a second purge that finds the first
    # one's work and fails (which used to leave the purged text in the WAL).
    keys = list(dict.fromkeys(args.key))
    jobs = [ledger.get_job(key) for key in keys]  # UnknownJob: exit 4, nothing purged
    for job in jobs:
        if job.purged:
            raise CliError(f"job {job.key!r} was purged already", EXIT_CONFLICT)
        if not job.purgeable:
            why = f"job {job.key!r} is {job.state.value}"
            try:
                # The job's own refusal names what is still due (a verification, its bounce
                # watch, the deletion of its drafts). This copy is never saved.
                job.purge(by=by, rule="admin purge --key", at=ledger.clock())
            except TransitionError as exc:
                why = str(exc)
            raise CliError(
                f"{why}; only a job settled for good (confirmed, abandoned or cancelled, "
                "nothing due) can be purged",
                EXIT_CONFLICT,
            )
    if args.dry_run:
        _report_dry_run(args, [job.key for job in jobs], None)
        return EXIT_OK
    purged = 0
    failure: CliError | None = None
    for job in jobs:
        try:
            ledger.purge(job.key, by=by, rule="admin purge --key")
        except (TransitionError, ConcurrentUpdate) as exc:
            failure = CliError(f"job {job.key!r} changed meanwhile: {exc}", EXIT_CONFLICT)
            break
        purged += 1
    # Whatever happened to a later key, what the earlier ones rewrote is scrubbed now.
    scrubbed = ledger.scrub() if purged else True
    result = PurgeResult(purged=purged, skipped=len(jobs) - purged, scrubbed=scrubbed)
    if failure is not None:
        if purged:
            _report(args, result, None)
        raise failure
    _report(args, result, None)
    return EXIT_OK


def _report_dry_run(args: argparse.Namespace, keys: list[str], before: datetime | None) -> None:
    if args.json:
        print(output.dumps({"dry_run": True, "before": iso(before), "keys": keys}))
        return
    for key in keys:
        print(key)
    since = f" settled before {iso(before)}" if before is not None else ""
    print(f"would purge {len(keys)} jobs{since} (dry run: nothing changed)", file=sys.stderr)


def _report(args: argparse.Namespace, result: PurgeResult, before: datetime | None) -> None:
    if args.json:
        record = {"dry_run": False, "before": iso(before), **vars(result)}
        print(output.dumps(record))
        return
    since = f" settled before {iso(before)}" if before is not None else ""
    line = f"purged {result.purged} jobs{since}"
    if result.skipped:
        line += f"; {result.skipped} changed meanwhile, left for the next purge"
    if not result.scrubbed:
        line += "; the store's files could not be scrubbed now (readers busy): purge again later"
    print(line)


__all__ = ["cmd_admin_purge", "ctrl_c_between_steps", "register"]

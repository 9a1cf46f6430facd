"""Commands that run the service or act for a human: run, review, cancel.

`run` imports the runtime (APScheduler, the providers) when it runs; `review list`,
`review show` and `cancel` read only the config's `[store]` (docs/cli.md "Many keys, one
process"); `review resolve|check|triage` the whole settings (policies, providers).
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from daemon.cli import output
from daemon.cli.job_commands import served, served_from_store
from daemon.cli.parsers import add_command, login_name
from daemon.exit_codes import (
    EXIT_BAD_INPUT,
    EXIT_FAILURE,
    EXIT_INTERRUPTED,
    EXIT_OK,
    CliError,
    bad_input,
    exit_code_for,
)
from daemon.from_settings import load_policies, open_ledger, settings_for
from daemon.service_layer.read_models import channel_unknown, job_status
from daemon.service_layer.services import resolve_as_a_person
from ledger.copies import copies_found
from ledger.display import command_line, printable
from ledger.exceptions import SendledgerError
from ledger.vocabulary import EscalationReason, Resolution

if TYPE_CHECKING:
    from daemon.bootstrap import Service
    from daemon.service_layer.services import Services, TriageItem

log = logging.getLogger("sendledger")


#: A reason is one of a closed set: a typo (`--reason unknown`) is exit 2 naming the
#: choices, not an empty queue that reads as "nothing to review".
_REASON: dict[str, Any] = {
    "choices": [reason.value for reason in EscalationReason],
    "metavar": "REASON",
    "help": "only jobs in review for this reason (docs/review.md)",
}


def register(sub: Any) -> None:
    p = sub.add_parser("run", help="the daemon (systemd Type=notify)")
    p.add_argument("--once", action="store_true", help="one pass, then exit")
    p.set_defaults(func=cmd_run)

    review = sub.add_parser("review", help="jobs that need a human").add_subparsers(
        dest="review_command", metavar="COMMAND", required=True
    )
    p = add_command(review, "list", cmd_review_list, "jobs in review")
    p.add_argument("--channel", help="only this channel's jobs")
    p.add_argument("--reason", **_REASON)
    add_command(
        review, "show", cmd_review_show, "a job in review: its state, history and handle", key=True
    )
    p = add_command(review, "resolve", cmd_review_resolve, "record a human's decision", key=True)
    p.add_argument(
        "--as",
        dest="decision",
        required=True,
        choices=[r.value for r in Resolution],
        help="sent: the customer has the message (a check found it, or say how you know in "
        "--note); resend: send it again with the same Message-ID (searched first, refused "
        "if a copy exists); abandon: send nothing more",
    )
    p.add_argument(
        "--note",
        default="",
        help="why, recorded in the job's history (required for sent when no check found "
        "a copy: how you know it was sent)",
    )
    p.add_argument("--by", default="", help="who decided (default: the OS user)")
    add_expected_version(p, "resolved")
    p = add_command(
        review, "check", cmd_review_check, "search the mailbox now and record the hits", key=True
    )
    p.add_argument("--by", default="", help="who asked (default: the OS user)")
    p = add_command(
        review, "triage", cmd_review_triage, "search every job in review; one copy: sent"
    )
    p.add_argument("--channel", help="only this channel's jobs")
    p.add_argument("--reason", **_REASON)
    p.add_argument("--dry-run", action="store_true", help="search, record nothing")
    p.add_argument("--by", default="", help="who decided (default: the OS user)")
    p = add_command(sub, "cancel", cmd_cancel, "withdraw a job not yet attempted", key=True)
    p.add_argument("--note", default="", help="why, recorded in the job's history")
    p.add_argument("--by", default="", help="who cancelled (default: the OS user)")
    add_expected_version(p, "cancelled")


class _GivenOnce(argparse.Action):
    """The option's value, refused when given a second time: argparse keeps the last, and
    of two versions typed either could be the one looked at (a JSON name given twice is
    refused alike, docs/cli.md "Keys")."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        before = getattr(namespace, self.dest, None)
        if before is not None:
            raise argparse.ArgumentError(
                self, f"given twice ({before}, then {values}): give the one version you looked at"
            )
        setattr(namespace, self.dest, values)


def add_expected_version(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument(
        "--expected-version",
        action=_GivenOnce,
        type=positive_int,
        metavar="N",
        help=f"the job's version you looked at (`status --json`): it is {what} only if "
        "it has not changed since (exit 3 otherwise)",
    )


def positive_int(text: str) -> int:
    """ASCII digits only, as the API and the review page take a version: Python's `int`
    also reads "+3", "1_000", " 7" and other scripts' digits ("\\uff13")."""
    if not (text.isascii() and text.isdigit()):
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}")
    value = int(text, 10)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {value}")
    return value


def cmd_run(args: argparse.Namespace) -> int:
    """The daemon; refused for a cause that may be gone at its next start (a secret file
    not there yet, `api.listen`'s address in use or not up yet), exit 1, not 2: the unit
    starts it again on exit 1 and never on exit 2, a config it can never start with
    (docs/cli.md "Exit codes")."""
    from ledger.exceptions import MayClearLater, on_chain

    try:
        return _run(args)
    except SendledgerError as exc:
        if exit_code_for(exc) == EXIT_BAD_INPUT and on_chain(exc, MayClearLater):
            raise CliError(str(exc), EXIT_FAILURE) from exc
        raise


def _run(args: argparse.Namespace) -> int:
    from daemon.bootstrap import bootstrap
    from daemon.cli import keep_hangups
    from daemon.logs import setup_logging
    from daemon.runtime import run_once

    if args.once:
        signal.signal(signal.SIGHUP, signal.SIG_DFL)  # one pass: no reload to keep
    else:
        # Until the daemon's own handlers are in place: a stop request during start-up
        # has nothing in flight to finish. A reload is kept for when it runs (`main` kept
        # it from its first line): the policies may be read already, and changed since.
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        keep_hangups()
    settings = settings_for(args.config)
    setup_logging(settings.daemon.log_level)
    policies = load_policies(settings)  # refuse to start on a broken policy folder (exit 2)

    # A store too new is refused here, nothing written; the daemon declares its event
    # format, and raises the store's, once it holds its name (`start_up`): a start its
    # name refuses writes nothing (docs/operations.md "Upgrading").
    with open_ledger(settings, service=True, writes=False) as ledger:
        try:
            service = bootstrap(
                settings,
                ledger=ledger,
                policy_loader=lambda: load_policies(settings),
                policies=policies,
            )
        except BaseException as exc:
            if isinstance(exc, ValueError | OSError):
                raise bad_input(f"providers: {exc}") from None
            raise
        if args.once:
            report = run_once(service)
            log.info(
                "one pass done: %s",
                ", ".join(f"{k} {v}" for k, v in vars(report).items() if v) or "nothing due",
            )
            return EXIT_OK
        return _serve(service, settings.daemon.tick)


def _serve(service: Service, tick: float) -> int:
    """The daemon's run until it stops; its exit code."""
    from daemon.cli import HANGUPS
    from daemon.runtime import Daemon

    daemon = Daemon(service, tick)
    daemon.install_signal_handlers()
    if HANGUPS:  # read after its own handlers are in: none falls between
        daemon.request_reload()
    try:
        code = daemon.serve()
    except SendledgerError as exc:
        # The daemon stopped by itself (its name taken, a newer event format): after
        # a stop that did not wait, its line and exit code, then out at once as below.
        if not daemon.abandoned:
            raise
        output.error(str(exc))
        code = exit_code_for(exc) or EXIT_FAILURE
    if daemon.abandoned:
        # Calls still in flight hold worker threads that would keep the interpreter
        # from exiting: their claims are durable, so end here, as a crash would.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def cmd_review_list(args: argparse.Namespace) -> int:
    def listed(s: Services) -> tuple[list[dict[str, Any]], bool]:
        rows = s.review_list(channel=args.channel, reason=args.reason)
        return rows, channel_unknown(s.ledger, args.channel, bool(rows))

    rows, unknown_channel = served_from_store(args, listed)
    if unknown_channel:
        output.no_job_of_channel(args.channel)
    if args.json:
        print(output.dumps(rows))
    elif rows:
        columns = ["key", "channel", "reason", "since", "to", "subject"]
        if any("send_at" in row for row in rows):
            columns.insert(4, "send_at")
        print(output.table(rows, columns))
    else:
        print("no jobs in review")
    return EXIT_OK


def cmd_review_show(args: argparse.Namespace) -> int:
    view = served_from_store(args, lambda s: s.job_view(args.key))
    if args.json:
        said = view.guidance.as_dict() if view.guidance is not None else None
        print(output.dumps({"status": view.status, "history": view.history, "guidance": said}))
        return EXIT_OK
    print(output.key_values(view.status.items()))
    print("\nhistory:")
    for record in view.history:
        print(f"  {record['version']:>3}  {record['at']}  {record['type']}")
    guidance = view.guidance
    if guidance is not None:
        key = view.job.key
        check = command_line("sendledger", "review", "check", key)
        print(f"\nwhy: {guidance.meaning}")
        print(f"next: {guidance.next_action}")
        print(f"\nsearch the mailbox for {view.job.message_id}: {check}")
        print("then one of:")
        for choice in guidance.choices:
            note = "..."
            if choice.needs_note:
                done = "not sent" if choice.decision is Resolution.RESEND else "sent"
                note = f"how you know it was {done}"
            line = command_line(
                "sendledger",
                "review",
                "resolve",
                key,
                "--as",
                choice.decision.value,
                # The decision holds for the version shown: run later, after anyone else
                # wrote to the job, it is refused (docs/review.md "Two people, one job").
                "--expected-version",
                str(view.job.version),
                "--note",
                note,
            )
            mark = " (recommended)" if choice.recommended else ""
            print(f"  {line}\n      {choice.effect}{mark}")
    return EXIT_OK


def cmd_review_resolve(args: argparse.Namespace) -> int:
    decision = Resolution(args.decision)
    by = args.by or login_name()
    job = served(
        args,
        lambda s: resolve_as_a_person(
            s, args.key, decision, note=args.note, by=by, expected_version=args.expected_version
        ),
    )
    if args.json:
        print(output.dumps(job_status(job)))
    else:
        print(f"{printable(job.key)}: resolved as {args.decision} by {printable(by)}; "
              f"now {job.state.value}")  # fmt: skip
    return EXIT_OK


def cmd_review_check(args: argparse.Namespace) -> int:
    by = args.by or login_name()
    answer = served(args, lambda s: s.check(args.key, by=by))
    if args.json:
        print(output.dumps(answer.as_dict()))
        return EXIT_OK
    print(f"{printable(answer.key)}  {answer.state}  {answer.message_id}")
    print(f"{copies_found(answer.count, answer.complete)} (query {printable(answer.query)})")
    for copy in answer.copies:
        where = "  (in the trash)" if copy.in_trash else ""
        print(printable(f"  {copy.provider_id}  {copy.date}  {copy.to}  {copy.subject}{where}"))
    if answer.count > len(answer.copies):
        print(f"  ... and {answer.count - len(answer.copies)} more, not listed")
    if not answer.recorded:
        print(f"(not recorded in the job's history: {answer.why_unrecorded})")
    print(answer.advice)
    return EXIT_OK


def cmd_review_triage(args: argparse.Namespace) -> int:
    by = args.by or login_name()

    def triaged(s: Services) -> int:
        total, items = s.triage_each(by, args.channel, args.reason, args.dry_run)
        if channel_unknown(s.ledger, args.channel, bool(total)):
            output.no_job_of_channel(args.channel)
        return _report_triage(args, total, items)

    return served(args, triaged)


def _report_triage(args: argparse.Namespace, total: int, items: Iterator[TriageItem]) -> int:
    """Each job's line as soon as it is decided: every search can take the provider's whole
    timeout, and a triage that said nothing until its last job looked hung. A Ctrl-C ends
    it with what was done (the list so far, with --json) and a line on what is left."""
    done: list[TriageItem] = []
    if total and not args.json:
        print(f"searching the mailbox for {total} job{'s' if total > 1 else ''} in review",
              file=sys.stderr, flush=True)  # fmt: skip
    try:
        for item in items:
            done.append(item)
            if not args.json:
                print(printable(f"{item.key}  {item.channel}  {item.action}  {item.detail}"),
                      flush=True)  # fmt: skip
    except KeyboardInterrupt:
        if args.json:
            print(output.dumps([item.as_dict() for item in done]))
        sys.stdout.flush()
        resolved = sum(1 for item in done if item.action == "resolved-sent")
        what = "a dry run: nothing recorded" if args.dry_run else f"{resolved} resolved as sent"
        output.error(
            f"interrupted after {len(done)} of {total} jobs ({what}); the rest are left in "
            "review as they were: run the same command again for them"
        )
        return EXIT_INTERRUPTED
    if args.json:
        print(output.dumps([item.as_dict() for item in done]))
        return EXIT_OK
    if not done:
        print("no jobs in review match")
        return EXIT_OK
    resolved = sum(1 for item in done if item.action == "resolved-sent")
    would = sum(1 for item in done if item.action == "would-resolve-sent")
    left = len(done) - resolved - would
    if args.dry_run:
        print(f"dry run: {would} would be resolved as sent, {left} left in review; "
              "nothing was recorded")  # fmt: skip
    else:
        print(f"{resolved} resolved as sent, {left} left in review")
    return EXIT_OK


def cmd_cancel(args: argparse.Namespace) -> int:
    by = args.by or login_name()
    job = served(
        args,
        lambda s: s.cancel(args.key, note=args.note, by=by, expected_version=args.expected_version),
    )
    if args.json:
        print(output.dumps(job_status(job)))
    else:
        print(f"{printable(job.key)}: cancelled by {printable(by)}; it will not be sent")
    return EXIT_OK

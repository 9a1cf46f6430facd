"""Commands that run the service or act for a human: run, review."""

from __future__ import annotations

import argparse
import getpass
import logging
import signal
import sys
from typing import Any

from daemon import output
from daemon.bootstrap import bootstrap, build_provider
from daemon.commands import event_record, job_status, review_rows
from daemon.context import load_policies, open_ledger, settings_for
from daemon.errors import EXIT_CONFLICT, EXIT_OK, CliError, bad_input
from daemon.logs import setup_logging
from daemon.parsers import add_command
from daemon.providers.base import ProviderError, for_job
from daemon.runtime import Daemon, run_once
from ledger.application import ConcurrentUpdate
from ledger.job import JobState, SendJob, TransitionError
from ledger.vocabulary import Resolution

log = logging.getLogger("sendledger")


def register(sub: Any) -> None:
    p = sub.add_parser("run", help="the daemon (systemd Type=notify)")
    p.add_argument("--once", action="store_true", help="one pass, then exit")
    p.set_defaults(func=cmd_run)

    review = sub.add_parser("review", help="jobs that need a human").add_subparsers(
        dest="review_command", metavar="COMMAND", required=True
    )
    add_command(review, "list", cmd_review_list, "jobs in review")
    add_command(
        review, "show", cmd_review_show, "a job in review: its state, history and handle", key=True
    )
    p = add_command(review, "resolve", cmd_review_resolve, "record a human's decision", key=True)
    p.add_argument("--as", dest="decision", required=True, choices=[r.value for r in Resolution])
    p.add_argument("--note", default="")
    p.add_argument("--by", default="", help="who decided (default: the OS user)")
    add_command(
        review, "check", cmd_review_check, "search the mailbox now and show the hits", key=True
    )


def cmd_run(args: argparse.Namespace) -> int:
    if not args.once:
        # Until the daemon's own handlers are in place: a stop request during start-up
        # has nothing in flight to finish, and a reload is moot (policies load next).
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
    settings = settings_for(args.config)
    setup_logging(settings.daemon.log_level)
    policies = load_policies(settings)  # refuse to start on a broken policy folder (exit 2)
    with open_ledger(settings) as ledger:
        try:
            service = bootstrap(
                settings,
                ledger=ledger,
                policy_loader=lambda: load_policies(settings),
                policies=policies,
            )
        except (ValueError, OSError) as exc:
            raise bad_input(f"providers: {exc}") from None
        if args.once:
            report = run_once(service)
            log.info(
                "one pass done: %s",
                ", ".join(f"{k} {v}" for k, v in vars(report).items() if v) or "nothing due",
            )
            return EXIT_OK
        daemon = Daemon(service, settings.daemon.tick)
        daemon.install_signal_handlers()
        return daemon.serve()


def cmd_review_list(args: argparse.Namespace) -> int:
    with open_ledger(settings_for(args.config), create=False) as ledger:
        rows = review_rows(ledger)
    if args.json:
        print(output.dumps(rows))
    elif rows:
        columns = ["key", "channel", "reason", "since", "message_id"]
        if any("send_at" in row for row in rows):
            columns.insert(4, "send_at")
        print(output.table(rows, columns))
    else:
        print("no jobs in review")
    return EXIT_OK


def cmd_review_show(args: argparse.Namespace) -> int:
    with open_ledger(settings_for(args.config), create=False) as ledger:
        job = ledger.get_job(args.key)
        events = [event_record(e) for e in ledger.history(args.key)]
    status = job_status(job)
    if args.json:
        print(output.dumps({"status": status, "history": events}))
        return EXIT_OK
    print(output.key_values(status.items()))
    print("\nhistory:")
    for record in events:
        print(f"  {record['version']:>3}  {record['at']}  {record['type']}")
    if job.state is JobState.REVIEW:
        print(
            f"\nsearch the mailbox for {job.message_id}: sendledger review check {job.key}\n"
            f"then: sendledger review resolve {job.key} --as sent|resend|abandon --note ..."
        )
    return EXIT_OK


def cmd_review_resolve(args: argparse.Namespace) -> int:
    decision = Resolution(args.decision)
    with open_ledger(settings_for(args.config), create=False) as ledger:
        by = args.by or getpass.getuser()
        _require_resolvable(ledger.get_job(args.key), decision)
        try:
            job, _ = ledger.update(
                args.key,
                lambda j: j.resolve(decision, note=args.note, by=by, at=ledger.clock()),
            )
        except (TransitionError, ConcurrentUpdate):
            raise CliError(
                f"job {args.key!r} changed while it was being resolved; "
                f"look again with `sendledger review show {args.key}`",
                EXIT_CONFLICT,
            ) from None
    status = job_status(job)
    if args.json:
        print(output.dumps(status))
    else:
        print(f"{job.key}: resolved as {args.decision} by {by}; now {job.state.value}")
    return EXIT_OK


def _require_resolvable(job: SendJob, decision: Resolution) -> None:
    """A decision that conflicts with the job's state is exit 3, said as a sentence."""
    if job.state is not JobState.REVIEW:
        raise CliError(
            f"job {job.key!r} is {job.state.value}, not in review: only a job in review "
            "can be resolved",
            EXIT_CONFLICT,
        )
    if decision is Resolution.RESEND and job.duplicate:
        raise CliError(
            f"job {job.key!r} has two or more copies already: resolve it as sent or "
            "abandon, never resend",
            EXIT_CONFLICT,
        )


def cmd_review_check(args: argparse.Namespace) -> int:
    settings = settings_for(args.config)
    with open_ledger(settings, create=False) as ledger:
        job = ledger.get_job(args.key)
    policies = load_policies(settings)
    policy = policies.get(job.channel)
    provider_name = policy.provider if policy else job.last_provider
    if provider_name is None or provider_name not in settings.providers:
        raise bad_input(f"job {job.key!r}: no provider to search (channel {job.channel!r})")
    provider = build_provider(settings, provider_name)
    try:
        found = for_job(provider, job.from_addr, None).search(job.message_id)
    except ProviderError as exc:
        raise CliError(f"search failed: {exc.reason}") from None
    finally:
        provider.close()
    hits = found.hits
    result = {
        "key": job.key,
        "state": job.state.value,
        "message_id": job.message_id,
        "query": found.query,
        "hits": [
            {
                "provider_message_id": h.provider_message_id,
                "message_id": h.message_id_header,
                "labels": list(h.labels),
            }
            for h in hits
        ],
    }
    if args.json:
        print(output.dumps(result))
        return EXIT_OK
    print(f"{job.key}  {job.state.value}  {job.message_id}")
    print(f"{len(hits)} SENT cop{'y' if len(hits) == 1 else 'ies'} found")
    for hit in hits:
        print(f"  {hit.provider_message_id}  {hit.message_id_header}  {','.join(hit.labels)}")
    print(_check_advice(job, len(hits)))
    return EXIT_OK


def _check_advice(job: SendJob, copies: int) -> str:
    """What to do next; a resolve command only for a job that can be resolved."""
    if job.state is not JobState.REVIEW:
        return f"the job is {job.state.value}, not in review: there is nothing to resolve"
    resolve = f"sendledger review resolve {job.key}"
    if copies == 0:
        return f"none found: if the search index has caught up, `{resolve} --as resend` is safe"
    if copies == 1:
        return f"one copy: `{resolve} --as sent`"
    return f"duplicate: `{resolve} --as sent` (or abandon); never resend"

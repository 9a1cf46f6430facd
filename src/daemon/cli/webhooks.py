"""`sendledger webhooks status|skip|new-secret` (docs/http-api.md "Webhooks")."""

from __future__ import annotations

import argparse
import time
from typing import Any

from daemon.cli import output
from daemon.cli.parsers import add_command
from daemon.exit_codes import EXIT_CONFLICT, EXIT_OK, CliError, bad_input
from daemon.from_settings import open_ledger, settings_for
from daemon.webhooks.events import event_id_for
from daemon.webhooks.signing import new_secret
from daemon.webhooks.status import COUNT_LIMIT, undelivered, webhook_status
from ledger.stores.positions import final_end


def register(sub: Any) -> None:
    webhooks = sub.add_parser("webhooks", help="webhook deliveries").add_subparsers(
        dest="webhooks_command", metavar="COMMAND", required=True
    )
    add_command(webhooks, "status", cmd_status, "each webhook's position, lag and last error")
    add_command(webhooks, "new-secret", cmd_new_secret, "print a fresh whsec_ secret")
    p = add_command(
        webhooks,
        "skip",
        cmd_skip,
        "move a webhook past its next undelivered event (or --to end: past all of them)",
    )
    p.add_argument("name", help="the webhook's name ([webhooks.NAME])")
    p.add_argument(
        "--to",
        choices=["next", "end"],
        default="next",
        help="next: past its next undelivered event (default); end: past all of them",
    )


def cmd_status(args: argparse.Namespace) -> int:
    settings = settings_for(args.config)
    configured = {name: list(hook.events) for name, hook in settings.webhooks.items()}
    with open_ledger(settings, create=False) as ledger:
        records = webhook_status(ledger, configured, time.time())
    if args.json:
        print(output.dumps(records))
        return EXIT_OK
    if not records:
        print("no webhooks configured ([webhooks.NAME] in the config)")
        return EXIT_OK
    rows = [
        {
            **record,
            "name": record["name"] + ("" if record["configured"] else " (not configured)"),
            "behind": f"{record['behind']}{'+' if record['behind_capped'] else ''}",
            "lag": None if record["lag_seconds"] is None else f"{record['lag_seconds']:.0f}s",
            "last_error": (record["last_error"] or "")[:120] or None,
        }
        for record in records
    ]
    columns = ["name", "position", "behind", "lag", "failures", "next_attempt_at", "last_error"]
    print(output.table(rows, columns))
    return EXIT_OK


def cmd_skip(args: argparse.Namespace) -> int:
    """An operator's way past an event the receiver will never take (it holds back the
    webhook's later events), or past the history a new webhook would be sent. The skipped
    events are not delivered; `webhooks status` shows the new position."""
    settings = settings_for(args.config)
    config = settings.webhooks.get(args.name)
    if config is None:
        raise bad_input(f"{settings.config_path}: no [webhooks.{args.name}] in the config")
    with open_ledger(settings, create=False) as ledger:
        positions = ledger.positions()
        rows = {row.name: row for row in positions.read_all()}
        position = rows[args.name].position if args.name in rows else 0
        end = final_end(positions, position)
        pending = undelivered(ledger, position, end, list(config.events))
        skipped: list[str] = []  # their ids, the first COUNT_LIMIT of them
        target = position
        for note, _event in pending:
            skipped.append(event_id_for(note.originator_id, note.originator_version))
            target = note.id
            if args.to == "next" or len(skipped) >= COUNT_LIMIT:
                break
        if args.to == "end":
            target = end
        if target != position and not positions.force(
            args.name, target, time.time(), expected=position
        ):
            raise CliError(
                f"{args.name}: its position moved from {position} while the skip was worked "
                "out (a daemon delivered meanwhile): nothing skipped; run it again",
                EXIT_CONFLICT,
            )
    capped = args.to == "end" and len(skipped) >= COUNT_LIMIT
    result = {
        "name": args.name,
        "from": position,
        "position": target,
        "skipped": len(skipped),
        "skipped_capped": capped,
        "event_ids": skipped[:100],
    }
    if args.json:
        print(output.dumps(result))
    elif not skipped:
        print(f"{args.name}: nothing undelivered to skip (position {target})")
    else:
        count = f"{len(skipped)}{'+' if capped else ''} events"
        shown = skipped[0] if len(skipped) == 1 else count
        print(f"{args.name}: skipped {shown}; position {position} -> {target}")
    return EXIT_OK


def cmd_new_secret(args: argparse.Namespace) -> int:
    secret = new_secret()
    print(output.dumps({"secret": secret}) if args.json else secret)
    return EXIT_OK


__all__ = ["register"]

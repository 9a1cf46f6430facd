"""`sendledger webhooks status` and `sendledger webhooks new-secret` (README "Webhooks")."""

from __future__ import annotations

import argparse
import time
from typing import Any

from daemon import output
from daemon.context import open_ledger, settings_for
from daemon.errors import EXIT_OK
from daemon.parsers import add_command
from daemon.webhooks.signing import new_secret
from daemon.webhooks.status import webhook_status


def register(sub: Any) -> None:
    webhooks = sub.add_parser("webhooks", help="webhook deliveries").add_subparsers(
        dest="webhooks_command", metavar="COMMAND", required=True
    )
    add_command(webhooks, "status", cmd_status, "each webhook's position, lag and last error")
    add_command(webhooks, "new-secret", cmd_new_secret, "print a fresh whsec_ secret")


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


def cmd_new_secret(args: argparse.Namespace) -> int:
    secret = new_secret()
    print(output.dumps({"secret": secret}) if args.json else secret)
    return EXIT_OK


__all__ = ["register"]

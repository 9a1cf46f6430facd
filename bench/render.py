"""Rendering cost against message size: render and prove (`ledger/wire_check.py:
checked_message`, what intake and dispatch run) messages from 1 KB to 25 MB, next to a
baseline measured in the same run on the same bytes (base64-encoding them, the least any
writer of such a message must do), so the ratio does not depend on the machine.

Three shapes per size: a plain text body (7bit), a non-ASCII body (base64), and the
body as an attachment; then the headers alone: a subject of 1 KB .. 1 MB (the old writer
took 40 s for 1 MB; intake refuses more than 2,000 characters, see README "Limits").
Linear means the ratio stays flat as the size grows. Best of a few runs each; under a
minute in all.

    .venv/bin/python bench/render.py [--max-mb 25]
"""

from __future__ import annotations

import argparse
import base64
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from functools import partial

from ledger.attachments import parse_attachment
from ledger.message_id import message_id_for
from ledger.mime import MessageFields, render_message
from ledger.wire_check import checked_message

MID = message_id_for("bench-render", "mail.example.com")
BASE = MessageFields(
    from_addr="Support <support@example.com>",
    to=("Alice <alice@example.com>",),
    subject="Your receipt",
    body="Thanks.\n",
    message_id=MID,
    date=datetime(2026, 1, 1, tzinfo=UTC),
)


def best(action: Callable[[], object], runs: int) -> float:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        action()
        times.append(time.perf_counter() - start)
    return min(times)


def text_of(size: int, unit: str) -> str:
    line = (unit * (72 // len(unit.encode())))[: 72 // len(unit.encode())] + "\n"
    return line * max(1, size // len(line.encode()))


def shapes(size: int) -> dict[str, MessageFields]:
    ascii_text = text_of(size, "sendledger ")
    other = text_of(size, "é")
    data = ascii_text.encode()
    pdf = parse_attachment(
        {
            "filename": "Rechnung März.pdf",
            "content_type": "application/pdf",
            "content_base64": base64.b64encode(data).decode(),
        }
    )
    return {
        "7bit body": replace(BASE, body=ascii_text),
        "base64 body": replace(BASE, body=other),
        "attachment": replace(BASE, attachments=(pdf,)),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-mb", type=float, default=25.0)
    args = parser.parse_args(argv)
    sizes = [1_000, 10_000, 100_000, 1_000_000, 5_000_000, 10_000_000, 25_000_000]
    sizes = [size for size in sizes if size <= args.max_mb * 1_000_000]
    print(f"{'shape':<12} {'bytes':>11} {'render':>10} {'+ prove':>10} {'base64':>9} {'ratio':>6}")
    ratios: dict[str, list[float]] = {}
    for size in sizes:
        runs = 5 if size <= 1_000_000 else 2
        for name, fields in shapes(size).items():
            payload = fields.attachments[0].data if fields.attachments else fields.body.encode()
            rendered = best(partial(render_message, fields), runs)
            proved = best(partial(checked_message, fields), runs)
            baseline = best(partial(base64.encodebytes, payload), runs)
            ratio = proved / max(baseline, 1e-9)
            ratios.setdefault(name, []).append(ratio)
            print(
                f"{name:<12} {size:>11,} {rendered * 1000:>7.1f} ms {proved * 1000:>7.1f} ms"
                f" {baseline * 1000:>6.1f} ms {ratio:>6.1f}"
            )
    print()
    print(f"{'subject':<12} {'chars':>11} {'+ prove':>10} {'per char':>10}")
    for chars in (1_000, 10_000, 100_000, 1_000_000):
        fields = replace(BASE, subject=("Grüße " * chars)[:chars].strip())
        took = best(partial(checked_message, fields), 3)
        print(f"{'subject':<12} {chars:>11,} {took * 1000:>7.1f} ms {took / chars * 1e9:>7.0f} ns")
    print()
    for name, found in ratios.items():
        print(f"{name}: render+prove / base64 from {min(found):.1f} to {max(found):.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

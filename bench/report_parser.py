"""The delivery-report parser on hostile input grows with the bytes, never faster (issue 29,
docs/how-it-works.md "Bounces: what a report proves").

For each shape below, a report of about 1/10 of the size limit and one at the limit are
parsed `--rounds` times each (taken in turn, so the machine's load falls on both alike);
the median time of each is printed with the ratio large/small. Linear work gives a ratio
near 10 (the bytes' ratio; a little more where copying megabytes leaves the caches); a
quadratic case gives 100, an exponential one far more. The goal: every ratio below 50, and
no shape slower than 1 s at the limit.

  valid          a real report whose text part is padded with words
  many-parts     the report's own boundary repeated: as many empty parts as fit (refused)
  boundaries     lines that almost match the boundary ("--=_report_x" plus one character)
  long-header    one folded header line (a fortieth of the bytes), then a body
  folded         a header of continuation lines (a quarter of the bytes, within the cap)
  blank-lines    the delivery-status part made of blank lines and spaces
  base64         an original-headers part in base64 of its whole length

    .venv/bin/python bench/report_parser.py [--rounds 9]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

from ledger.delivery_reports import MAX_HEADER_BYTES, MAX_REPORT_BYTES, read_report
from ledger.message_id import message_id_for
from testkit.dsn import report, rfc3464_report

DOMAIN = "mail.example.com"
MID = message_id_for("order-1", DOMAIN)
ORIGINAL = f"From: a@example.com\r\nTo: b@example.net\r\nMessage-ID: {MID}\r\n\r\nhi\r\n".encode()
GOAL = 50.0
SLOWEST = 1.0  # seconds, any shape at the size limit


def valid(size: int) -> bytes:
    base = rfc3464_report(ORIGINAL, mailbox="a@example.com", recipient="b@example.net")
    return base.replace(b"user unknown", b"user unknown" + b" pad" * (size // 4), 1)


def many_parts(size: int) -> bytes:
    mark = "=_report_x"
    head = (
        f'Content-Type: multipart/report; report-type=delivery-status; boundary="{mark}"\r\n\r\n'
    ).encode()
    return head + f"--{mark}\r\n\r\n".encode() * (size // 16)


def boundaries(size: int) -> bytes:
    mark = "=_report_x"
    head = (
        f'Content-Type: multipart/report; report-type=delivery-status; boundary="{mark}"\r\n\r\n'
        f"--{mark}\r\nContent-Type: text/plain\r\n\r\n"
    ).encode()
    return head + f"--{mark}y\r\n".encode() * (size // 15)


def long_header(size: int) -> bytes:
    header = min(size // 40, MAX_HEADER_BYTES - 100)  # a folded line, then a body
    return b"Subject:" + b" x" * (header // 2) + b"\r\n\r\n" + b"." * (size - header)


def folded(size: int) -> bytes:
    """A header of continuation lines: joined naively, quadratic."""
    header = min(size // 4, MAX_HEADER_BYTES - 100)
    return b"Subject: x" + b"\r\n x" * (header // 4) + b"\r\n\r\n" + b"." * (size - header)


def blank_lines(size: int) -> bytes:
    return report(
        sender="MAILER-DAEMON@x",
        to="a@example.com",
        subject="failed",
        parts=[(["Content-Type: message/delivery-status"], b"\r\n \r\n\t" * (size // 6))],
    )


def base64_part(size: int) -> bytes:
    import base64

    data = base64.encodebytes(b"Message-ID: " + b"x" * ((size * 3 // 4 - 1000) * 76 // 77))
    return report(
        sender="MAILER-DAEMON@x",
        to="a@example.com",
        subject="failed",
        parts=[(["Content-Type: text/rfc822-headers", "Content-Transfer-Encoding: base64"], data)],
    )


SHAPES: dict[str, Callable[[int], bytes]] = {
    "valid": valid,
    "many-parts": many_parts,
    "boundaries": boundaries,
    "long-header": long_header,
    "folded": folded,
    "blank-lines": blank_lines,
    "base64": base64_part,
}


def timed(raw: bytes) -> float:
    started = time.perf_counter()
    read_report(raw, domains=[DOMAIN])
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()
    large_size = MAX_REPORT_BYTES - 4096
    small_size = large_size // 10
    worst, slowest = 0.0, 0.0
    sizes = f"(bytes {small_size}/{large_size})"
    print(f"{'shape':<12} {'small ms':>9} {'large ms':>9} {'ratio':>6}  {sizes}")
    for name, make in SHAPES.items():
        small, large = make(small_size), make(large_size)
        assert len(large) <= MAX_REPORT_BYTES, (name, len(large))
        times: dict[str, list[float]] = {"small": [], "large": []}
        for _ in range(args.rounds):
            times["small"].append(timed(small))
            times["large"].append(timed(large))
        small_ms = statistics.median(times["small"]) * 1000
        large_ms = statistics.median(times["large"]) * 1000
        ratio = large_ms / max(small_ms, 1e-6)
        worst, slowest = max(worst, ratio), max(slowest, large_ms / 1000)
        print(f"{name:<12} {small_ms:>9.2f} {large_ms:>9.2f} {ratio:>6.1f}")
    print(f"worst ratio {worst:.1f} (goal: below {GOAL:g}; linear is about 10, quadratic 100)")
    print(f"slowest at the limit {slowest:.3f} s (goal: below {SLOWEST:g} s)")
    return 0 if worst < GOAL and slowest < SLOWEST else 1


if __name__ == "__main__":
    raise SystemExit(main())

"""What the loopback SMTP servers' tests share (tests/unit/test_smtp_slow_upload.py,
tests/unit/test_smtp_early_answer.py): a message of lines as it is on the wire, its
submission timed, and a server's side of the dialogue that takes any login, sender and
recipient."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from io import BufferedReader

from daemon.providers.kept import MailEndpoint, ReuseLimits
from daemon.providers.outcomes import SendOutcome
from daemon.providers.smtp_submit import SmtpSubmitter


@dataclass
class Message:
    """A message to one recipient (`SubmitEnvelope`)."""

    data: bytes
    message_id: str = "<slow-1@mail.example.com>"
    eight_bit: bool = False

    @property
    def recipients(self) -> list[str]:
        return ["to@example.net"]

    def wire_data(self) -> bytes:
        return self.data


def converse(
    conn: socket.socket,
    reader: BufferedReader,
    on_data: Callable[[], bool],
    *,
    greet: bool = True,
) -> None:
    """Greets (`greet`: not after STARTTLS) and says yes to everything up to DATA; at DATA
    `on_data()` answers, reads the content and replies to it, and says whether the
    dialogue goes on. Ends at QUIT."""
    if greet:
        conn.sendall(b"220 loopback ESMTP\r\n")
    while line := reader.readline():
        verb = line[:4].upper()
        if verb == b"EHLO":
            conn.sendall(b"250-loopback\r\n250-AUTH PLAIN\r\n250 8BITMIME\r\n")
        elif verb == b"AUTH":
            conn.sendall(b"235 2.7.0 ok\r\n")
        elif verb == b"DATA":
            if not on_data():
                return
        elif verb == b"QUIT":
            conn.sendall(b"221 bye\r\n")
            return
        else:
            conn.sendall(b"250 ok\r\n")


def message_of_lines(count: int, message_id: str = "<slow-1@mail.example.com>") -> Message:
    """A message of `count` lines of 1,000 bytes (`count` thousand bytes)."""
    body = b"".join(b"x" * 998 + b"\r\n" for _ in range(count))
    return Message(
        b"Message-ID: " + message_id.encode() + b"\r\n\r\n" + body + b".\r\n", message_id
    )


def submit_timed(endpoint: MailEndpoint, message: Message) -> tuple[SendOutcome, float]:
    """`message` submitted on a connection of its own: the outcome and how long it took."""
    submitter = SmtpSubmitter(endpoint, ReuseLimits(max_uses=1))
    started = time.monotonic()
    try:
        outcome = submitter.submit(message)
    finally:
        submitter.close()
    return outcome, time.monotonic() - started

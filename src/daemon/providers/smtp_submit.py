"""One SMTP submission, on a connection kept from an earlier send when there is one
(docs/providers.md "Connections kept between sends"; the outcome table is
`smtp_classify.py`'s and does not change with reuse).

The dialogue is driven step by step (EHLO, STARTTLS, AUTH on a fresh connection; then MAIL,
RCPT, DATA, the content, the final `.`) so the classification knows exactly where it ended.
smtplib has no retry of its own, and `sendmail` is not used: a partly refused recipient
list is refused as a whole, and DATA is written once. Where the server offers PIPELINING
(RFC 2920), MAIL, the RCPTs and DATA are written in groups (`PIPELINE_GROUP`) and each
group's replies read in order after it: the dialogue ends at the same stage, on the same
reply, with one round trip a group instead of one a command; the content is still written
only after DATA's 354, and never after a refusal.

A kept connection is first checked: that the server has not written to it unasked (a
`421` idle timeout notice or a close), `RSET` when the last transaction on it was refused
half-way, `NOOP` when it has been idle longer than `idle_check_after`. When that check or
its `MAIL FROM` gets no reply or a `421`, the connection was dead and no byte of this
message's transaction was accepted: the message is tried again at once on a fresh
connection, and only what the fresh one answers is the outcome (so "unavailable" only when
the fresh one cannot be had either). A kept connection that times out is not tried again:
the server is slow rather than the connection stale, and a second wait could outlast the
claim's deadline. A failure after the final `.` is Unknown, on a kept connection as on a
fresh one.
"""

from __future__ import annotations

import contextlib
import smtplib
import socket
from collections.abc import Callable
from typing import Protocol

from daemon.providers.base import ProviderError, SendOutcome
from daemon.providers.connects import start_tls
from daemon.providers.early_answers import EarlyAnswer
from daemon.providers.kept import Kept, KeptPool, MailEndpoint, ReuseLimits, closed_by_peer
from daemon.providers.slow_links import pieces, wait_sent_out
from daemon.providers.smtp_classify import Stage, classify_smtp
from daemon.providers.smtp_replies import BoundedSMTP, BoundedSMTP_SSL
from daemon.providers.timeouts import timed_out
from ledger.exceptions import SendledgerError
from sendledger.connecting import close_unreturned

__all__ = ["SmtpSubmitter", "SubmitEnvelope"]


class SubmitEnvelope(Protocol):
    """What a submission needs of a message (`ledger.message.Envelope` is one)."""

    @property
    def recipients(self) -> list[str]: ...
    @property
    def message_id(self) -> str: ...
    @property
    def eight_bit(self) -> bool: ...
    def wire_data(self) -> bytes: ...


class _Retry(SendledgerError):
    """The kept connection was dead before anything of the message was accepted."""


class _Refused(SendledgerError):
    def __init__(self, code: int, text: bytes | str) -> None:
        self.code, self.text = code, text


def _text(value: bytes | str) -> str:
    raw = value.decode("utf-8", "replace") if isinstance(value, bytes) else value
    return " ".join(raw.split())


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _quit(smtp: smtplib.SMTP) -> None:
    # After the outcome is known: a failed QUIT changes nothing about it.
    try:
        smtp.quit()
    except Exception:
        smtp.close()


def _close(smtp: smtplib.SMTP) -> None:
    with contextlib.suppress(Exception):
        smtp.close()


def _dead(exc: BaseException) -> bool:
    """Whether an error says the connection is gone (closed, reset), not slow (timeout)."""
    if isinstance(exc, TimeoutError):
        return False
    return isinstance(exc, OSError | smtplib.SMTPServerDisconnected)


def _written_to_unasked(smtp: smtplib.SMTP) -> bool:
    """Whether the server wrote to (or closed) an idle connection: a 421 notice, an EOF."""
    return smtp.sock is None or closed_by_peer(smtp.sock)


#: The most commands written before their replies are read (RFC 2920 PIPELINING). A group
#: is at most this many lines of at most 512 bytes, and so are its replies: far below the
#: socket buffers on either side, so neither the client's write nor the server's replies
#: can block while the other side waits (a message to thousands of recipients in one write
#: could, and would hang until the timeout).
PIPELINE_GROUP = 32

#: The replies that let a transaction go on, by the stage of the command.
_ACCEPTED: dict[Stage, tuple[int, ...]] = {
    Stage.MAIL: (250,),
    Stage.RCPT: (250, 251),
    Stage.DATA: (354,),
}


def _command(verb: str, args: str = "") -> str:
    """One command line, refused as smtplib's `putcmd` refuses it when its text holds a
    line break (which would write a second command of the text's choosing)."""
    line = f"{verb} {args}" if args else verb
    if "\r" in line or "\n" in line:
        raise ValueError(f"a line break in the SMTP command {verb} {args!r}")
    return line + "\r\n"


def _envelope_commands(sender: str, body: str, recipients: list[str]) -> list[tuple[Stage, str]]:
    """MAIL, each RCPT and DATA, each with the stage its reply ends. Not smtp.mail() and
    rcpt(): those re-parse every address with the email package's parseaddr to quote it,
    and ours are bare addr-specs already (the envelope's, and the login's): "<" + addr +
    ">" is what quoteaddr returns."""
    return [
        (Stage.MAIL, _command("MAIL", f"FROM:<{sender}>{body}")),
        *((Stage.RCPT, _command("RCPT", f"TO:<{recipient}>")) for recipient in recipients),
        (Stage.DATA, _command("DATA")),
    ]


def _answered_outside_data(smtp: smtplib.SMTP, left: list[tuple[Stage, str]]) -> bool:
    """After a refusal in a pipelined group: whether the server answered each command
    written after it, and the connection is not left in a message's data. A server that
    accepted DATA although a recipient was refused waits for the content; the connection
    is then closed, never ended with a `.` (which would deliver an empty message to the
    accepted recipients), and the server drops the unfinished message."""
    try:
        for stage, _ in left:
            code, _ = smtp.getreply()
            if code == 421 or (stage is Stage.DATA and code == 354):
                return False
    except (OSError, smtplib.SMTPException):
        return False
    return True


def _ping_failed(exc: BaseException) -> ProviderError:
    return ProviderError(f"ping: {_describe(exc)}", unavailable=True, timed_out=timed_out(exc))


def _send_content(smtp: smtplib.SMTP, data: bytes, timeout: float) -> bool:
    """The message's bytes, in order, a piece per write, then out of this host: a
    connection that stops taking them times out, one that keeps taking them does not,
    however long it takes (`slow_links.py`). False when the server replied before the
    end (a 552 for a message too large, then often a close): nothing more is written,
    and its reply is the next `getreply()`'s (`early_answers.py`)."""
    if smtp.sock is None:
        raise smtplib.SMTPServerDisconnected("please run connect() first")
    watch = EarlyAnswer(smtp.sock)
    try:
        for piece in pieces(data):
            watch.sendall(piece)
            if watch.cut:
                break
    except OSError as exc:
        if not watch.left():
            smtp.close()  # as smtplib's own send() does on a failed write
            raise smtplib.SMTPServerDisconnected("Server not connected") from exc
    if not watch.cut:
        # Written, not yet out of this host: a server that answers meanwhile (and may
        # read no more) is not waited out.
        wait_sent_out(smtp.sock, timeout, watch.answered_within)
    if watch.read:
        # Every reply before DATA's 354 was read whole, so nothing is ahead of these. The
        # old reader counts as a user of the socket until it is closed, here, not by
        # the collector.
        if smtp.file is not None:
            smtp.file.close()
        smtp.file = watch.reader()
    return not watch.cut


class SmtpSubmitter:
    """Submissions to one server as one login, on kept connections. Thread-safe: a
    connection is used by one thread at a time (out of the pool while in use)."""

    def __init__(
        self,
        endpoint: MailEndpoint,
        limits: ReuseLimits,
        *,
        clock: Callable[[], float] | None = None,
        pipelining: bool = True,
    ) -> None:
        """`pipelining`: use the server's offer of PIPELINING (false: never)."""
        self.endpoint = endpoint
        self.limits = limits
        self.pipelining = pipelining
        self.pool: KeptPool[smtplib.SMTP] = (
            KeptPool(limits, _quit) if clock is None else KeptPool(limits, _quit, clock)
        )
        self._local_hostname: str | None = None

    def close(self) -> None:
        self.pool.close()

    def submit(self, envelope: SubmitEnvelope) -> SendOutcome:
        kept = self.pool.take()
        if kept is not None:
            try:
                return self._transaction(kept, envelope)
            except _Retry:
                self.pool.stats.count("retried-fresh")
        return self._on_fresh(envelope)

    def ping(self) -> None:
        """Proof that the server answers now, sending nothing (a circuit's probe after a
        hang): NOOP on a kept connection, else a fresh one's greeting, EHLO and NOOP.
        ProviderError when it does not answer."""
        kept = self.pool.take()
        if kept is not None:
            try:
                code, _ = kept.conn.noop()
            except (OSError, smtplib.SMTPException) as exc:
                self.pool.drop(kept, _close)
                raise _ping_failed(exc) from exc
            if code == 250:
                self.pool.give_back(kept)
                return
            self.pool.drop(kept, _close)
        smtp: smtplib.SMTP | None = None
        try:
            smtp = self._connect()
            code, text = smtp.ehlo()
            if code != 250:
                code, text = smtp.helo()
            if code == 250:
                code, text = smtp.noop()
        except (OSError, smtplib.SMTPException) as exc:
            close_unreturned(exc)
            raise _ping_failed(exc) from exc
        finally:
            if smtp is not None:
                _quit(smtp)
        if code != 250:
            raise ProviderError(f"ping: {code} {_text(text)}", unavailable=code == 421)

    # -- a fresh connection -------------------------------------------------------------

    def _hostname(self) -> str:
        # smtplib asks for the FQDN (a reverse lookup) on every connection otherwise.
        if self._local_hostname is None:
            self._local_hostname = socket.getfqdn()
        return self._local_hostname

    def _connect(self) -> smtplib.SMTP:
        e = self.endpoint
        if e.security == "tls":
            return BoundedSMTP_SSL(
                e.host,
                e.port,
                local_hostname=self._hostname(),
                timeout=e.timeout,
                context=e.ssl_context,
            )
        return e.opened(
            lambda host: BoundedSMTP(
                host, e.port, local_hostname=self._hostname(), timeout=e.timeout
            )
        )

    def _on_fresh(self, envelope: SubmitEnvelope) -> SendOutcome:
        stage = Stage.CONNECT
        e = self.endpoint
        smtp: smtplib.SMTP | None = None
        try:
            smtp = self._connect()
            stage = Stage.HELLO
            code, text = smtp.ehlo()
            if code != 250:
                code, text = smtp.helo()
                if code != 250:
                    raise _Refused(code, text)
            if e.security == "starttls":
                # starttls() raises unless the server says 220, and re-runs no command.
                smtp.starttls(context=start_tls(e.ssl_context, e.timeout))
                code, text = smtp.ehlo()
                if code != 250:
                    raise _Refused(code, text)
            stage = Stage.AUTH
            smtp.login(self.endpoint.username, self.endpoint.password)
        except _Refused as refused:
            if smtp is not None:
                _quit(smtp)
            return classify_smtp(
                stage, refused.code, _text(refused.text), message_id=envelope.message_id
            )
        except smtplib.SMTPResponseException as exc:
            if smtp is not None:
                _quit(smtp)
            return classify_smtp(
                stage, exc.smtp_code, _text(exc.smtp_error), message_id=envelope.message_id
            )
        except (OSError, smtplib.SMTPException, ValueError) as exc:
            close_unreturned(exc)  # a TLS wrap's socket smtplib never got (a reset under it)
            if smtp is not None:
                _close(smtp)
            return classify_smtp(
                stage,
                None,
                _describe(exc),
                message_id=envelope.message_id,
                timed_out=timed_out(exc),
            )
        return self._transaction(self.pool.fresh(smtp), envelope)

    # -- one transaction ----------------------------------------------------------------

    def _ready(self, kept: Kept[smtplib.SMTP]) -> None:
        """Raises _Retry when a kept connection is not fit for a new transaction; a
        timeout propagates (not retried: see the module docstring)."""
        smtp = kept.conn
        if _written_to_unasked(smtp):
            raise _Retry
        if kept.dirty:
            code, _ = smtp.rset()
        elif kept.idle(self.pool.clock()) > self.limits.idle_check_after:
            code, _ = smtp.noop()
        else:
            return
        if code != 250:
            raise _Retry

    def _transaction(self, kept: Kept[smtplib.SMTP], envelope: SubmitEnvelope) -> SendOutcome:
        """MAIL, RCPT, DATA, the content and the final `.` on an open, logged-in
        connection. The connection goes back to the pool when its state is known and
        usable, else it is closed; `_Retry` when a kept one was dead before MAIL FROM."""
        smtp = kept.conn
        stage = Stage.RESET if kept.reused else Stage.MAIL
        usable = False
        try:
            if kept.reused:
                self._ready(kept)
                stage = Stage.MAIL
            body = " BODY=8BITMIME" if envelope.eight_bit and smtp.has_extn("8bitmime") else ""
            commands = _envelope_commands(self.endpoint.username, body, envelope.recipients)
            # RFC 2920: where the server offers PIPELINING, MAIL, the RCPTs and DATA go in
            # groups of up to PIPELINE_GROUP commands, each group in one write with its
            # replies read after it: one round trip a group instead of one a command. The
            # replies are still read in order, so the dialogue ends at the same stage with
            # the same reply as it does one command at a time.
            size = PIPELINE_GROUP if self.pipelining and smtp.has_extn("pipelining") else 1
            for first in range(0, len(commands), size):
                group = commands[first : first + size]
                smtp.send("".join(line for _, line in group))
                for at, (stage, _line) in enumerate(group):
                    code, text = smtp.getreply()
                    if code == 421 and kept.reused and stage is Stage.MAIL:
                        raise _Retry
                    if code not in _ACCEPTED[stage]:
                        # All or nothing: a partial delivery is not the job that was asked
                        # for. The connection is kept (reset first) when the server answered
                        # the commands written after this one and is not in a message's data.
                        left = group[at + 1 :]
                        usable = code != 421 and _answered_outside_data(smtp, left)
                        kept.dirty = True
                        return classify_smtp(
                            stage, code, _text(text), message_id=envelope.message_id
                        )
            stage = Stage.CONTENT
            # Raises before the "." is written; back once the server has it, or it stalled.
            if not _send_content(smtp, envelope.wire_data(), self.endpoint.timeout):
                # Replied before the final ".": the server has no whole message, and its
                # reply says why (a refusal; a close is a not-sent as any close here).
                code, text = smtp.getreply()
                kept.dirty = True
                return classify_smtp(stage, code, _text(text), message_id=envelope.message_id)
            stage = Stage.END_OF_DATA
            code, text = smtp.getreply()
            # A 250 ends the transaction. After a refusal RFC 5321 says it is over too,
            # but Postfix answers the next MAIL with 503 after its own end-of-data 451: so
            # a refused message's connection is reset (RSET) before it is used again.
            usable = 200 <= code < 600 and code != 421
            kept.dirty = not 200 <= code < 300
            return classify_smtp(stage, code, _text(text), message_id=envelope.message_id)
        except _Retry:
            usable = False
            raise
        except (OSError, smtplib.SMTPException, ValueError) as exc:
            # Every reply here is read with getreply(), which returns the server's code.
            # The one SMTPResponseException it raises is smtplib's own "500 Line too
            # long." for a reply it could not read: no reply, never the server's refusal
            # (after the final "." the message may have been queued).
            if kept.reused and stage in (Stage.RESET, Stage.MAIL) and _dead(exc):
                raise _Retry from exc
            return classify_smtp(
                stage,
                None,
                _describe(exc),
                message_id=envelope.message_id,
                timed_out=timed_out(exc),  # after DATA: a hang, for the circuit
                # Closed or reset instead of a reply (smtplib's words for both): no answer.
                closed=isinstance(exc, smtplib.SMTPServerDisconnected),
            )
        finally:
            if usable:
                self.pool.give_back(kept)
            else:
                self.pool.drop(kept, _close)

"""A fault-injecting SMTP relay: the crash boundary of an SMTP submission, on demand.

It sits between an SMTP client and a submission server and relays the dialogue one command
and one reply at a time. At the end of each message's DATA (the final `.`) it applies the
next planned mode:

- ``pass``: forward the data and the server's reply;
- ``drop-response``: forward the data, read the server's reply, then close the client's
  connection without it (RFC 1047's case: the message is queued, the client cannot know);
- ``fail-before-forward``: close both connections before the final data reaches the
  server (nothing queued; the client sees exactly what it sees for drop-response);
- ``hang``: forward the data, hold the reply for ``hang_seconds``, then close.

Each client connection may carry any number of messages; the modes apply one per message,
whatever connection it comes on, so a fault can hit the 1st, 2nd or nth message of a kept
connection. Any command (and the greeting, as ``GREETING``) can also be answered by the
relay itself instead of the server (`answer`): a reply the server never gave, for the next
``times`` such commands; after a ``421`` the relay closes the connection, as a server
does. `replace_reply` makes the next ends of data forwarded as ``pass`` does but answered
with bytes of the caller's choosing (a garbled or over-long reply) instead of the server's
(kept in `replaced_replies`). `sessions` counts the client connections, `verbs` the
commands seen, and `written_ahead` the commands the client followed with another before
their reply came (RFC 2920 PIPELINING). The server's offer of PIPELINING reaches the client
unchanged, or is taken out of the EHLO reply (``offer_pipelining=False``) so the client
writes one command a reply.

The relay forwards each command once and never re-sends, so the server's mailbox counts
exactly what the client sent. The client talks plain SMTP to the relay (the relay must read
the dialogue); towards the server the relay can use implicit TLS or STARTTLS itself, so it
also works in front of a real provider. A client's own STARTTLS is refused (454).

It imports nothing from the daemon, the ledger or the policies.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
from collections import Counter, deque
from collections.abc import Callable, Iterable
from typing import Literal, get_args

SmtpMode = Literal["pass", "drop-response", "fail-before-forward", "hang"]
SMTP_MODES: tuple[SmtpMode, ...] = get_args(SmtpMode)
UpstreamSecurity = Literal["none", "tls", "starttls"]

_END_OF_DATA = b"\r\n.\r\n"
# The commands `answer` can stand in for and `verbs` counts (RFC 5321, RFC 4954 AUTH).
_VERBS = frozenset({"HELO", "EHLO", "AUTH", "MAIL", "RCPT", "DATA", "RSET", "NOOP", "QUIT", "VRFY"})
_MAX_LINE = 1 << 16


def check_smtp_mode(value: str) -> SmtpMode:
    if value not in SMTP_MODES:
        raise ValueError(f"unknown SMTP fault mode {value!r} (one of: {', '.join(SMTP_MODES)})")
    return value


class _Stream:
    """Line and reply reading over a socket, with the bytes read ahead kept."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = b""

    def _fill(self) -> bool:
        chunk = self.sock.recv(65536)
        if not chunk:
            return False
        self.buffer += chunk
        return True

    def read_until(self, marker: bytes, *, start: int = 0) -> bytes | None:
        """Everything up to and including `marker` (searched from `start`), or None at EOF."""
        while True:
            index = self.buffer.find(marker, start)
            if index >= 0:
                end = index + len(marker)
                data, self.buffer = self.buffer[:end], self.buffer[end:]
                return data
            if len(self.buffer) > _MAX_LINE and marker == b"\r\n":
                return None
            start = max(0, len(self.buffer) - len(marker) + 1)
            if not self._fill():
                return None

    def read_reply(self) -> bytes | None:
        """One complete SMTP reply (every line of a multi-line one), or None at EOF."""
        reply = b""
        while True:
            line = self.read_until(b"\r\n")
            if line is None:
                return None
            reply += line
            if len(line) < 6 or line[3:4] != b"-":
                return reply

    def read_data(self) -> bytes | None:
        """The message after a 354, up to and including the final CRLF . CRLF."""
        # The data may be only ".\r\n" (an empty message) right after the 354.
        while len(self.buffer) < 3 and self._fill():
            pass
        if self.buffer.startswith(b".\r\n"):
            data, self.buffer = self.buffer[:3], self.buffer[3:]
            return data
        return self.read_until(_END_OF_DATA)


class SmtpFaultRelay:
    """See the module docstring. Use as a context manager; `port` is where clients connect."""

    def __init__(
        self,
        upstream_host: str,
        upstream_port: int,
        *,
        modes: Iterable[SmtpMode] = (),
        upstream_security: UpstreamSecurity = "none",
        ssl_context: ssl.SSLContext | None = None,
        hang_seconds: float = 5.0,
        timeout: float = 30.0,
        host: str = "127.0.0.1",
        port: int = 0,
        offer_pipelining: bool = True,
        connect: Callable[[tuple[str, int], float], socket.socket] = socket.create_connection,
    ) -> None:
        self.upstream = (upstream_host, upstream_port)
        # How the upstream is reached (`sendledger probe`: a loopback name on its loopback
        # addresses only, as the daemon's own SMTP client).
        self._connect = connect
        self.offer_pipelining = offer_pipelining
        self.upstream_security = upstream_security
        self.hang_seconds = hang_seconds
        self.timeout = timeout
        self._ssl = ssl_context or ssl.create_default_context()
        self._lock = threading.Lock()
        self._modes: deque[SmtpMode] = deque(check_smtp_mode(m) for m in modes)
        #: The mode applied at each end of data, in order.
        self.applied: list[SmtpMode] = []
        #: The server's replies to ends of data that the client never got.
        self.dropped_replies: list[str] = []
        #: The server's replies to ends of data that `replace_reply` stood in for.
        self.replaced_replies: list[str] = []
        self._replacements: deque[bytes] = deque()
        #: Client connections accepted, and the commands they sent (upper-case verbs).
        self.sessions = 0
        self.verbs: Counter[str] = Counter()
        self.written_ahead: Counter[str] = Counter()
        self._answers: dict[str, deque[str]] = {}
        self._clients: set[socket.socket] = set()
        self._stop = threading.Event()
        self._listener = socket.create_server((host, port))
        self._listener.settimeout(0.2)
        self.host = host
        self.port: int = self._listener.getsockname()[1]
        self._threads: list[threading.Thread] = []
        self._accept = threading.Thread(target=self._serve, name="smtp-relay", daemon=True)

    def set_modes(self, modes: Iterable[SmtpMode]) -> None:
        """The modes for the next messages, in order; `pass` once they are used up."""
        with self._lock:
            self._modes = deque(check_smtp_mode(m) for m in modes)

    def answer(
        self, verb: str, reply: str, *, times: int = 1, skip: int = 0, garbled: bool = False
    ) -> None:
        """Answer `times` commands `verb` (``MAIL``, ``RCPT``, ``DATA``, ``EHLO``, ``AUTH``,
        ``RSET``, ``NOOP``, ... or ``GREETING``) with `reply` ("451 4.3.0 busy") instead of
        forwarding them, after forwarding the next `skip` of them; a 421 then closes the
        connection. `garbled`: `reply` is any one line, not an SMTP reply (an impostor
        server's, or a broken one's)."""
        if verb.upper() not in _VERBS | {"GREETING"}:
            raise ValueError(f"not a command the relay answers: {verb!r}")
        code = reply[:3]
        if "\r" in reply or "\n" in reply:
            raise ValueError(f"one line, without its CRLF: {reply!r}")
        if not garbled and not (code.isdigit() and reply[3:4] in ("", " ")):
            raise ValueError(f"an SMTP reply starts with a code and a space: {reply!r}")
        with self._lock:
            self._answers.setdefault(verb.upper(), deque()).extend([""] * skip + [reply] * times)

    def replace_reply(self, raw: bytes, *, times: int = 1) -> None:
        """For the next `times` ends of data that reach the server (mode ``pass``): write
        `raw` (any bytes, CRLF included) to the client instead of the server's reply."""
        with self._lock:
            self._replacements.extend([raw] * times)

    def hang_up(self) -> int:
        """Close every client connection now, as a server closes idle ones (its timeout):
        the client finds out at its next command, or before it by looking. How many."""
        with self._lock:
            clients = list(self._clients)
        for sock in clients:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        return len(clients)

    def _answer_for(self, verb: str) -> bytes | None:
        with self._lock:
            self.verbs[verb] += 1
            queue = self._answers.get(verb)
            own = queue.popleft() if queue else ""
            return (own + "\r\n").encode() if own else None  # "": forwarded (skipped)

    def _next_mode(self) -> SmtpMode:
        with self._lock:
            mode: SmtpMode = self._modes.popleft() if self._modes else "pass"
            self.applied.append(mode)
            return mode

    def __enter__(self) -> SmtpFaultRelay:
        self._accept.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._stop.set()
        if self._accept.is_alive():
            self._accept.join(timeout=5)
        self._listener.close()
        # A relay that stops ends its clients' connections, as a server that stops does: a
        # session waiting for a client's next command (a kept connection nobody closed)
        # would otherwise hold this close for its join timeout (6.5 s a test, measured).
        self.hang_up()
        for thread in self._threads:
            thread.join(timeout=self.hang_seconds + 5)

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            thread = threading.Thread(target=self._session, args=(client,), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _open_upstream(self) -> _Stream:
        sock: socket.socket = self._connect(self.upstream, self.timeout)
        host = self.upstream[0]
        if self.upstream_security == "tls":
            sock = self._ssl.wrap_socket(sock, server_hostname=host)
        stream = _Stream(sock)
        if self.upstream_security == "starttls":
            greeting = stream.read_reply()
            for command in (b"EHLO sendledger-relay\r\n", b"STARTTLS\r\n"):
                sock.sendall(command)
                if stream.read_reply() is None:
                    raise ConnectionError("upstream closed during STARTTLS")
            stream = _Stream(self._ssl.wrap_socket(sock, server_hostname=host))
            # The client reads the server's greeting as if nothing had happened.
            stream.buffer = greeting or b""
        return stream

    def _session(self, client_sock: socket.socket) -> None:
        client_sock.settimeout(self.timeout)
        client = _Stream(client_sock)
        upstream: _Stream | None = None
        with self._lock:
            self.sessions += 1
            self._clients.add(client_sock)
        try:
            upstream = self._open_upstream()
            greeting = upstream.read_reply()
            if greeting is None:
                return
            own = self._answer_for("GREETING")
            client_sock.sendall(own or greeting)
            if own is not None and own.startswith(b"421"):
                return
            while not self._stop.is_set():
                command = client.read_until(b"\r\n")
                if command is None:
                    return
                verb = command.strip().split(b" ", 1)[0].upper()
                if verb == b"STARTTLS":
                    client_sock.sendall(b"454 4.7.0 TLS is not available through the relay\r\n")
                    continue
                # An AUTH exchange's own lines (base64) are no commands: never counted.
                name = verb.decode("ascii", "replace")
                if name in _VERBS and b"\r\n" in client.buffer:
                    with self._lock:
                        self.written_ahead[name] += 1
                own = self._answer_for(name) if name in _VERBS else None
                if own is not None:
                    # Never forwarded: the server's state is as before the command.
                    client_sock.sendall(own)
                    if own.startswith(b"421"):
                        return
                    continue
                upstream.sock.sendall(command)
                reply = upstream.read_reply()
                if reply is None:
                    return
                if verb == b"EHLO" and not self.offer_pipelining:
                    reply = _without_pipelining(reply)
                client_sock.sendall(reply)
                data_next = verb == b"DATA" and reply.startswith(b"354")
                if data_next and not self._relay_data(client, upstream):
                    return
        except OSError:
            return
        finally:
            with self._lock:
                self._clients.discard(client_sock)
            for stream in (client, upstream):
                if stream is not None:
                    _close(stream.sock)

    def _relay_data(self, client: _Stream, upstream: _Stream) -> bool:
        """One message's data and the reply to its end; False when the session ends."""
        data = client.read_data()
        if data is None:
            return False
        mode = self._next_mode()
        if mode == "fail-before-forward":
            return False
        upstream.sock.sendall(data)
        reply = upstream.read_reply()
        if reply is None:
            return False
        if mode == "pass":
            with self._lock:
                replacement = self._replacements.popleft() if self._replacements else None
                if replacement is not None:
                    self.replaced_replies.append(reply.decode("utf-8", "replace").strip())
            client.sock.sendall(reply if replacement is None else replacement)
            return True
        with self._lock:
            self.dropped_replies.append(reply.decode("utf-8", "replace").strip())
        if mode == "hang":
            self._stop.wait(self.hang_seconds)
        return False


def _without_pipelining(reply: bytes) -> bytes:
    """An EHLO reply with its PIPELINING line taken out (the last line keeps its space)."""
    lines = [line for line in reply.split(b"\r\n") if line]
    kept = [line for line in lines if line[4:].strip().upper() != b"PIPELINING"]
    if kept != lines:
        kept = [line[:3] + b"-" + line[4:] for line in kept[:-1]] + [
            kept[-1][:3] + b" " + kept[-1][4:]
        ]
    return b"".join(line + b"\r\n" for line in kept)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.close()


__all__ = ["SMTP_MODES", "SmtpFaultRelay", "SmtpMode", "check_smtp_mode"]

"""What a PostgreSQL server said when it refused a new connection, and the fix an
operator reads with it (`ledger.stores.postgres` says it in the store's one line).

psycopg's error for a refused connection carries no SQLSTATE: `e.sqlstate` and `e.diag`
are empty, and `e.pgconn.error_message` holds only the server's words, in the language of
its `lc_messages`. libpq read the code from the server's ErrorResponse and keeps it to
itself. Its protocol trace (`PGconn.trace`, Linux only) shows that ErrorResponse whole:
a second try of the same connection, traced, gives the code (`server_refusal`). libpq 18
(the one psycopg-binary 3.3 bundles) traces every start-up answer; libpq 15 (Debian 12's)
only those after the password was taken (a role's or a database's connection limit), not
a refused password or pg_hba.conf line (both checked). Where no trace shows it (such a
libpq, another system), the words are all there is, and only a server speaking English is
recognized by them (the fallbacks: `hba_fix`, `LOGIN_REFUSED_WORDS`, `ROLE_REFUSED_WORDS`,
`postgres._NO_FREE_SLOT`).

A refused password reads the same to the client whatever its cause (28P01, "password
authentication failed for user"): a wrong password, a role without one, no role of that
name, or a password stored as md5 under a `scram-sha-256` line. The server keeps the cause
for its own log (its DETAIL line), so that a client cannot probe for roles: the fix names
each (`PASSWORD_FIX`).
"""

from __future__ import annotations

import math
import os
import re
import select
import threading
import time
from dataclasses import dataclass

from psycopg import pq

from ledger.stores.url import PostgresStore

#: SQLSTATEs a server refuses a new connection with, recognized by their code (57P03,
#: starting up or shutting down, is libpq's ping's to tell: `postgres._ping_after`).
INVALID_PASSWORD = "28P01"
INVALID_AUTHORIZATION = "28000"  # no or a rejecting pg_hba.conf line; no such role
TOO_MANY_CONNECTIONS = "53300"  # every slot taken, the rest reserved, a CONNECTION LIMIT

#: The fixes said with each refusal: the driver's words name the user, not the setting
#: that gave it, nor what on the server to change.
PASSWORD_FIX = (
    "fix the password in store.url; a right one is refused too when the server has no "
    "role of that name, when the role has no password (ALTER ROLE ... PASSWORD), or when "
    "it is stored as md5 under a scram-sha-256 line of pg_hba.conf (set it again under "
    "password_encryption scram-sha-256, or make the line md5): the server's log says "
    "which, on its DETAIL line"
)
NO_PASSWORD_FIX = "the server asks a password of this user: put it in store.url"
ROLE_FIX = (
    "fix the user in store.url, or let that role log in on the server (CREATE ROLE ... "
    "LOGIN, or ALTER ROLE ... LOGIN)"
)

#: A server's English words for a refused password and a role it does not know, where
#: no code is known (see the module).
LOGIN_REFUSED_WORDS = re.compile(r"authentication failed for user")
ROLE_REFUSED_WORDS = re.compile(r'role ".*" (?:does not exist|is not permitted to log in)')

#: How an English server words a connection its pg_hba.conf has no line for, or one whose
#: line rejects it (28000). The host it names is the client's address as the server saw
#: it, the one a pg_hba.conf line must match: not the URL's host, which is the server's.
_HBA_REFUSED = re.compile(
    r'(?:no pg_hba\.conf entry|pg_hba\.conf rejects connection) for host "([^"]+)"'
)
#: The first quoted name of a server's message in any of its languages: the client's
#: address in a pg_hba.conf refusal, which every translation names first, quoted "..."
#: (English, Italian, Russian...), »...« (German), «...» or « ... » (Spanish, French).
_FIRST_QUOTED = re.compile(r'["»«„“]\s?([^"»«„“\s]+)\s?["»«„“]')
#: Words a pg_hba.conf field reads as a keyword, not as a name, unless quoted.
_HBA_KEYWORDS = frozenset({"all", "sameuser", "samerole", "samegroup", "replication"})
#: What no pg_hba.conf field holds, quoted or not: the file is read a line at a time.
_HBA_UNWRITABLE = re.compile(r"[\x00-\x1f\x7f]")


@dataclass(frozen=True)
class ServerRefusal:
    """The server's ErrorResponse to a new connection: its SQLSTATE and its words."""

    code: str
    message: str


def refusal_fix(
    store: PostgresStore, said: str, refusal: ServerRefusal | None, needs_password: bool
) -> str:
    """The fix said with a refused connection: by the server's code when it is known
    (`refusal`), else by its English words (`said`, the driver's message); "" when the
    refusal has none (a missing database: its words say which). `needs_password`: libpq
    found that the server asked a password and none was given."""
    if needs_password or "no password supplied" in said:  # libpq's words, its own
        return NO_PASSWORD_FIX
    if refusal is None:
        if LOGIN_REFUSED_WORDS.search(said):
            return PASSWORD_FIX
        if ROLE_REFUSED_WORDS.search(said):
            return ROLE_FIX
        return hba_fix(store, said)
    if refusal.code == INVALID_PASSWORD:
        return PASSWORD_FIX
    if refusal.code == INVALID_AUTHORIZATION:
        if "pg_hba.conf" not in refusal.message:  # a file's name: never translated
            return ROLE_FIX
        address = _FIRST_QUOTED.search(refusal.message)
        return hba_line(store, "ADDRESS" if address is None else address.group(1))
    return ""


def hba_fix(store: PostgresStore, said: str) -> str:
    """The pg_hba.conf line the server needs (`hba_line`) when `said`, an English
    server's words, is a pg_hba.conf refusal; else ""."""
    found = _HBA_REFUSED.search(said)
    return "" if found is None else hba_line(store, found.group(1))


def hba_line(store: PostgresStore, address: str) -> str:
    """The pg_hba.conf line the server needs for the store's database and user from the
    client's `address` (no password: the line asks for one). A refusal no wait changes,
    whose fix is on the server, not in store.url: the driver's words name the address
    but not the line to write."""
    unwritable = [
        what
        for what, name in (("database", store.dbname), ("user", store.user))
        if _HBA_UNWRITABLE.search(name)
    ]
    if unwritable:
        # Quoted, the line would still break in two (and so would this one-line error).
        return (
            f"no pg_hba.conf line can name this {' or '.join(unwritable)} (a line break or "
            "another control character in the name): use one whose name has none"
        )
    names = f"{_hba_word(store.dbname)} {_hba_word(store.user)}"
    if address == "[local]":
        # A Unix socket's connection: the server names no address, and only a `local`
        # line (which has none) matches it; a `host` line never does.
        line = f"local {names} scram-sha-256"
    else:
        mask = "128" if ":" in address else "32"
        line = f"host {names} {address}/{mask} scram-sha-256"
    # scram-sha-256 refuses a role whose password was stored as an md5 hash (set under
    # password_encryption md5): "password authentication failed" once the line is in.
    return (
        f"the server's pg_hba.conf needs the line '{line}' (above any line that rejects "
        "it), then SELECT pg_reload_conf() as a superuser (md5 in place of scram-sha-256 "
        "for a role whose password is stored as md5)"
    )


def _hba_word(name: str) -> str:
    if re.fullmatch(r"[A-Za-z0-9_$.-]+", name) and name not in _HBA_KEYWORDS:
        return name
    return '"' + name.replace('"', '""') + '"'


#: The refusal each message was found to carry (`server_refusal`), by the message, with
#: until when (monotonic) it stands: a server words one refusal the same way each time,
#: so it is traced once. Bounded: each trace leaves libpq's stream behind (psycopg opens
#: a FILE on the descriptor and never closes it, a few KB), and a store's refusals are
#: few messages.
_FOUND: dict[str, tuple[ServerRefusal | None, float]] = {}
_FOUND_LOCK = threading.Lock()
_FOUND_MAX = 64
#: Seconds a refusal no trace shows (libpq 15 before the password) is not traced again:
#: a running daemon's pool asks at each store call that waits out its connection, and
#: each try is one more refused login in the server's log, and one more stream left.
UNTRACED_FOR = 60.0

#: The ErrorResponse as libpq 18's trace prints it: severity twice (localized, then not),
#: the code, then the words, raw, up to the next field.
_TRACED = re.compile(
    r'\tErrorResponse\t S "[^"]*"(?: V "[^"]*")? C "([0-9A-Z]{5})" M "(.*?)"(?= [A-Za-z] "| \\x00)',
    re.DOTALL,  # a translation may break its words over two lines
)


def server_refusal(conninfo: str, timeout: float, said: str) -> ServerRefusal | None:
    """The code and words of the refusal whose driver's message was `said`, from a
    second try of the connection (`conninfo`), traced (see the module). None when that
    try met no ErrorResponse (no trace shows it, or the server let it in) or another
    one than `said` carries. Asked only of a server that answered (libpq's ping)."""
    now = time.monotonic()
    with _FOUND_LOCK:
        found = _FOUND.get(said)
        if found is not None and now < found[1]:
            return found[0]
    refusal, refused = _traced_try(conninfo, timeout)
    if refusal is not None and refusal.message in said:
        until = math.inf
    elif refusal is None and refused:
        until = now + UNTRACED_FOR  # no trace shows it; asked again after a while
    else:
        return None  # another refusal than said, or let in, or no end in time: ask again
    with _FOUND_LOCK:
        if len(_FOUND) >= _FOUND_MAX:
            _FOUND.clear()
        _FOUND[said] = (refusal, until)
    return refusal


def _traced_try(conninfo: str, timeout: float) -> tuple[ServerRefusal | None, bool]:
    """The ErrorResponse a traced try of `conninfo` met within `timeout`, if any, and
    whether the try was refused (rather than let in, or not ended in time). The trace
    stays in memory: it holds what was sent, under a `password` line of pg_hba.conf the
    password itself."""
    if not hasattr(os, "memfd_create"):
        return None, False
    conn = pq.PGconn.connect_start(conninfo.encode())
    trace = os.memfd_create("sendledger-pg-refusal")
    try:
        try:
            conn.trace(trace)
        except Exception:  # not Linux (psycopg's NotSupportedError)
            return None, False
        _poll(conn, time.monotonic() + timeout)
        refused = conn.status == pq.ConnStatus.BAD
        conn.untrace()  # flushed: the stream is never written again
        os.lseek(trace, 0, os.SEEK_SET)
        text = b"".join(iter(lambda: os.read(trace, 65536), b"")).decode("utf-8", "replace")
    finally:
        conn.finish()
        os.close(trace)
    return refusal_in(text), refused


def refusal_in(trace: str) -> ServerRefusal | None:
    """The first ErrorResponse of a libpq protocol trace, if any."""
    found = _TRACED.search(trace)
    return None if found is None else ServerRefusal(found.group(1), found.group(2))


def _poll(conn: pq.abc.PGconn, deadline: float) -> None:
    """libpq's non-blocking connect, to its end or the deadline (libpq bounds only its
    blocking connect by `connect_timeout`). Waited with poll(), not select(): a daemon
    holding many connections numbers this one past select()'s 1,023."""
    status = pq.PollingStatus.WRITING
    while conn.status != pq.ConnStatus.BAD and status not in _ENDED:
        left = deadline - time.monotonic()
        if left <= 0:
            return
        waiting = select.poll()  # anew each time: libpq may open another socket
        reading = status == pq.PollingStatus.READING
        waiting.register(conn.socket, select.POLLIN if reading else select.POLLOUT)
        waiting.poll(left * 1000)
        status = pq.PollingStatus(conn.connect_poll())


_ENDED = (pq.PollingStatus.OK, pq.PollingStatus.FAILED)


__all__ = [
    "INVALID_AUTHORIZATION",
    "INVALID_PASSWORD",
    "NO_PASSWORD_FIX",
    "PASSWORD_FIX",
    "ROLE_FIX",
    "TOO_MANY_CONNECTIONS",
    "ServerRefusal",
    "hba_fix",
    "hba_line",
    "refusal_fix",
    "refusal_in",
    "server_refusal",
]

"""Who is calling: API tokens from `api.token_file`, review-page sessions, CSRF tokens.

A token file holds one token a line, optionally `name:token` (every right) or
`name:token:ROLES` (a comma list of the roles of `Role`: docs/http-api.md "Roles"); the name is
recorded as who submitted or resolved. A token is printable ASCII without `:` (what a
browser's form and an HTTP header carry unchanged), each token once in the file.
Tokens are compared in constant time. A signed-in browser holds a
random session id in an HttpOnly, SameSite=Strict cookie (kept in memory: a restart signs
everyone out; expired ones dropped at each sign-in, at most MAX_SESSIONS_PER_NAME a name);
each form carries a CSRF token derived from that session.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from daemon.config.secret_text import content_lines, read_secret_text
from ledger.exceptions import Refusal, SendledgerError
from ledger.keys import MAX_NAME_LENGTH, identifier_problem

SESSION_COOKIE = "sendledger_session"
SESSION_SECONDS = 8 * 3600
#: Sessions one name keeps at most: a sign-in past it ends that name's oldest one (memory
#: stays bounded however often a token signs in, and no holder signs out another name).
MAX_SESSIONS_PER_NAME = 100


class TokenFileError(SendledgerError, ValueError):
    """The token file cannot be used; the message names the file and line."""

    kind = Refusal.BAD_INPUT


class Role(StrEnum):
    """What a token may do; which route needs which is `daemon.api.roles.ROUTE_ROLES`."""

    SUBMIT = "submit"  # put jobs in (and withdraw one not yet attempted)
    READ = "read"  # read jobs back: status, events, the listing
    REVIEW = "review"  # the review queue, searches, decisions, triage, the page
    ADMIN = "admin"  # every right, as a token without roles


ALL_ROLES = frozenset(Role)
MIN_TOKEN_LENGTH = 16


@dataclass(frozen=True)
class Identity:
    """The name a token acts as and its roles."""

    name: str
    roles: frozenset[Role] = ALL_ROLES

    def may(self, role: Role) -> bool:
        return Role.ADMIN in self.roles or role in self.roles


def token_problem(token: str) -> str | None:
    """Why `token` cannot be a token, or None."""
    if len(token) < MIN_TOKEN_LENGTH:
        return f"a token is at least {MIN_TOKEN_LENGTH} characters"
    if not all("!" <= c <= "~" for c in token):
        return "a token is printable ASCII without spaces (no accents, no control characters)"
    return None


def parse_roles(text: str) -> frozenset[Role] | str:
    """The roles of a comma list, or why it is not one."""
    names = [part.strip() for part in text.split(",")]
    known = {role.value for role in Role}
    unknown = [name for name in names if name not in known]
    if not text.strip() or unknown:
        wanted = ", ".join(role.value for role in Role)
        got = f" (not {', '.join(repr(n) for n in unknown)})" if unknown else ""
        return f"roles are a comma list of {wanted}{got}; leave the field out for every right"
    return frozenset(Role(name) for name in names)


class TokenBook:
    """The accepted tokens and who each acts as."""

    def __init__(self, tokens: Mapping[str, str | Identity]) -> None:
        # Keyed by a digest: comparing digests of equal length leaks nothing of the token.
        self._identities = {
            _digest(token): who if isinstance(who, Identity) else Identity(who)
            for token, who in tokens.items()
        }

    @classmethod
    def from_file(cls, path: Path) -> TokenBook:
        try:
            text = read_secret_text(path)
        except ValueError as exc:
            raise TokenFileError(f"api.token_file: {exc}") from None
        return cls.from_lines(path, content_lines(text))

    @classmethod
    def from_lines(cls, path: Path, lines: Iterable[tuple[int, str]]) -> TokenBook:
        tokens: dict[str, Identity] = {}
        lines_of: dict[str, int] = {}
        for number, line in lines:
            where = f"api.token_file: {path}:{number}"
            parts = [part.strip() for part in line.split(":")]
            if len(parts) > 3:
                raise TokenFileError(
                    f"{where}: name:token:roles at most (a token may not contain ':')"
                )
            if len(parts) == 1:
                parts = [f"token-{number}", *parts]
            name, token = parts[0], parts[1]
            problem = token_problem(token)
            if not name or problem:
                raise TokenFileError(
                    f"{where}: {problem or 'an empty name'} (a line is token, name:token "
                    "or name:token:roles)"
                )
            problem = identifier_problem(name) or (
                f"longer than {MAX_NAME_LENGTH} characters" if len(name) > MAX_NAME_LENGTH else None
            )
            if problem:
                # The name is recorded as who submitted or decided (docs/cli.md "Keys").
                raise TokenFileError(f"{where}: the name {problem}")
            roles = parse_roles(parts[2]) if len(parts) == 3 else ALL_ROLES
            if isinstance(roles, str):
                raise TokenFileError(f"{where}: {roles}")
            if token in lines_of:
                # Which line would win is not for the file's order to decide.
                raise TokenFileError(
                    f"api.token_file: {path}: lines {lines_of[token]} and {number} hold the "
                    "same token: give each caller its own"
                )
            lines_of[token] = number
            tokens[token] = Identity(name, roles)
        if not tokens:
            raise TokenFileError(f"api.token_file: {path}: no tokens")
        return cls(tokens)

    def identity(self, token: str | None) -> Identity | None:
        """Who a valid token is, else None."""
        if not token:
            return None
        wanted = _digest(token)
        found = None
        for digest, identity in self._identities.items():
            if hmac.compare_digest(digest, wanted):
                found = identity
        return found

    def who(self, token: str | None) -> str | None:
        """The name of a valid token, else None."""
        found = self.identity(token)
        return None if found is None else found.name


def bearer(header: str | None) -> str | None:
    """The token of an `Authorization: Bearer TOKEN` header."""
    if not header:
        return None
    scheme, _, token = header.partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


class Sessions:
    """Signed-in browsers: session id -> (name, expiry)."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._lock = threading.Lock()
        self._sessions: dict[str, tuple[str, float]] = {}  # in the order opened
        self._secret = secrets.token_bytes(32)
        self._clock = clock

    def open(self, name: str) -> str:
        session = secrets.token_urlsafe(32)
        now = self._clock()
        with self._lock:
            # Dropped here too, not only when looked up: a browser that never comes back
            # would keep its session in memory for good.
            for old in [s for s, (_, expires) in self._sessions.items() if now > expires]:
                del self._sessions[old]
            mine = [s for s, (who, _) in self._sessions.items() if who == name]
            for old in mine[: max(0, len(mine) + 1 - MAX_SESSIONS_PER_NAME)]:
                del self._sessions[old]
            self._sessions[session] = (name, now + SESSION_SECONDS)
        return session

    def who(self, session: str | None) -> str | None:
        if not session:
            return None
        with self._lock:
            found = self._sessions.get(session)
            if found is None:
                return None
            name, expires = found
            if self._clock() > expires:
                del self._sessions[session]
                return None
            return name

    def close(self, session: str | None) -> None:
        with self._lock:
            self._sessions.pop(session or "", None)

    def csrf_token(self, session: str) -> str:
        return hmac.new(self._secret, session.encode(), hashlib.sha256).hexdigest()

    def csrf_ok(self, session: str | None, token: str | None) -> bool:
        if not session or not token:
            return False
        return hmac.compare_digest(self.csrf_token(session), token)


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()

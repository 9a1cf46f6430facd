"""Who is calling: API tokens from `api.token_file`, review-page sessions, CSRF tokens.

A token file holds one token a line, optionally `name:token`; the name is recorded as who
submitted or resolved. Tokens are compared in constant time. A signed-in browser holds a
random session id in an HttpOnly, SameSite=Strict cookie (kept in memory: a restart signs
everyone out); each form carries a CSRF token derived from that session.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import threading
import time
from collections.abc import Mapping
from pathlib import Path

from daemon.secret_text import content_lines, read_secret_text
from ledger.keys import MAX_NAME_LENGTH, identifier_problem

SESSION_COOKIE = "sendledger_session"
SESSION_SECONDS = 8 * 3600


class TokenFileError(ValueError):
    """The token file cannot be used; the message names the file and line."""


class TokenBook:
    """The accepted tokens and the name each acts as."""

    def __init__(self, tokens: Mapping[str, str]) -> None:
        # Keyed by a digest: comparing digests of equal length leaks nothing of the token.
        self._names = {_digest(token): name for token, name in tokens.items()}

    @classmethod
    def from_file(cls, path: Path) -> TokenBook:
        try:
            text = read_secret_text(path)
        except ValueError as exc:
            raise TokenFileError(f"api.token_file: {exc}") from None
        tokens: dict[str, str] = {}
        for number, line in content_lines(text):
            name, sep, token = line.partition(":")
            if not sep:
                name, token = f"token-{number}", line
            name, token = name.strip(), token.strip()
            if not name or len(token) < 16 or any(c.isspace() for c in token):
                raise TokenFileError(
                    f"api.token_file: {path}:{number}: a token of at least 16 characters "
                    "without spaces expected (optionally name:token)"
                )
            problem = identifier_problem(name) or (
                f"longer than {MAX_NAME_LENGTH} characters" if len(name) > MAX_NAME_LENGTH else None
            )
            if problem:
                # The name is recorded as who submitted or decided (README "Keys").
                raise TokenFileError(f"api.token_file: {path}:{number}: the name {problem}")
            tokens[token] = name
        if not tokens:
            raise TokenFileError(f"api.token_file: {path}: no tokens")
        return cls(tokens)

    def who(self, token: str | None) -> str | None:
        """The name of a valid token, else None."""
        if not token:
            return None
        wanted = _digest(token)
        found = None
        for digest, name in self._names.items():
            if hmac.compare_digest(digest, wanted):
                found = name
        return found


def bearer(header: str | None) -> str | None:
    """The token of an `Authorization: Bearer TOKEN` header."""
    if not header:
        return None
    scheme, _, token = header.partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


class Sessions:
    """Signed-in browsers: session id -> (name, expiry)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sessions: dict[str, tuple[str, float]] = {}
        self._secret = secrets.token_bytes(32)

    def open(self, name: str) -> str:
        session = secrets.token_urlsafe(32)
        with self._lock:
            self._sessions[session] = (name, time.monotonic() + SESSION_SECONDS)
        return session

    def who(self, session: str | None) -> str | None:
        if not session:
            return None
        with self._lock:
            found = self._sessions.get(session)
            if found is None:
                return None
            name, expires = found
            if time.monotonic() > expires:
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

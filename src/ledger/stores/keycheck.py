"""A store remembers how it is encrypted: key checks, written beside the events.

Without them a wrong `store.encryption_key_file` went unnoticed: new events were
written with the wrong key, the old ones failed to load one by one, and putting the right
key back made the new ones unreadable; a key added to a plain store did the same. Now
every store holds check rows in a table of its own (`KEY_TABLE`):

- `store`: written when the store is first opened. `plaintext` (no key), or
  `aes-256-gcm` with `CHECK_TEXT` encrypted by the first key of the ring;
- `key-<hex>`: `CHECK_TEXT` encrypted by a later first key (a rotation).

At open (`judge_store_key`) the configuration must fit the rows, before anything is
written: no key for a plain store, and for an encrypted one a key ring of which at least
one key opens one of its checks. When none opens with the ring's first key (the first
key changed: a rotation), a check for it is added, so the store keeps opening once the
old key leaves the ring. A store written by an earlier release has no rows: its first
open proves the configuration right on a sample of its stored events (first, last and
spread between) and then writes the `store` row; a store with no events simply gets it.
Two processes creating a store at once insert the same `store` row id: one wins, and the
other is judged against it. docs/configuration.md "Stored mail: file modes, encryption, daemon
names".

The same table holds the two rows of a copy (`sendledger admin copy-store`,
`daemon/service_layer/copy_store.py`), kinds the judgement above never reads:
`copy-started`, written before the copy's first event, and `copy-finished`, once it was
verified. A store with the first and not the second is an unfinished copy: refused at
every open (`refuse_unfinished_copy`), so no daemon runs on half a ledger. A row, not a
table of its own: every release opens this table before anything else, and an earlier
release ignores kinds it does not know.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol

from ledger.display import iso
from ledger.stores.url import StoreRefused

if TYPE_CHECKING:
    from ledger.stores.key_ring import KeyRingCipher

KEY_TABLE = "sendledger_store_keys"
STORE_CHECK = "store"
PLAINTEXT = "plaintext"
AES_256_GCM = "aes-256-gcm"
#: A row holding the index's digest secret (`digest_secret`) encrypted by one key.
DIGEST_SECRET = "digest-secret-aes-256-gcm"
#: What an encrypted check holds once decrypted. AES-GCM authenticates, so only the key
#: that encrypted it opens it.
CHECK_TEXT = b"sendledger store key check v1"
#: Keeps the digest secret apart from any other use of the key.
DIGEST_CONTEXT = b"sendledger index digest v1\0"
SETTING = "store.encryption_key_file"
#: The rows of a copy (`admin copy-store`): its start, then its verified end.
COPY_STARTED = "copy-started"
COPY_FINISHED = "copy-finished"


@dataclass(frozen=True)
class KeyCheck:
    check_id: str
    kind: str  # PLAINTEXT or AES_256_GCM
    value: bytes  # CHECK_TEXT encrypted by one key; b"" for PLAINTEXT
    created_at: float  # epoch seconds: for an operator who wonders

    def as_tuple(self) -> tuple[Any, ...]:
        return (self.check_id, self.kind, self.value, self.created_at)


class KeyChecks(Protocol):
    """What each backend's recorder keeps of a store's key checks."""

    def key_checks(self) -> list[KeyCheck]:
        """Every check row; none for a store that has none yet (no table: nothing is
        created to answer)."""
        ...

    def add_key_check(self, check: KeyCheck) -> None:
        """Insert the row, creating the table when missing; a row with the same id
        already there is kept as it is."""
        ...

    def remove_key_check(self, check_id: str) -> None:
        """Delete the row, if there is one (a copy's finished mark taken back)."""
        ...


class StoreKeyRefused(StoreRefused):
    """The key file does not fit the store: nothing was written."""


class UnfinishedCopy(StoreRefused):
    """The store is a copy that `admin copy-store` began and never verified: nothing may
    use it (its events stop part-way through the source's)."""


def unfinished_copy(checks: Sequence[KeyCheck]) -> KeyCheck | None:
    """The `copy-started` row of a copy not yet finished, else None."""
    kinds = {check.kind: check for check in checks}
    if COPY_FINISHED in kinds:
        return None
    return kinds.get(COPY_STARTED)


def refuse_unfinished_copy(checks: Sequence[KeyCheck], *, where: str) -> None:
    """UnfinishedCopy when the store's rows say it is a copy left unfinished."""
    started = unfinished_copy(checks)
    if started is not None:
        source = started.value.decode("utf-8", "replace")
        # A copy under way holds the same rows as one stopped: said both ways, and when it
        # began, or a second copy's refusal would advise emptying the one still running.
        begun = datetime.fromtimestamp(started.created_at, UTC)
        raise UnfinishedCopy(
            f"{where} is an unfinished copy of {source}, begun {iso(begun)} (admin "
            "copy-store is still copying it, or was stopped before it verified it): nothing "
            "may use it; once no copy runs, empty it and copy again"
        )


def judge_store_key(
    checks: Sequence[KeyCheck],
    cipher: KeyRingCipher | None,
    *,
    where: str,
    sample: Callable[[], Sequence[bytes]],
    readable: Callable[[bytes], bool],
    now: float,
) -> KeyCheck | None:
    """The check row to add before the store is used (None: none), or StoreKeyRefused
    naming `store.encryption_key_file`.

    `cipher`: the configured key ring (None: no key). `sample()`: stored event states
    to prove an old store's configuration on; `readable(state)`: whether this
    configuration reads one. Both are asked only when the store has no check yet."""
    if not checks:
        return _first_check(cipher, where=where, states=sample(), readable=readable, now=now)
    store = next((c for c in checks if c.check_id == STORE_CHECK), checks[0])
    if store.kind == PLAINTEXT:
        if cipher is not None:
            raise StoreKeyRefused(
                f"{SETTING} is set, but {where} was created without encryption: its events "
                "cannot be read with a key, nor what a key writes without it; remove the "
                "setting (a store is encrypted from its start)"
            )
        return None
    if cipher is None:
        raise StoreKeyRefused(
            f"{SETTING} is not set, but {where} is encrypted: set it to the store's key file"
        )
    opened = {cipher.key_index(c.value, CHECK_TEXT) for c in checks if c.kind == AES_256_GCM}
    opened.discard(None)
    if not opened:
        raise StoreKeyRefused(
            f"{SETTING}: no key in the file is a key of {where} (another store's key file, "
            "or a key that never encrypted it)"
        )
    if 0 not in opened:  # the first key changed: remember it as one of the store's
        return _encrypted(f"key-{uuid.uuid4().hex}", cipher, now)
    return None


def digest_secret(checks: Sequence[KeyCheck], cipher: KeyRingCipher | None) -> bytes | None:
    """What the job index's digests of addresses are keyed with on an encrypted store
    (`ledger.application.Ledger.mailbox_of`), None on a plain one. The store keeps it
    encrypted by each key that has been first in a ring (`DIGEST_SECRET` rows,
    `digest_check`), so that every daemon, before and after a rotation, and after the
    key that created the store has left the file, digests a mailbox alike. A store
    without such a row derives it from its oldest key in the ring (the one that created
    it, while it is kept), as earlier releases did."""
    if cipher is None:
        return None
    kept = sorted((c for c in checks if c.kind == DIGEST_SECRET), key=lambda c: c.created_at)
    for check in kept:
        opened = cipher.opened(check.value)
        if opened is not None:
            return opened[1]
    ordered = sorted(checks, key=lambda c: (c.check_id != STORE_CHECK, c.created_at))
    for check in ordered:
        if check.kind == AES_256_GCM:
            index = cipher.key_index(check.value, CHECK_TEXT)
            if index is not None:
                return hashlib.sha256(DIGEST_CONTEXT + cipher.key_at(index)).digest()
    return None


def digest_check(
    checks: Sequence[KeyCheck], cipher: KeyRingCipher | None, secret: bytes | None, now: float
) -> KeyCheck | None:
    """The `DIGEST_SECRET` row to add so that the ring's first key alone finds `secret`
    once the keys before it leave the file; None when one is there already (or the store
    is plain). Rows of kinds an earlier release does not know are ignored by it."""
    if cipher is None or secret is None:
        return None
    for check in checks:
        if check.kind == DIGEST_SECRET:
            opened = cipher.opened(check.value)
            if opened is not None and opened[0] == 0:
                return None
    return KeyCheck(f"digest-{uuid.uuid4().hex}", DIGEST_SECRET, cipher.encrypt(secret), now)


def _first_check(
    cipher: KeyRingCipher | None,
    *,
    where: str,
    states: Sequence[bytes],
    readable: Callable[[bytes], bool],
    now: float,
) -> KeyCheck:
    if not all(readable(state) for state in states):
        if cipher is None:
            raise StoreKeyRefused(
                f"{SETTING} is not set, but {where} holds events that cannot be read "
                "without a key: set it to the store's key file"
            )
        raise StoreKeyRefused(
            f"{SETTING}: the keys in the file cannot read the events of {where} (written "
            "with another key, or without one): give the file the store was written with"
        )
    if cipher is None:
        return KeyCheck(STORE_CHECK, PLAINTEXT, b"", now)
    return _encrypted(STORE_CHECK, cipher, now)


def _encrypted(check_id: str, cipher: KeyRingCipher, now: float) -> KeyCheck:
    return KeyCheck(check_id, AES_256_GCM, cipher.encrypt(CHECK_TEXT), now)


# -- in SQL ---------------------------------------------------------------------------------

CREATE_KEY_TABLE = (
    "CREATE TABLE IF NOT EXISTS {k} (check_id TEXT PRIMARY KEY, kind TEXT NOT NULL, "
    "value {blob} NOT NULL, created_at {real} NOT NULL)"
)


class SqlKeyChecks:
    """`KeyChecks` for the SQLite and PostgreSQL recorders. They supply `_transaction`
    and `_tuples` (as for `SqlJobIndex`), the placeholder `_p`, the (schema-qualified)
    `_key_table`, the column types and `_key_table_exists`."""

    _p = "?"
    _key_table = KEY_TABLE
    _blob = "BLOB"
    _real = "REAL"

    def _transaction(self, *, commit: bool) -> Any:
        raise NotImplementedError

    def _tuples(self, cursor: Any) -> list[tuple[Any, ...]]:
        raise NotImplementedError

    def _key_table_exists(self, cursor: Any) -> bool:
        raise NotImplementedError

    def key_checks(self) -> list[KeyCheck]:
        with self._transaction(commit=False) as cursor:
            if not self._key_table_exists(cursor):
                return []
            cursor.execute(f"SELECT check_id, kind, value, created_at FROM {self._key_table}")
            rows = self._tuples(cursor)
        return [KeyCheck(str(i), str(k), bytes(v), float(t)) for i, k, v, t in rows]

    def add_key_check(self, check: KeyCheck) -> None:
        create = CREATE_KEY_TABLE.format(k=self._key_table, blob=self._blob, real=self._real)
        marks = ", ".join([self._p] * 4)
        insert = (
            f"INSERT INTO {self._key_table} (check_id, kind, value, created_at) "
            f"VALUES ({marks}) ON CONFLICT (check_id) DO NOTHING"
        )
        with self._transaction(commit=True) as cursor:
            if not self._key_table_exists(cursor):
                cursor.execute(create)
            cursor.execute(insert, check.as_tuple())

    def remove_key_check(self, check_id: str) -> None:
        with self._transaction(commit=True) as cursor:
            if self._key_table_exists(cursor):
                delete = f"DELETE FROM {self._key_table} WHERE check_id = {self._p}"
                cursor.execute(delete, (check_id,))


__all__ = [
    "AES_256_GCM",
    "CHECK_TEXT",
    "COPY_FINISHED",
    "COPY_STARTED",
    "DIGEST_SECRET",
    "KEY_TABLE",
    "PLAINTEXT",
    "STORE_CHECK",
    "KeyCheck",
    "KeyChecks",
    "SqlKeyChecks",
    "StoreKeyRefused",
    "UnfinishedCopy",
    "digest_check",
    "digest_secret",
    "judge_store_key",
    "refuse_unfinished_copy",
    "unfinished_copy",
]

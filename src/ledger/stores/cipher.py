"""Encryption at rest for event state: eventsourcing's AES-GCM cipher with a key ring.

eventsourcing encrypts each event's state with one key (`CIPHER_KEY`). Keys must be
rotatable without rewriting an append-only history, so `KeyRingCipher`
(`ledger/stores/key_ring.py`) reads a list: the first key encrypts what is written from now
on, every key is tried when reading. The rotation procedure is in docs/configuration.md
("Encryption at rest").

The cipher (and so the `cryptography` package) is imported only for a store that has keys:
a plain store's command does without it.
"""

from __future__ import annotations

from base64 import b64decode
from collections.abc import Sequence

from ledger.exceptions import SendledgerError

#: Separates the keys of the ring in the `CIPHER_KEY` environment value.
KEY_SEPARATOR = " "
#: `ledger/stores/key_ring.py: KeyRingCipher` as eventsourcing names a class: it imports it
#: from the topic when the application opens, so this module (read by every store) does not
#: import the cipher and `cryptography` (tests/unit/test_store_key_checks.py holds the two
#: together).
KEY_RING_TOPIC = "ledger.stores.key_ring:KeyRingCipher"
#: `ledger/stores/key_ring.py: KeyRingMapper`, likewise: a stored event no key opens is
#: an error naming the setting.
KEY_RING_MAPPER_TOPIC = "ledger.stores.key_ring:KeyRingMapper"
#: AES-256 (docs/configuration.md "Encryption at rest"): the library would take 16 or 24 bytes too.
KEY_BYTES = 32


class EventKeyMissing(SendledgerError, ValueError):
    """No key of the file opens a stored event: the key it was written with left the file
    while its events are kept (rotation step 3 too early), or the event is damaged. A
    failure (exit 1, HTTP 500), but one that names the setting to fix
    (`ledger.stores.key_ring.KeyRingMapper`)."""

    def __init__(self, originator_id: object, version: int) -> None:
        super().__init__(
            f"store.encryption_key_file: no key in the file opens stored event {version} "
            f"of job id {originator_id} (written with a key since removed from the file, "
            "or damaged): put back the key it was written with, as a later line "
            '(docs/configuration.md "Key rotation")'
        )


def check_key(key: str) -> str:
    """The key, stripped; ValueError saying why when it is not an AES key."""
    text = key.strip()
    try:
        raw = b64decode(text.encode("ascii"), validate=True)
    except (ValueError, UnicodeEncodeError):
        raise ValueError("not a base64 key (make one with `sendledger admin new-key`)") from None
    if len(raw) != KEY_BYTES:
        raise ValueError(
            f"a key of {len(raw)} bytes: AES-256 needs {KEY_BYTES} "
            "(make one with `sendledger admin new-key`)"
        )
    return text


def new_key() -> str:
    """A fresh 256-bit key, base64."""
    from eventsourcing.cryptography import AESCipher

    return AESCipher.create_key(KEY_BYTES)


def cipher_env(keys: Sequence[str]) -> dict[str, str]:
    """The eventsourcing settings that encrypt (with the first key) and compress event
    state; no keys: none."""
    if not keys:
        return {}
    from eventsourcing.compressor import ZlibCompressor
    from eventsourcing.utils import get_topic

    return {
        "CIPHER_TOPIC": KEY_RING_TOPIC,
        "MAPPER_TOPIC": KEY_RING_MAPPER_TOPIC,
        "CIPHER_KEY": KEY_SEPARATOR.join(check_key(k) for k in keys),
        "COMPRESSOR_TOPIC": get_topic(ZlibCompressor),
    }


__all__ = [
    "KEY_BYTES",
    "KEY_RING_TOPIC",
    "KEY_SEPARATOR",
    "EventKeyMissing",
    "check_key",
    "cipher_env",
    "new_key",
]

"""Encryption at rest for event state: eventsourcing's AES-GCM cipher with a key ring.

eventsourcing encrypts each event's state with one key (`CIPHER_KEY`). Keys must be
rotatable without rewriting an append-only history, so `KeyRingCipher` reads a list: the
first key encrypts what is written from now on, every key is tried when reading. The
rotation procedure is in docs/configuration.md ("Encryption at rest").
"""

from __future__ import annotations

from base64 import b64decode
from collections.abc import Sequence

from cryptography.exceptions import InvalidTag
from eventsourcing.compressor import ZlibCompressor
from eventsourcing.cryptography import AESCipher
from eventsourcing.utils import Environment, get_topic

#: Separates the keys of the ring in the `CIPHER_KEY` environment value.
KEY_SEPARATOR = " "
#: AES-256 (docs/configuration.md "Encryption at rest"): the library would take 16 or 24 bytes too.
KEY_BYTES = 32


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
    return AESCipher.create_key(KEY_BYTES)


def cipher_env(keys: Sequence[str]) -> dict[str, str]:
    """The eventsourcing settings that encrypt (with the first key) and compress event
    state; no keys: none."""
    if not keys:
        return {}
    return {
        "CIPHER_TOPIC": get_topic(KeyRingCipher),
        "CIPHER_KEY": KEY_SEPARATOR.join(check_key(k) for k in keys),
        "COMPRESSOR_TOPIC": get_topic(ZlibCompressor),
    }


class KeyRingCipher(AESCipher):
    def __init__(self, environment: Environment) -> None:
        keys = (environment.get(self.CIPHER_KEY) or "").split(KEY_SEPARATOR)
        self._ring = []
        for key in filter(None, keys):
            single = Environment(environment.name, {self.CIPHER_KEY: key})
            self._ring.append(AESCipher(single))
        if not self._ring:
            raise OSError(f"'{self.CIPHER_KEY}' not in env")
        self.key = self._ring[0].key

    def key_index(self, ciphertext: bytes, plaintext: bytes) -> int | None:
        """The place in the ring of the key that encrypted `plaintext` into
        `ciphertext`, or None when no key of the ring did (`ledger.stores.keycheck`)."""
        for index, cipher in enumerate(self._ring):
            try:
                if cipher.decrypt(ciphertext) == plaintext:
                    return index
            except ValueError:
                continue
        return None

    def decrypt(self, ciphertext: bytes) -> bytes:
        # AES-GCM authenticates: a wrong key fails its tag check, it never yields garbage.
        for cipher in self._ring[:-1]:
            try:
                return cipher.decrypt(ciphertext)
            except ValueError as exc:
                if not isinstance(exc.__cause__, InvalidTag):
                    raise
        return self._ring[-1].decrypt(ciphertext)


__all__ = ["KEY_BYTES", "KeyRingCipher", "check_key", "cipher_env", "new_key"]

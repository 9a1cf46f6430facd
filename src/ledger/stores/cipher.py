"""Encryption at rest for event state: eventsourcing's AES-GCM cipher with a key ring.

eventsourcing encrypts each event's state with one key (`CIPHER_KEY`). Keys must be
rotatable without rewriting an append-only history, so `KeyRingCipher` reads a list: the
first key encrypts what is written from now on, every key is tried when reading. The
rotation procedure is in README ("Encryption at rest").
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


def check_key(key: str) -> str:
    """The key, stripped; ValueError saying why when it is not an AES key."""
    text = key.strip()
    try:
        raw = b64decode(text.encode("ascii"), validate=True)
    except (ValueError, UnicodeEncodeError):
        raise ValueError("not a base64 key (make one with `sendledger admin new-key`)") from None
    if len(raw) not in AESCipher.KEY_SIZES:
        raise ValueError(f"a key of {len(raw)} bytes (AES needs 16, 24 or 32)")
    return text


def new_key() -> str:
    """A fresh 256-bit key, base64."""
    return AESCipher.create_key(32)


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

    def decrypt(self, ciphertext: bytes) -> bytes:
        # AES-GCM authenticates: a wrong key fails its tag check, it never yields garbage.
        for cipher in self._ring[:-1]:
            try:
                return cipher.decrypt(ciphertext)
            except ValueError as exc:
                if not isinstance(exc.__cause__, InvalidTag):
                    raise
        return self._ring[-1].decrypt(ciphertext)


__all__ = ["KeyRingCipher", "check_key", "cipher_env", "new_key"]

"""`KeyRingCipher`: eventsourcing's AES-GCM cipher over a ring of keys, the first
encrypting, each tried when reading (`ledger/stores/cipher.py`, docs/configuration.md
"Encryption at rest")."""

from __future__ import annotations

from cryptography.exceptions import InvalidTag
from eventsourcing.cryptography import AESCipher
from eventsourcing.utils import Environment

from ledger.stores.cipher import KEY_SEPARATOR


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

    def key_at(self, index: int) -> bytes:
        """The key at `index` in the ring (`ledger.stores.keycheck.digest_secret`)."""
        key: bytes = self._ring[index].key
        return key

    def decrypt(self, ciphertext: bytes) -> bytes:
        # AES-GCM authenticates: a wrong key fails its tag check, it never yields garbage.
        for cipher in self._ring[:-1]:
            try:
                return cipher.decrypt(ciphertext)
            except ValueError as exc:
                if not isinstance(exc.__cause__, InvalidTag):
                    raise
        return self._ring[-1].decrypt(ciphertext)


__all__ = ["KeyRingCipher"]

"""`KeyRingCipher`: eventsourcing's AES-GCM cipher over a ring of keys, the first
encrypting, each tried when reading (`ledger/stores/cipher.py`, docs/configuration.md
"Encryption at rest")."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from cryptography.exceptions import InvalidTag
from eventsourcing.cryptography import AESCipher
from eventsourcing.persistence import Mapper, MapperDeserialisationError, StoredEvent
from eventsourcing.utils import Environment

from ledger.stores.cipher import KEY_SEPARATOR, EventKeyMissing


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

    def opened(self, ciphertext: bytes) -> tuple[int, bytes] | None:
        """The place in the ring of the key that opens `ciphertext`, and what it holds;
        None when no key of the ring does (`ledger.stores.keycheck.digest_secret`)."""
        for index, cipher in enumerate(self._ring):
            try:
                return index, cipher.decrypt(ciphertext)
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


class KeyRingMapper(Mapper[UUID]):
    """eventsourcing's mapper, for a store with keys: a stored event no key of the ring
    opens is `EventKeyMissing`, naming `store.encryption_key_file`, where the library
    says "Failed to deserialise state ...: Invalid cipher tag" (an operator who removed
    an old key too early must learn which setting to fix)."""

    def to_domain_event(self, stored_event: StoredEvent) -> Any:
        try:
            return super().to_domain_event(stored_event)
        except MapperDeserialisationError as exc:
            cause = exc.__cause__
            if isinstance(cause, ValueError) and isinstance(cause.__cause__, InvalidTag):
                raise EventKeyMissing(
                    stored_event.originator_id, stored_event.originator_version
                ) from exc
            raise


__all__ = ["KeyRingCipher", "KeyRingMapper"]

"""`judge_store_key` (`ledger.stores.keycheck`) for any key ring: a store opens with every
ring that holds one of its keys, wherever in the ring, and with no other; a new first key
is remembered once."""

from __future__ import annotations

import pytest
from eventsourcing.utils import Environment, get_topic, resolve_topic
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger.stores.cipher import KEY_RING_TOPIC, KEY_SEPARATOR, check_key, new_key
from ledger.stores.key_ring import KeyRingCipher
from ledger.stores.keycheck import (
    AES_256_GCM,
    PLAINTEXT,
    STORE_CHECK,
    KeyCheck,
    StoreKeyRefused,
    judge_store_key,
)

KEYS = [new_key() for _ in range(6)]


def ring(keys: list[str]) -> KeyRingCipher:
    return KeyRingCipher(Environment("t", {"CIPHER_KEY": KEY_SEPARATOR.join(keys)}))


def judge(checks: list[KeyCheck], keys: list[str] | None) -> KeyCheck | None:
    return judge_store_key(
        checks,
        ring(keys) if keys else None,
        where="the store",
        sample=lambda: [],
        readable=lambda state: True,
        now=0.0,
    )


def created_with(keys: list[str] | None) -> list[KeyCheck]:
    first = judge([], keys)
    assert first is not None and first.check_id == STORE_CHECK
    return [first]


@settings(deadline=None, max_examples=60)
@given(
    store_key=st.sampled_from(KEYS[:3]),
    others=st.lists(st.sampled_from(KEYS[3:]), max_size=3, unique=True),
    position=st.integers(min_value=0, max_value=3),
)
def test_any_ring_holding_the_stores_key_opens_it_and_no_other(
    store_key: str, others: list[str], position: int
) -> None:
    checks = created_with([store_key])
    keys = [*others]
    keys.insert(min(position, len(keys)), store_key)
    added = judge(checks, keys)
    # Only a ring whose first key is new to the store adds its check, and then opens
    # without adding another.
    assert (added is None) == (keys[0] == store_key)
    if added is not None:
        assert added.kind == AES_256_GCM and judge([*checks, added], keys) is None
        assert judge([*checks, added], [keys[0]]) is None  # the old key may leave the ring
    if others:
        with pytest.raises(StoreKeyRefused, match="no key in the file"):
            judge(checks, others)


def test_plain_and_encrypted_stores_refuse_the_other_configuration() -> None:
    plain = created_with(None)
    assert plain[0].kind == PLAINTEXT and judge(plain, None) is None
    with pytest.raises(StoreKeyRefused, match=r"^store\.encryption_key_file is set"):
        judge(plain, [KEYS[0]])
    with pytest.raises(StoreKeyRefused, match=r"^store\.encryption_key_file is not set"):
        judge(created_with([KEYS[0]]), None)


def test_an_old_store_is_refused_when_a_sampled_event_does_not_read() -> None:
    for keys in (None, [KEYS[0]]):
        with pytest.raises(StoreKeyRefused, match=r"store\.encryption_key_file"):
            judge_store_key(
                [],
                ring(keys) if keys else None,
                where="the store",
                sample=lambda: [b"first", b"last"],
                readable=lambda state: state == b"first",
                now=0.0,
            )


@pytest.mark.parametrize("size", [16, 24])
def test_keys_shorter_than_aes_256_are_refused(size: int) -> None:
    import base64
    import os

    with pytest.raises(ValueError, match=rf"a key of {size} bytes: AES-256 needs 32"):
        check_key(base64.b64encode(os.urandom(size)).decode())
    assert check_key(new_key()) and len(base64.b64decode(new_key())) == 32


def test_the_cipher_topic_names_the_key_ring() -> None:
    # cipher.py names the class by its topic so that a plain store never imports it (and
    # `cryptography`): a moved or renamed class must take the topic with it.
    assert get_topic(KeyRingCipher) == KEY_RING_TOPIC
    assert resolve_topic(KEY_RING_TOPIC) is KeyRingCipher

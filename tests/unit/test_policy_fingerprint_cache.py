"""The policy fingerprint is computed once per distinct policy, and never goes stale."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from tests.unit.engine_rig import policy

from policies.model import ChannelPolicy, _fingerprint


@given(st.integers(min_value=1, max_value=50), st.integers(min_value=1, max_value=50))
def test_equal_content_same_fingerprint_other_content_other(a: int, b: int) -> None:
    one = policy("receipts", max_attempts=a)
    again = policy("receipts", max_attempts=a)
    other = policy("receipts", max_attempts=b)
    assert one.fingerprint == again.fingerprint
    assert (one.fingerprint == other.fingerprint) == (a == b)


def test_a_copy_with_other_values_does_not_inherit_the_cached_fingerprint() -> None:
    base = policy("receipts", max_attempts=3)
    before = base.fingerprint
    changed = base.model_copy(update={"max_attempts": 4})
    assert changed.fingerprint != before
    assert changed.fingerprint == policy("receipts", max_attempts=4).fingerprint


def test_repeated_reads_hit_the_cache() -> None:
    fresh: ChannelPolicy = policy("cache-probe", max_attempts=7)
    _fingerprint.cache_clear()
    for _ in range(5):
        assert fresh.ref.fingerprint == fresh.fingerprint
    assert _fingerprint.cache_info().misses == 1

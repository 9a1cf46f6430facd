"""The shared parse of an address (`ledger/addresses.py`, docs/performance.md "Performance
and scaling"): the cached answer is the uncached one, and a refusal is never remembered as a
mailbox."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ledger import addresses
from ledger.addresses import AddressError, parse_mailbox

_uncached = addresses._parse_text.__wrapped__

_text = st.one_of(
    st.text(max_size=40),
    st.from_regex(r"[A-Za-z \"]{0,12}<[a-z.]{1,8}@[a-z]{1,6}\.[a-z]{2,3}>", fullmatch=True),
    st.from_regex(r"[a-z.+-]{1,10}@[a-zü-]{1,8}\.[a-z]{2,4}", fullmatch=True),
)


def _outcome(parse: object, value: str) -> object:
    try:
        return parse(value)  # type: ignore[operator]
    except AddressError as exc:
        return ("refused", str(exc))


@settings(deadline=None, max_examples=300)
@given(_text)
def test_cached_parse_answers_as_the_uncached_one(value: str) -> None:
    first = _outcome(parse_mailbox, value)
    assert first == _outcome(_uncached, value)
    assert _outcome(parse_mailbox, value) == first  # the second time: from the cache


def test_a_refusal_is_raised_every_time() -> None:
    for _ in range(2):
        with pytest.raises(AddressError):
            parse_mailbox("alice@exa mple.com")


def test_not_a_string_is_refused_before_the_cache() -> None:
    with pytest.raises(AddressError, match="non-empty"):
        parse_mailbox(["alice@example.com"])

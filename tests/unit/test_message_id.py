"""The Message-ID recipe, its domain validation, and Message-ID comparison."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ledger.message_id import (
    MessageIdError,
    message_id_for,
    normalize,
    same_message_id,
    validate_domain,
)


def expected(key: str, domain: str) -> str:
    return "<job-" + hashlib.sha256(key.encode("utf-8")).hexdigest()[:32] + "@" + domain + ">"


def test_known_vector() -> None:
    digest = hashlib.sha256(b"order-42").hexdigest()
    assert message_id_for("order-42", "mail.example.com") == (
        f"<job-{digest[:32]}@mail.example.com>"
    )
    # A literal: the recipe is part of the audit format and must never drift.
    assert message_id_for("order-42", "mail.example.com") == (
        "<job-3bf8b157c4238eefe5ae4a66eca81c6b@mail.example.com>"
    )


@given(
    key=st.text(min_size=1, max_size=200),
    domain=st.sampled_from(["mail.example.com", "localhost", "x-1.example.co.uk"]),
)
def test_matches_the_design_for_any_key(key: str, domain: str) -> None:
    assert message_id_for(key, domain) == expected(key, domain)


def test_unicode_key_is_hashed_as_utf8() -> None:
    key = "заказ-订单-🎉"
    assert message_id_for(key, "example.com") == expected(key, "example.com")


def test_depends_only_on_key_and_domain() -> None:
    assert message_id_for("k", "example.com") == message_id_for("k", "example.com")
    assert message_id_for("k", "example.com") != message_id_for("k2", "example.com")
    assert message_id_for("k", "example.com") != message_id_for("k", "example.org")


@pytest.mark.parametrize(
    "domain",
    [
        "",
        "-example.com",
        "example-.com",
        "exa mple.com",
        "example..com",
        ".example.com",
        "example.com.",
        "a@b.com",
        "<example.com>",
        "example.com>",
        "exämple.com",
        "example.com\r\nBcc: x@y.z",
        "a" * 64 + ".com",
        ".".join(["a" * 60] * 5),
        "exa_mple.com",
        "mail.example.com\n",  # `$` matched before a final line feed: a policy took it
    ],
)
def test_invalid_domains_are_refused(domain: str) -> None:
    with pytest.raises(MessageIdError, match="not a valid Message-ID domain"):
        message_id_for("k", domain)
    with pytest.raises(MessageIdError):
        validate_domain(domain)


@pytest.mark.parametrize(
    "domain", ["example.com", "mail.example.com", "localhost", "a" * 63 + ".com", "x1.io"]
)
def test_valid_domains(domain: str) -> None:
    assert validate_domain(domain) == domain
    assert message_id_for("k", domain).endswith(f"@{domain}>")


def test_normalize() -> None:
    assert normalize("<job-abc@Mail.Example.COM>") == ("job-abc", "mail.example.com")
    assert normalize("job-abc@mail.example.com") == ("job-abc", "mail.example.com")
    assert normalize("  < job-abc@mail.example.com >  ") == ("job-abc", "mail.example.com")
    assert normalize("") is None
    assert normalize("<>") is None
    assert normalize("no-at-sign") is None
    assert normalize("<@example.com>") is None
    assert normalize("<job-abc@>") is None


def test_same_message_id_brackets_optional_domain_case_insensitive() -> None:
    mid = message_id_for("order-42", "mail.example.com")
    assert same_message_id(mid, mid)
    assert same_message_id(mid, mid[1:-1])
    assert same_message_id(mid, mid.replace("mail.example.com", "MAIL.Example.Com"))
    assert same_message_id(f"  {mid}\t", mid)


def test_same_message_id_local_part_is_case_sensitive() -> None:
    mid = message_id_for("order-42", "mail.example.com")
    local = mid[1:].split("@")[0]
    assert not same_message_id(mid, mid.replace(local, local.upper()))
    assert not same_message_id("<Job-1@example.com>", "<job-1@example.com>")


def test_same_message_id_differs_for_other_jobs_and_garbage() -> None:
    a = message_id_for("a", "example.com")
    b = message_id_for("b", "example.com")
    assert not same_message_id(a, b)
    assert not same_message_id(a, "")
    assert not same_message_id("garbage", "garbage")  # not a Message-ID at all
    assert not same_message_id(a, a.replace("example.com", "example.org"))

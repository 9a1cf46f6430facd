"""Job input: validation (errors name the field), normalization, the content hash."""

from __future__ import annotations

from typing import Any

import pytest

from ledger.content import MAX_KEY_LENGTH, JobContent, JobInputError, parse_job


def job(**overrides: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "channel": "receipts",
        "key": "order-42",
        "to": "bob@example.com",
        "subject": "Your receipt",
        "body": "Thanks for your order.",
    }
    data.update(overrides)
    return {k: v for k, v in data.items() if v is not ...}


def refused(data: object, field: str, reason: str = "") -> JobInputError:
    with pytest.raises(JobInputError) as info:
        parse_job(data)
    assert info.value.field == field
    assert str(info.value).startswith(f"{field}: ")
    assert reason in info.value.reason
    return info.value


# -- fields -----------------------------------------------------------------------------


def test_minimal_job() -> None:
    content = parse_job(job())
    assert content == JobContent(
        channel="receipts",
        key="order-42",
        to=("bob@example.com",),
        subject="Your receipt",
        body="Thanks for your order.",
    )
    assert content.cc == () and content.reply_to is None and content.html is None


def test_every_optional_field() -> None:
    content = parse_job(
        job(
            to=["Bob <bob@example.com>", "carol@example.com"],
            cc=["dave@example.com"],
            reply_to="Help <help@example.com>",
            html="<p>Thanks</p>",
        )
    )
    assert content.to == ("Bob <bob@example.com>", "carol@example.com")
    assert content.cc == ("dave@example.com",)
    assert content.reply_to == "Help <help@example.com>"
    assert content.html == "<p>Thanks</p>"


def test_to_as_string_or_list_is_the_same_job() -> None:
    one = parse_job(job(to="bob@example.com"))
    listed = parse_job(job(to=["bob@example.com"]))
    assert one == listed
    assert one.content_hash == listed.content_hash


def test_cc_as_a_string() -> None:
    assert parse_job(job(cc="dave@example.com")).cc == ("dave@example.com",)


def test_null_optional_fields_are_absent() -> None:
    assert parse_job(job(cc=None, reply_to=None, html=None)) == parse_job(job())


@pytest.mark.parametrize("field", ["channel", "key", "to", "subject", "body"])
def test_required_fields(field: str) -> None:
    refused(job(**{field: ...}), field, "is required")


def test_unknown_field_is_named() -> None:
    refused(job(attachment="x"), "attachment", "unknown field")
    refused(job(priority=1, attachment="x"), "attachment", "unknown field")  # first, sorted


@pytest.mark.parametrize("data", [[], "job", None, 42])
def test_not_an_object(data: object) -> None:
    refused(data, "job", "must be a JSON object")


@pytest.mark.parametrize(
    ("field", "value", "reason"),
    [
        ("channel", "", "must not be empty"),
        ("channel", 1, "must be a string"),
        ("key", "   ", "must not be empty"),
        ("key", "k" * (MAX_KEY_LENGTH + 1), "longer than"),
        ("key", None, "must be a string"),
        ("subject", ["a"], "must be a string"),
        ("body", None, "must be a string"),
        ("body", "a\x00b", "NUL"),
        ("html", 3, "must be a string"),
        ("to", [], "needs at least one address"),
        ("to", 42, "must be an address or a list"),
        ("cc", {"a": 1}, "must be an address or a list"),
        ("reply_to", ["help@example.com"], "must be one address"),
    ],
)
def test_bad_values_name_their_field(field: str, value: object, reason: str) -> None:
    refused(job(**{field: value}), field, reason)


def test_key_at_the_length_limit_is_fine() -> None:
    assert parse_job(job(key="k" * MAX_KEY_LENGTH)).key == "k" * MAX_KEY_LENGTH
    two_bytes = "ж" * MAX_KEY_LENGTH  # 2000 bytes in UTF-8
    assert parse_job(job(key=two_bytes)).key == two_bytes


@pytest.mark.parametrize("char", ["注", "\U00020000", "😀"])  # 3 and 4 bytes in UTF-8
def test_a_key_too_long_for_the_store_s_index_is_refused_naming_key(char: str) -> None:
    # 1000 such characters passed the length rule, and PostgreSQL then refused the index
    # row ("index row size 4016 exceeds btree version 4 maximum 2704"): a 500 to the API,
    # "unexpected failure" to `submit`, each retry of the client failing alike.
    refused(job(key=char * MAX_KEY_LENGTH), "key", "bytes")
    fits = char * (2500 // len(char.encode("utf-8")))
    assert parse_job(job(key=fits)).key == fits


def test_non_string_list_item_is_named() -> None:
    refused(job(to=["bob@example.com", 7]), "to[1]", "must be a string")


# -- header injection -------------------------------------------------------------------


@pytest.mark.parametrize("field", ["subject", "channel", "key"])
@pytest.mark.parametrize("brk", ["\r", "\n", "\r\n"])
def test_line_breaks_in_header_fields_are_refused(field: str, brk: str) -> None:
    refused(job(**{field: f"hello{brk}Bcc: eve@example.com"}), field, "CR or LF")


@pytest.mark.parametrize("brk", ["\r", "\n", "\r\n"])
def test_line_breaks_in_addresses_are_refused(brk: str) -> None:
    evil = f"bob@example.com{brk}Bcc: eve@example.com"
    refused(job(to=evil), "to", "CR or LF")
    refused(job(to=["ok@example.com", evil]), "to[1]", "CR or LF")
    refused(job(cc=[evil]), "cc[0]", "CR or LF")
    refused(job(reply_to=evil), "reply_to", "CR or LF")


def test_line_breaks_in_the_body_are_fine() -> None:
    body = "line one\r\nline two\n"
    assert parse_job(job(body=body, html="<p>\n</p>")).body == body


# -- addresses --------------------------------------------------------------------------


BAD_ADDRESSES = [
    "not an address",
    "a@",
    "@b.c",
    "a@b",
    "a@b.c, d@e.f",
    "a@b.c d@e.f",
    "a@b.c <d@e.f>",
    "Bob bob@example.com",
    "a b@c.de",
    "a..b@c.de",
    "",
    "   ",
    "<>",
]


@pytest.mark.parametrize("address", BAD_ADDRESSES)
def test_unparseable_addresses_are_refused_naming_the_field(address: str) -> None:
    refused(job(to=["ok@example.com", address]), "to[1]")
    refused(job(to=address), "to")
    refused(job(cc=[address]), "cc[0]")
    refused(job(reply_to=address), "reply_to")


@pytest.mark.parametrize("address", ["a@b..c", "a@.b.c", "a@b.c."])
def test_empty_domain_labels_are_refused_as_job_input(address: str) -> None:
    try:
        parse_job(job(to=[address]))
    except JobInputError as exc:
        assert exc.field == "to[0]"
    except Exception as exc:
        raise AssertionError(f"{type(exc).__name__} escaped: {exc}") from exc
    else:
        raise AssertionError("accepted")


@pytest.mark.parametrize(
    ("given", "canonical"),
    [
        (" Bob <bob@example.com>", "Bob <bob@example.com>"),
        ("Bob   <bob@example.com> ", "Bob <bob@example.com>"),
        ("<bob@example.com>", "bob@example.com"),
        ("  bob@example.com", "bob@example.com"),
        ('"Doe, John" <john@example.com>', '"Doe, John" <john@example.com>'),
        ("José <jose@example.com>", "José <jose@example.com>"),
    ],
)
def test_addresses_are_canonical(given: str, canonical: str) -> None:
    assert parse_job(job(to=given)).to == (canonical,)
    assert parse_job(job(to=[given])).to == (canonical,)
    assert parse_job(job(reply_to=given)).reply_to == canonical


def test_canonical_addresses_give_the_same_hash() -> None:
    a = parse_job(job(to=" Bob <bob@example.com>", cc=["<carol@example.com>"]))
    b = parse_job(job(to=["Bob <bob@example.com>"], cc="carol@example.com"))
    assert a == b
    assert a.content_hash == b.content_hash


# -- content hash -----------------------------------------------------------------------


FULL = job(
    to=["bob@example.com"],
    cc=["carol@example.com"],
    reply_to="help@example.com",
    html="<p>Thanks</p>",
)


def test_hash_format_and_stability() -> None:
    digest = parse_job(FULL).content_hash
    assert digest.startswith("sha256:")
    assert len(digest) == len("sha256:") + 64
    assert parse_job(dict(FULL)).content_hash == digest


def test_hash_independent_of_key_order() -> None:
    reordered = dict(reversed(list(FULL.items())))
    assert list(reordered) != list(FULL)
    assert parse_job(reordered).content_hash == parse_job(FULL).content_hash


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("channel", "other"),
        ("key", "order-43"),
        ("to", ["dave@example.com"]),
        ("to", ["bob@example.com", "dave@example.com"]),
        ("to", ["Bob <bob@example.com>"]),
        ("cc", []),
        ("cc", ["dave@example.com"]),
        ("reply_to", None),
        ("reply_to", "other@example.com"),
        ("subject", "Your receipt!"),
        ("body", "Thanks for your order"),
        ("body", "Thanks for your order.\n"),
        ("html", None),
        ("html", "<p>Thanks!</p>"),
    ],
)
def test_hash_changes_with_any_field(field: str, value: object) -> None:
    changed = {**FULL, field: value}
    assert parse_job(changed).content_hash != parse_job(FULL).content_hash


def test_hash_distinguishes_empty_html_from_none() -> None:
    assert parse_job(job(html="")).content_hash != parse_job(job()).content_hash


def test_hash_does_not_confuse_recipient_order() -> None:
    a = parse_job(job(to=["a@example.com", "b@example.com"]))
    b = parse_job(job(to=["b@example.com", "a@example.com"]))
    assert a.content_hash != b.content_hash


def test_hash_of_unicode_content() -> None:
    a = parse_job(job(subject="订单已发货 🎉", body="Ваш заказ"))
    b = parse_job(job(subject="订单已发货 🎉", body="Ваш заказ"))
    assert a.content_hash == b.content_hash
    assert a.content_hash != parse_job(job(subject="订单已发货", body="Ваш заказ")).content_hash

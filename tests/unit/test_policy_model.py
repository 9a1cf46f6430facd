"""ChannelPolicy: every field's validation, durations, defaults and the fingerprint."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from pydantic import ValidationError

from policies.loader import PolicyLoadError, load_policy_dir
from policies.model import ChannelPolicy, parse_from_address
from policies.senders import pattern_problem

BASE: dict[str, Any] = {
    "channel": "receipts",
    "provider": "support",
    "from": "Support <support@example.com>",
    "message_id_domain": "mail.example.com",
}


def make(**overrides: Any) -> ChannelPolicy:
    data = dict(BASE)
    for key, value in overrides.items():
        data["from" if key == "from_" else key] = value
    return ChannelPolicy.model_validate(data)


def refused(field: str, **overrides: Any) -> str:
    """Validate, expect a refusal on exactly ``field``; return its message."""
    with pytest.raises(ValidationError) as info:
        make(**overrides)
    errors = info.value.errors()
    fields = [".".join(str(p) for p in e["loc"]) for e in errors]
    assert fields == [field], errors
    return str(errors[0]["msg"])


# -- defaults and the minimal policy ------------------------------------------------------


def test_minimal_policy_has_the_documented_defaults() -> None:
    p = make()
    assert p.name == "receipts"
    assert p.on_unknown == "search-then-review"
    assert p.irreversible is False
    assert p.search_after == 300.0
    assert p.search_interval == 300.0
    assert p.effective_search_interval == 300.0
    assert p.confirm_misses == 2
    assert p.max_attempts == 3
    assert p.retry_backoff == 30.0
    assert p.retry_backoff_max == 3600.0
    assert p.from_address == "support@example.com"


def test_the_design_example_validates() -> None:
    p = make(
        on_unknown="retry",
        irreversible=False,
        search_after="5m",
        search_interval="5m",
        confirm_misses=2,
        max_attempts=3,
        retry_backoff="30s",
        retry_backoff_max="1h",
    )
    assert (p.search_after, p.search_interval, p.retry_backoff, p.retry_backoff_max) == (
        300.0,
        300.0,
        30.0,
        3600.0,
    )


def test_search_interval_defaults_to_search_after() -> None:
    p = make(search_after="50ms")
    assert p.search_interval == pytest.approx(0.05)
    assert p.effective_search_interval == pytest.approx(0.05)


def test_explicit_search_interval_is_kept() -> None:
    p = make(search_after="5m", search_interval="1m")
    assert p.search_interval == 60.0
    assert p.effective_search_interval == 60.0


def test_from_can_be_given_by_field_name_too() -> None:
    p = ChannelPolicy(
        channel="c",
        provider="p",
        from_="a@example.com",  # type: ignore[call-arg]
        message_id_domain="example.com",
    )
    assert p.from_address == "a@example.com"


def test_policy_is_frozen() -> None:
    p = make()
    with pytest.raises(ValidationError):
        p.max_attempts = 5


# -- durations ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("written", "seconds"),
    [
        ("1ms", 0.001),
        ("50ms", 0.05),
        ("250ms", 0.25),
        ("30s", 30.0),
        ("1.5s", 1.5),
        ("5m", 300.0),
        ("1h", 3600.0),
        ("1d", 86400.0),
        ("45", 45.0),
        (45, 45.0),
        (0.5, 0.5),
        (" 2m ", 120.0),
    ],
)
@pytest.mark.parametrize(
    "field", ["search_after", "search_interval", "retry_backoff", "retry_backoff_max"]
)
def test_duration_forms(field: str, written: object, seconds: float) -> None:
    extra: dict[str, Any] = {field: written}
    if field == "retry_backoff_max":
        extra["retry_backoff"] = "1ms"
    if field == "retry_backoff":
        extra["retry_backoff_max"] = "7d"
    p = make(**extra)
    assert getattr(p, field) == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("written", "needle"),
    [
        (0, "at least 1ms"),
        ("0s", "at least 1ms"),
        ("0ms", "at least 1ms"),
        (0.0001, "at least 1ms"),
        (-1, ">= 0"),
        ("-5s", "not a duration"),
        ("5 minutes", "not a duration"),
        ("", "not a duration"),
        ("1e3", "not a duration"),
        ("\u0663d", "not a duration"),  # ARABIC-INDIC DIGIT THREE: float() reads 3
        ("\uff13\uff10s", "not a duration"),  # fullwidth 30
        ("\u00a030s", "not a duration"),
        # As TOML spells it, and what to write instead.
        (True, "not a duration: true (use e.g. 250ms, 30s, 5m, 1h, 1d or seconds)"),
        (False, "not a duration: false (use e.g. 250ms"),
        ([5], "not a duration: [5] (use e.g. 250ms"),
        (float("inf"), ">= 0"),
        (float("nan"), ">= 0"),
        ("400d", "at most "),
        (10**12, "at most "),
    ],
)
@pytest.mark.parametrize(
    "field", ["search_after", "search_interval", "retry_backoff", "retry_backoff_max"]
)
def test_bad_durations_are_refused_naming_the_field(
    field: str, written: object, needle: str
) -> None:
    message = refused(field, **{field: written})
    assert needle in message


# -- on_unknown and irreversible -----------------------------------------------------------


@pytest.mark.parametrize("mode", ["retry", "search-then-review", "review"])
def test_on_unknown_modes(mode: str) -> None:
    assert make(on_unknown=mode).on_unknown == mode


@pytest.mark.parametrize("mode", ["Retry", "resend", "", "search_then_review", 1, None])
def test_unknown_on_unknown_refused(mode: object) -> None:
    refused("on_unknown", on_unknown=mode)


def test_irreversible_with_retry_is_refused() -> None:
    message = refused("on_unknown", on_unknown="retry", irreversible=True)
    assert "irreversible channels never resend without a human" in message


def test_history_after_must_be_shorter_than_search_after() -> None:
    """docs/policies.md "Believing the history": it replaces the index wait with a shorter
    one; as long or longer is a typo, refused naming the field."""
    message = refused("history_after", search_after="1m", history_after="1m")
    assert "must be shorter than search_after (1m), got 1m" in message
    assert make(search_after="1m", history_after="10s").history_after == 10.0
    assert make().history_after is None


@pytest.mark.parametrize("mode", ["search-then-review", "review"])
def test_irreversible_with_review_modes_is_fine(mode: str) -> None:
    p = make(on_unknown=mode, irreversible=True)
    assert p.irreversible is True


@pytest.mark.parametrize("value", ["true", 1, 0, "yes", None])
def test_irreversible_must_be_a_bool(value: object) -> None:
    refused("irreversible", irreversible=value)


# -- integers --------------------------------------------------------------------------------


@pytest.mark.parametrize("field", ["confirm_misses", "max_attempts"])
@pytest.mark.parametrize("value", [0, -1, True, False, 2.0, "2", None])
def test_counts_are_strict_positive_ints(field: str, value: object) -> None:
    refused(field, **{field: value})


@pytest.mark.parametrize("field", ["confirm_misses", "max_attempts"])
def test_counts_accept_one_and_more(field: str) -> None:
    assert getattr(make(**{field: 1}), field) == 1
    assert getattr(make(**{field: 10}), field) == 10


# -- backoff ---------------------------------------------------------------------------------


def test_backoff_longer_than_its_maximum_is_refused() -> None:
    message = refused("retry_backoff_max", retry_backoff="2h", retry_backoff_max="1h")
    assert "retry_backoff" in message


def test_backoff_longer_than_the_default_maximum_is_refused() -> None:
    refused("retry_backoff_max", retry_backoff="2h")


def test_backoff_equal_to_maximum_is_fine() -> None:
    p = make(retry_backoff="1m", retry_backoff_max="60")
    assert p.retry_backoff == p.retry_backoff_max == 60.0


# -- channel ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["receipts", "a", "order.confirm", "A-b_c.9", "x" * 128])
def test_channel_names_accepted(name: str) -> None:
    assert make(channel=name).name == name


@pytest.mark.parametrize(
    "name", ["", "with space", "a/b", "ü", "a:b", "x" * 129, "tab\t", "new\nline"]
)
def test_channel_names_refused(name: str) -> None:
    refused("channel", channel=name)


CHANNEL_TEXT = st.text(st.sampled_from("Rr9._-\n\r\t /:\u00fc"), max_size=8)


@given(CHANNEL_TEXT)
@example("receipts\n")
def test_a_channel_is_accepted_only_when_every_character_is_one_the_message_names(
    name: str,
) -> None:
    # `^...$` with `.match` let a final line feed through ("receipts\n"): a channel
    # no job can name, and a label, log line and payload with a line break in it.
    allowed = re.fullmatch(r"[A-Za-z0-9._-]{1,128}", name) is not None
    assert is_refused("channel", name) is not allowed, repr(name)


@given(st.text(st.sampled_from("ab*?@.-\n\r\t "), max_size=10))
@example("*@example.com\n")
def test_an_allowed_from_pattern_is_accepted_only_whole(pattern: str) -> None:
    allowed = re.fullmatch(r"[A-Za-z0-9.*?-]+@[A-Za-z0-9.*?-]+", pattern) is not None
    assert (pattern_problem(pattern) is None) is allowed, repr(pattern)


@pytest.mark.parametrize("value", [1, None, ["receipts"]])
def test_channel_must_be_a_string(value: object) -> None:
    refused("channel", channel=value)


def test_channel_is_required() -> None:
    data = dict(BASE)
    del data["channel"]
    with pytest.raises(ValidationError) as info:
        ChannelPolicy.model_validate(data)
    assert [e["loc"] for e in info.value.errors()] == [("channel",)]


# -- provider ----------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["", "  ", " support", 5, None])
def test_provider_refused(value: object) -> None:
    refused("provider", provider=value)


# -- from --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "bare"),
    [
        ("support@example.com", "support@example.com"),
        ("<support@example.com>", "support@example.com"),
        ("Support <support@example.com>", "support@example.com"),
        ('"Support, Team" <team@example.com>', "team@example.com"),
        ("Zoë Support <zoe@example.com>", "zoe@example.com"),
        ("J. Smith <j@example.com>", "j@example.com"),
        ("  a.b+tag@mail.example.com  ", "a.b+tag@mail.example.com"),
    ],
)
def test_from_accepted(value: str, bare: str) -> None:
    assert make(from_=value).from_address == bare


@pytest.mark.parametrize(
    "value",
    [
        "",
        "   ",
        "Support",
        "support@",
        "@example.com",
        "a@b.com, c@d.com",
        "Group: a@b.com;",
        "Support <support@example.com",
        "support@example.com garbage",
        "a@b@c.com",
        "a@[127.0.0.1]",
        "a@-bad-.com",
        "zoë@example.com",
        "Support <support@example.com>\r\nBcc: victim@example.com",
        "support@example.com\n",
        "support@example.com\rX",
    ],
)
def test_from_refused(value: str) -> None:
    refused("from", from_=value)


def test_from_refusal_names_crlf() -> None:
    assert "CR or LF" in refused("from", from_="a@example.com\r\nBcc: x@example.com")


def test_from_must_be_a_string() -> None:
    refused("from", from_=["a@example.com"])


def test_parse_from_address_returns_parts() -> None:
    address = parse_from_address("Support <support@example.com>")
    assert (address.display_name, address.username, address.domain) == (
        "Support",
        "support",
        "example.com",
    )


# -- message_id_domain ------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["example.com", "mail.example.com", "localhost", "a-b.c9.io"])
def test_message_id_domain_accepted(value: str) -> None:
    assert make(message_id_domain=value).message_id_domain == value


@pytest.mark.parametrize(
    "value", ["", "exa mple.com", "<x>", "a@b.com", "-a.com", "a..com", "ü.com", "a.com\r\n"]
)
def test_message_id_domain_refused(value: str) -> None:
    refused("message_id_domain", message_id_domain=value)


# -- unknown keys --------------------------------------------------------------------------


def test_unknown_keys_are_refused() -> None:
    with pytest.raises(ValidationError) as info:
        make(serch_after="5m")
    assert [e["loc"] for e in info.value.errors()] == [("serch_after",)]


def test_several_problems_are_all_reported() -> None:
    with pytest.raises(ValidationError) as info:
        make(max_attempts=0, confirm_misses=0, search_after="soon", from_="nobody")
    fields = sorted(".".join(map(str, e["loc"])) for e in info.value.errors())
    assert fields == ["confirm_misses", "from", "max_attempts", "search_after"]


# -- fingerprint ----------------------------------------------------------------------------


def test_fingerprint_is_16_hex() -> None:
    fp = make().fingerprint
    assert len(fp) == 16
    int(fp, 16)


def test_fingerprint_is_stable_across_spellings() -> None:
    a = make(search_after="5m", retry_backoff="30s", retry_backoff_max="1h")
    b = make(search_after=300, retry_backoff=30.0, retry_backoff_max="60m")
    c = make(search_after="300s", search_interval="5m")
    d = make(from_="Support  <support@example.com>  ")
    base = make()
    assert a.fingerprint == b.fingerprint == c.fingerprint == d.fingerprint == base.fingerprint


def test_fingerprint_independent_of_key_order() -> None:
    forward = ChannelPolicy.model_validate(dict(BASE))
    backward = ChannelPolicy.model_validate(dict(reversed(list(BASE.items()))))
    assert forward.fingerprint == backward.fingerprint


@pytest.mark.parametrize(
    "change",
    [
        {"channel": "receipts2"},
        {"provider": "other"},
        {"from": "Other <support@example.com>"},
        {"from": "support2@example.com"},
        {"message_id_domain": "example.com"},
        {"on_unknown": "retry"},
        {"on_unknown": "review"},
        {"irreversible": True},
        {"search_after": "301s"},
        {"search_interval": "1m"},
        {"confirm_misses": 3},
        {"max_attempts": 4},
        {"retry_backoff": "31s"},
        {"retry_backoff_max": "2h"},
    ],
)
def test_fingerprint_changes_with_any_value(change: dict[str, Any]) -> None:
    assert make(**change).fingerprint != make().fingerprint


def test_fingerprints_of_many_variants_are_distinct() -> None:
    variants = [make(max_attempts=n, confirm_misses=m) for n in range(1, 8) for m in range(1, 8)]
    assert len({v.fingerprint for v in variants}) == len(variants)


# -- refusals and sizes docs/policies.md quotes --------------------------------------------


#: What a policy needs besides the field under test.
QUOTED_REQUIRED = {
    "channel": "receipts",
    "provider": "support",
    "from": "Support <support@example.com>",
    "message_id_domain": "mail.example.com",
}


def validated(**values: object) -> ChannelPolicy:
    return ChannelPolicy.model_validate({**QUOTED_REQUIRED, **values})


def is_refused(field: str, value: object, **more: object) -> bool:
    try:
        validated(**more, **{field: value})
    except ValidationError as exc:
        return any(e["loc"][:1] == (field,) for e in exc.errors())
    return False


def test_the_quoted_refusals_are_the_loaders(tmp_path: Path) -> None:
    base = "".join(f'{k} = "{v}"\n' for k, v in QUOTED_REQUIRED.items() if k != "channel")
    (tmp_path / "receipts.toml").write_text(base + 'search_after = "30d"\n', encoding="utf-8")
    with pytest.raises(PolicyLoadError) as caught:
        load_policy_dir(tmp_path)
    assert str(caught.value).endswith("receipts.toml:search_after: must be at most 7d, got '30d'")
    assert is_refused("retry_backoff_max", "1m", retry_backoff="2m")
    assert is_refused("on_unknown", "retry", irreversible=True)
    assert is_refused("allowed_from", [f"a{i}@example.com" for i in range(1001)])
    assert is_refused("channel", "c" * 129) and not is_refused("channel", "c" * 128)
    # allowed_from: LOCAL@DOMAIN of address characters, * and ?; no character classes.
    for pattern in ("[ab]*@example.com", "support", "sup port@example.com", ""):
        assert is_refused("allowed_from", [pattern]), pattern
    assert not is_refused("allowed_from", ["*@example.com", "sales-?@*.example.com"])

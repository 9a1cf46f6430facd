"""Issue 16, "Config and files": every duration and size has an upper bound, URLs and the
listen address parse, and the files sendledger reads are regular files (docs/configuration.md
"Configuration", bounds and files; "Policies", bounds)."""

from __future__ import annotations

import os
import threading
import tomllib
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.unit.test_policy_loader import GOOD

from daemon.cli.init_command import Emulated, config_text
from daemon.config.secret_text import MAX_SECRET_BYTES, read_secret_text
from daemon.config.settings import (
    CENTURY,
    DAY,
    HOUR,
    ConfigError,
    load_settings,
    parse_listen,
    settings_from_dict,
)
from daemon.config.sizes import MAX_SIZE, parse_size
from ledger.addresses import parse_mailbox
from policies.durations import DurationError, parse_duration, parse_duration_with_unit
from policies.files import FileProblem, read_regular_file
from policies.loader import PolicyLoadError, load_policy_dir, load_policy_dir_partial
from policies.model import MAX_DURATIONS, ChannelPolicy


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("SENDLEDGER_"):
            monkeypatch.delenv(name)


def gmail(**values: Any) -> dict[str, Any]:
    return {"providers": {"g": {"credentials_file": "sa.json", **values}}}


def smtp(**values: Any) -> dict[str, Any]:
    base = {
        "kind": "smtp-imap",
        "smtp_host": "smtp.example.com",
        "imap_host": "imap.example.com",
        "username": "u@example.com",
        "password_file": "pw",
    }
    return {"providers": {"m": {**base, **values}}}


def refused(data: dict[str, Any], where: str, *needles: str) -> str:
    with pytest.raises(ConfigError) as info:
        settings_from_dict(data)
    message = str(info.value)
    assert f": {where}: " in message, message
    assert "\n" not in message
    for needle in needles:
        assert needle in message, message
    return message


# -- durations --------------------------------------------------------------------------


def seconds_with_unit(value: object) -> object:
    """`value` seconds written with their unit, as `retention.purge_after` needs them; a
    string as it is. Every digit of a float (no exponent), so it loads as the same float."""
    return value if isinstance(value, str) else f"{Decimal(value):f}s"  # type: ignore[arg-type]


#: (where, the data that sets it, its bound)
DURATIONS: list[tuple[str, Callable[[float], dict[str, Any]], float]] = [
    ("daemon.tick", lambda v: {"daemon": {"tick": v}}, HOUR),
    ("daemon.deadline_grace", lambda v: {"daemon": {"deadline_grace": v}}, DAY),
    ("daemon.status_interval", lambda v: {"daemon": {"status_interval": v}}, HOUR),
    ("providers.g.timeout", lambda v: gmail(timeout=v), HOUR),
    ("providers.m.timeout", lambda v: smtp(timeout=v), HOUR),
    (
        "retention.purge_after",
        lambda v: {"retention": {"purge_after": seconds_with_unit(v)}},
        CENTURY,
    ),
    ("retention.every", lambda v: {"retention": {"every": v}}, 366 * DAY),
]


@pytest.mark.parametrize(("where", "make", "bound"), DURATIONS)
@pytest.mark.parametrize("value", [1e300, "99999999999999d", float("inf"), 10**30, "1e3"])
def test_a_duration_past_its_bound_is_refused_at_load(
    where: str, make: Any, bound: float, value: object
) -> None:
    refused(make(value), where)


@pytest.mark.parametrize(("where", "make", "bound"), DURATIONS)
def test_a_duration_at_its_bound_is_accepted(where: str, make: Any, bound: float) -> None:
    loaded = settings_from_dict(make(bound))
    section, *rest = where.split(".")
    value: Any = getattr(loaded, section)
    for part in rest:
        value = value[part] if isinstance(value, dict) else getattr(value, part)
    assert value == bound
    refused(make(bound + 1), where, "expected")


def test_the_example_values_of_the_issue_are_refused_naming_the_key() -> None:
    refused({"daemon": {"tick": 1e300}}, "daemon.tick", "from 1ms to 1h")
    refused(gmail(timeout=1e300), "providers.g.timeout", "to 1h")
    refused({"daemon": {"deadline_grace": 1e300}}, "daemon.deadline_grace", "to 1d")
    refused({"retention": {"purge_after": "99999999999999d"}}, "retention.purge_after", "36525d")
    refused({"daemon": {"tick": 0}}, "daemon.tick", "from 1ms")


@pytest.mark.parametrize("value", [90, 90.0, "90", " 90 ", "7776000"])
def test_a_purge_after_without_its_unit_is_refused_naming_the_unit_to_write(
    value: object,
) -> None:
    # A bare number is seconds: "90" (days in mind) purged every job settled 90 s ago.
    refused({"retention": {"purge_after": value}}, "retention.purge_after", "has no unit", "d for")
    assert settings_from_dict({"retention": {"purge_after": "90d"}}).retention.purge_after == (
        90 * DAY
    )


@settings(deadline=None, max_examples=200)
@given(seconds=st.floats(min_value=0, max_value=1e20, allow_nan=False))
def test_duration_bounds_hold_for_any_value(seconds: float) -> None:
    for where, make, bound in DURATIONS:
        low = 0.0 if where in ("daemon.deadline_grace", "retention.purge_after") else 0.001
        try:
            loaded = settings_from_dict(make(seconds))
        except ConfigError as exc:
            assert where in str(exc)
            assert not low <= seconds <= bound
        else:
            assert low <= seconds <= bound
            assert loaded is not None


@settings(deadline=None, max_examples=200)
@given(
    field=st.sampled_from(sorted(MAX_DURATIONS)),
    seconds=st.floats(min_value=0.001, max_value=1e15, allow_nan=False),
)
def test_policy_duration_bounds_hold_for_any_value(field: str, seconds: float) -> None:
    data = {
        "channel": "c",
        "provider": "p",
        "from": "a@example.com",
        "message_id_domain": "mail.example.com",
        field: seconds,
    }
    if field == "retry_backoff":
        data["retry_backoff_max"] = seconds
    if field == "retry_backoff_max":
        data["retry_backoff"] = 0.001
    if field == "history_after":
        data["search_after"] = MAX_DURATIONS["search_after"]  # it must be the shorter
    try:
        policy = ChannelPolicy.model_validate(data)
    except ValueError as exc:
        assert field in str(exc)
        assert seconds > MAX_DURATIONS[field]
    else:
        assert getattr(policy, field) == seconds <= MAX_DURATIONS[field]


@pytest.mark.parametrize(
    ("field", "value"),
    [("confirm_misses", 101), ("max_attempts", 1001), ("search_after", "8d"),
     ("verify_after", "31d"), ("retry_backoff", "2d")],
)  # fmt: skip
def test_policy_counts_and_durations_have_maxima(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        ChannelPolicy.model_validate(
            {"channel": "c", "provider": "p", "from": "a@example.com",
             "message_id_domain": "mail.example.com", field: value}
        )  # fmt: skip


# -- integers TOML does not have --------------------------------------------------------

#: TOML's integers are 64-bit; tomllib reads any number of digits: one past the range, one
#: past a float's (float() raised OverflowError), one past the digits int() reads from text
#: (tomllib raised a ValueError that is no TOMLDecodeError), and one in hex that int()
#: reads whatever its length but that has more decimal digits than str() writes.
HUGE = ["9223372036854775808", "-9223372036854775809", "1" + "0" * 400, "1" + "0" * 5000,
        "0x" + "f" * 4000]  # fmt: skip


@pytest.mark.parametrize("number", HUGE)
@pytest.mark.parametrize("where", ["[daemon]\ntick", "[api]\nmax_body"])
def test_an_integer_past_64_bits_in_the_config_is_refused_naming_the_file(
    tmp_path: Path, number: str, where: str
) -> None:
    path = tmp_path / "sendledger.toml"
    path.write_text(f"{where} = {number}\n", encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        load_settings(path)
    message = str(info.value)
    assert message.startswith(f"{path}: not valid TOML: "), message
    assert "64-bit" in message, message
    assert "\n" not in message and len(message) < 300 + len(str(path))


@pytest.mark.parametrize("number", HUGE)
def test_an_integer_past_64_bits_in_a_policy_refuses_its_channel_only(
    tmp_path: Path, number: str
) -> None:
    (tmp_path / "good.toml").write_text(GOOD, encoding="utf-8")
    bad = tmp_path / "bad.toml"
    bad.write_text(GOOD + f"search_after = {number}\n", encoding="utf-8")
    with pytest.raises(PolicyLoadError) as info:
        load_policy_dir(tmp_path)
    [problem] = info.value.problems
    assert problem.file == bad and "64-bit" in problem.reason, problem
    partial = load_policy_dir_partial(tmp_path)
    assert list(partial.policies) == ["good"] and list(partial.broken) == ["bad"]


def test_an_integer_past_a_float_s_range_is_no_duration() -> None:
    # Not only from TOML: any caller's integer.
    for value in (10**400, -(10**400)):
        with pytest.raises(DurationError, match="finite"):
            parse_duration(value)
        with pytest.raises(DurationError):
            parse_duration_with_unit(value, 0.0, CENTURY)


# -- sizes and counts -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "where"),
    [
        ({"api": {"max_body": "2GB"}}, "api.max_body"),
        ({"api": {"max_body": "1" * 400}}, "api.max_body"),
        ({"api": {"max_body": 10**30}}, "api.max_body"),
        (gmail(max_message_bytes="99999GB"), "providers.g.max_message_bytes"),
        (smtp(max_message_bytes="1.5GB"), "providers.m.max_message_bytes"),
        (gmail(max_recipients=10**9), "providers.g.max_recipients"),
        (smtp(max_recipients=10**9), "providers.m.max_recipients"),
        (gmail(quota_units_per_second=float("inf")), "providers.g.quota_units_per_second"),
    ],
)
def test_sizes_and_counts_have_upper_bounds(data: dict[str, Any], where: str) -> None:
    refused(data, where)


@settings(deadline=None, max_examples=200)
@given(st.integers(min_value=-10, max_value=10**12))
def test_parse_size_bounds(amount: int) -> None:
    try:
        assert parse_size(amount) == amount
    except ValueError:
        assert not 1 <= amount <= MAX_SIZE


@pytest.mark.parametrize("written", ["\u0664\u0660MB", "\uff14\uff10MB", "40\u00a0MB"])
def test_a_size_in_digits_of_another_script_is_refused(written: str) -> None:
    with pytest.raises(ValueError, match="not a size"):
        parse_size(written)


# -- URLs and the listen address ----------------------------------------------------------


@pytest.mark.parametrize("field", ["api_endpoint", "token_uri"])
@pytest.mark.parametrize(
    "url",
    [
        "file:///etc/passwd",
        "gopher://example.com/",
        "example.com",
        "http://",
        "https://user:secret@example.com/",
        "http://exa mple.com/",
        "http://example.com/\x1b",
        "http://example.com:99999/",
        "http://example.com:x/",
        "https://example.com/?q=1",
    ],
)
def test_provider_urls_are_http_urls(field: str, url: str) -> None:
    refused(gmail(**{field: url}), f"providers.g.{field}", "http(s) URL")


@pytest.mark.parametrize(
    "url", ["", "http://127.0.0.1:8026", "https://gmail.googleapis.com/", "http://[::1]:1/t"]
)
def test_good_provider_urls_load(url: str) -> None:
    loaded = settings_from_dict(gmail(api_endpoint=url, token_uri=url))
    assert loaded.providers["g"].api_endpoint == url  # type: ignore[union-attr]


GRAPH = {"kind": "graph", "tenant_id": "t", "client_id": "c", "client_secret_file": "s",
         "user": "u@example.com"}  # fmt: skip


@pytest.mark.parametrize(
    ("data", "where"),
    [
        (gmail(api_endpoint="http://gmail.googleapis.com/"), "providers.g.api_endpoint"),
        (gmail(token_uri="http://oauth2.googleapis.com/token"), "providers.g.token_uri"),
        (gmail(api_endpoint="http://10.0.0.5:8080/"), "providers.g.api_endpoint"),
        (gmail(api_endpoint="http://localhost.example.com/"), "providers.g.api_endpoint"),
        # A name, which the Google client connects wherever a resolver says.
        (gmail(token_uri="http://localhost:8026/token"), "providers.g.token_uri"),
        ({"providers": {"m": {**GRAPH, "api_endpoint": "http://graph.microsoft.com/v1.0"}}},
         "providers.m.api_endpoint"),
        # The scheme's case is no part of it (RFC 3986; httplib2 and urlsplit lower it):
        # checked as written, `HTTP://` loaded and the token went in clear text.
        (gmail(api_endpoint="HTTP://gmail.googleapis.com/"), "providers.g.api_endpoint"),
        (gmail(token_uri="Http://oauth2.googleapis.com/token"), "providers.g.token_uri"),
        ({"providers": {"m": {**GRAPH, "api_endpoint": "HTTP://graph.microsoft.com/v1.0"}}},
         "providers.m.api_endpoint"),
    ],
)  # fmt: skip
def test_a_provider_url_in_clear_text_to_another_host_needs_allow_http(
    data: dict[str, Any], where: str
) -> None:
    """The access token (Gmail's token_uri: the signed assertion, and the token in the
    answer) went in clear text to any host an http:// URL named; a webhook's payload
    needed `allow_http = true` for that, an SMTP password a loopback host."""
    refused(data, where, "clear text", "allow_http = true")
    name, table = next(iter(data["providers"].items()))
    allowed = settings_from_dict({"providers": {name: {**table, "allow_http": True}}})
    assert allowed.providers[name].allow_http  # type: ignore[union-attr]


@pytest.mark.parametrize("name", ["g/alice@example.com", "", "a\nb", " g", "g\t"])
def test_a_provider_name_is_one_a_scope_can_hold(name: str) -> None:
    """`g/alice@example.com` was accepted, and was the quota scope of provider `g`'s mailbox
    alice@example.com (`user = "{from}"`): one circuit, queue and lease for the two."""
    refused({"providers": {name: {"credentials_file": "sa.json"}}}, "providers", "got")
    for good in ("g", "support", "m365.work_1-x", "gmail prod", "gm\u0430il", "x" * 65):
        assert (
            good
            in settings_from_dict({"providers": {good: {"credentials_file": "sa.json"}}}).providers
        )


@given(st.text(max_size=70))
@settings(max_examples=300)
def test_a_name_a_policy_could_name_still_loads_unless_it_holds_a_slash(name: str) -> None:
    """A job keeps the name of the provider its attempt was made on (`Attempted.provider`,
    a draft's handle): its search, history read, tidy and a person's check go there. A
    name a policy could name before, refused now, would leave an upgrade one fix only,
    renaming, which strands every such job (no daemon has the provider it goes on with)."""
    try:
        ChannelPolicy._check_provider(name)
    except ValueError:
        return  # no policy could name it: no job was ever attempted there
    data = {"providers": {name: {"credentials_file": "sa.json"}}}
    if "/" in name:
        refused(data, "providers", "'/'")
    else:
        assert name in settings_from_dict(data).providers


@pytest.mark.parametrize(
    ("emulator", "allowed"),
    [("http://127.0.0.1:8026", False), ("http://localhost:8026", True),
     ("http://build-box.example:8026", True), ("https://build-box.example:8026", False)],
)  # fmt: skip
def test_init_s_emulator_config_loads_wherever_the_emulator_is(
    emulator: str, allowed: bool
) -> None:
    """`init --emulator URL` writes a config that runs as written: `allow_http = true` where
    its URL needs it (the emulator's tokens are its own), not elsewhere."""
    written = config_text(
        "gmail",
        parse_mailbox("you@example.com"),
        Emulated(api_endpoint=emulator, token_uri=emulator + "/token"),
    )
    loaded = settings_from_dict(tomllib.loads(written)).providers["gmail"]
    assert loaded.allow_http is allowed  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("listen", "parsed"),
    [
        ("127.0.0.1:8025", ("127.0.0.1", 8025)),
        ("[::1]:8025", ("::1", 8025)),
        ("localhost:1", ("localhost", 1)),
        ("mail-ops.example.com:65535", ("mail-ops.example.com", 65535)),
        ("0.0.0.0:80", ("0.0.0.0", 80)),
    ],
)
def test_listen_addresses_that_parse(listen: str, parsed: tuple[str, int]) -> None:
    assert parse_listen(listen) == parsed
    assert settings_from_dict({"api": {"listen": listen}}).api.host_port == parsed


@pytest.mark.parametrize(
    "listen",
    [":8025", "8025", "::1:8025", "[::1]", "[nope]:80", "host:0", "host:65536", "host:٨٠",
     "a b:80", "-x.example:80", "1.2.3.999:80", "host:80:80", "[::1]:", "http://h:80"],
)  # fmt: skip
def test_listen_addresses_that_do_not_parse_are_refused(listen: str) -> None:
    assert parse_listen(listen) is None
    refused({"api": {"listen": listen}}, "api.listen", "HOST:PORT")


# -- files ------------------------------------------------------------------------------


def special_files(tmp_path: Path) -> dict[str, Path]:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "gone")
    directory = tmp_path / "dir"
    directory.mkdir()
    return {
        "a named pipe (FIFO)": fifo,
        "a symbolic link to nothing": dangling,
        "a directory": directory,
        "a character device": Path("/dev/zero"),
    }


def within(seconds: float, action: Any) -> Any:
    """`action()`, failing (not hanging) when it does not return in time."""
    result: list[Any] = []
    thread = threading.Thread(target=lambda: result.append(_outcome(action)), daemon=True)
    thread.start()
    thread.join(seconds)
    assert result, "blocked"
    return result[0]


def _outcome(action: Any) -> Any:
    try:
        return action()
    except Exception as exc:
        return exc


def test_a_secret_file_must_be_a_regular_file_and_a_fifo_never_blocks(tmp_path: Path) -> None:
    for kind, path in special_files(tmp_path).items():
        outcome = within(5, lambda p=path: read_secret_text(p))
        assert isinstance(outcome, FileProblem), (kind, outcome)
        assert kind in str(outcome) and str(path) in str(outcome)


def test_a_linked_secret_is_read_and_a_huge_one_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.write_text("s3cret\n", encoding="utf-8")
    link = tmp_path / "link"
    link.symlink_to(real)
    assert read_secret_text(link) == "s3cret\n"
    big = tmp_path / "big"
    big.write_bytes(b"x" * (MAX_SECRET_BYTES + 1))
    with pytest.raises(FileProblem, match="larger than"):
        read_secret_text(big)
    assert read_regular_file(real, limit=7) == b"s3cret\n"


def test_a_policy_entry_that_is_not_a_regular_file_is_a_load_error_naming_it(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "policies"
    folder.mkdir()
    (folder / "receipts.toml").write_text(GOOD, encoding="utf-8")
    side = tmp_path / "side"
    side.mkdir()
    for kind, path in special_files(side).items():
        entry = folder / f"{path.name}.toml"
        if path.parent == side:
            path.rename(entry)
        else:
            entry.symlink_to(path)  # /dev/zero, through a link
        outcome = within(5, lambda: load_policy_dir(folder))
        assert isinstance(outcome, PolicyLoadError), (kind, outcome)
        (problem,) = outcome.problems
        assert problem.file == entry and problem.field == "-"
        assert kind in problem.reason
        if entry.is_dir() and not entry.is_symlink():
            entry.rmdir()
        else:
            entry.unlink()
    assert list(load_policy_dir(folder)) == ["receipts"]


def test_a_running_daemon_keeps_its_policies_when_an_entry_becomes_a_fifo(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from daemon.engine import PolicyHolder

    (tmp_path / "receipts.toml").write_text(GOOD, encoding="utf-8")
    holder = PolicyHolder(lambda: load_policy_dir(tmp_path))
    assert list(holder.current) == ["receipts"]
    os.mkfifo(tmp_path / "payouts.toml")
    assert within(5, holder.reload) is False
    assert list(holder.current) == ["receipts"]
    assert "payouts.toml" in caplog.text and "named pipe" in caplog.text

"""Loading policy folders: every problem of every file, as file:field: reason."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from policies.check import SUMMARY_COLUMNS, check_policies, render_table, summary_rows
from policies.durations import parse_duration
from policies.loader import (
    MAX_POLICY_BYTES,
    SETTLE_SECONDS,
    PolicyLoadError,
    PolicyProblem,
    PolicySet,
    load_policy_dir,
    load_policy_file,
)

GOOD = """\
provider = "support"
from = "Support <support@example.com>"
message_id_domain = "mail.example.com"
"""

DESIGN_EXAMPLE = """\
channel = "receipts"                 # defaults to the file's stem
provider = "support"                 # a [providers.NAME] of the config
from = "Support <support@example.com>"
message_id_domain = "mail.example.com"
on_unknown = "retry"                 # retry | search-then-review | review
irreversible = false                 # true: "retry" is refused at load
search_after = "5m"                  # wait after an ambiguous attempt before searching
search_interval = "5m"               # between searches (default: search_after)
confirm_misses = 2                   # empty searches before a miss is believed
max_attempts = 3                     # provider calls before review
retry_backoff = "30s"                # after a transient rejection; doubles, jittered
retry_backoff_max = "1h"
"""


def write(directory: Path, name: str, text: str) -> Path:
    path = directory / name
    path.write_text(text, encoding="utf-8")
    return path


def problems_of(directory: Path, **kwargs: object) -> list[PolicyProblem]:
    with pytest.raises(PolicyLoadError) as info:
        load_policy_dir(directory, **kwargs)  # type: ignore[arg-type]
    return info.value.problems


# -- single files --------------------------------------------------------------------------


def test_design_example_loads(tmp_path: Path) -> None:
    policy = load_policy_file(write(tmp_path, "receipts.toml", DESIGN_EXAMPLE))
    assert policy.name == "receipts"
    assert policy.on_unknown == "retry"
    assert policy.search_after == 300.0
    assert policy.retry_backoff_max == 3600.0


def test_channel_defaults_to_file_stem(tmp_path: Path) -> None:
    assert load_policy_file(write(tmp_path, "alerts.toml", GOOD)).name == "alerts"


def test_declared_channel_wins_over_stem(tmp_path: Path) -> None:
    path = write(tmp_path, "file-name.toml", 'channel = "other"\n' + GOOD)
    assert load_policy_file(path).name == "other"


def test_bad_stem_is_reported_as_channel(tmp_path: Path) -> None:
    path = write(tmp_path, "has space.toml", GOOD)
    with pytest.raises(PolicyLoadError) as info:
        load_policy_file(path)
    assert [p.field for p in info.value.problems] == ["channel"]


def test_fingerprint_ignores_formatting_and_key_order(tmp_path: Path) -> None:
    a = write(tmp_path, "a.toml", DESIGN_EXAMPLE)
    lines = [line.split("#")[0].strip() for line in DESIGN_EXAMPLE.splitlines()]
    shuffled = "\n\n".join(reversed(lines)).replace('"5m"', "300").replace('"1h"', '"60m"')
    b = write(tmp_path, "b.toml", "# reformatted\n" + shuffled + "\n")
    assert load_policy_file(a).fingerprint == load_policy_file(b).fingerprint


def test_fingerprint_changes_with_content(tmp_path: Path) -> None:
    a = write(tmp_path, "a.toml", DESIGN_EXAMPLE)
    b = write(tmp_path, "b.toml", DESIGN_EXAMPLE.replace("max_attempts = 3", "max_attempts = 4"))
    assert load_policy_file(a).fingerprint != load_policy_file(b).fingerprint


def test_all_problems_of_one_file(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "bad.toml",
        'provider = "support"\nfrom = "nobody"\nmessage_id_domain = "mail.example.com"\n'
        'on_unknown = "sometimes"\nconfirm_misses = 0\nsearch_after = "soon"\n',
    )
    with pytest.raises(PolicyLoadError) as info:
        load_policy_file(path)
    fields = sorted(p.field for p in info.value.problems)
    assert fields == ["confirm_misses", "from", "on_unknown", "search_after"]
    for problem in info.value.problems:
        assert str(problem).startswith(f"{path}:{problem.field}: ")
        (tmp_path / "a\nb.tml").write_text(GOOD, encoding="utf-8")  # the line stays one
    with pytest.raises(PolicyLoadError) as broken_name:
        load_policy_dir(tmp_path)
    assert "\n" not in str(broken_name.value.problems[0])


def test_from_is_reported_as_written_not_as_attribute(tmp_path: Path) -> None:
    path = write(tmp_path, "c.toml", GOOD.replace("Support <support@example.com>", "a@b, c@d"))
    with pytest.raises(PolicyLoadError) as info:
        load_policy_file(path)
    assert [p.field for p in info.value.problems] == ["from"]
    assert "from_" not in str(info.value).removeprefix(str(path))


def test_missing_required_fields(tmp_path: Path) -> None:
    path = write(tmp_path, "empty.toml", "")
    with pytest.raises(PolicyLoadError) as info:
        load_policy_file(path)
    assert sorted(str(p) for p in info.value.problems) == sorted(
        f"{path}:{field}: required" for field in ("provider", "from", "message_id_domain")
    )


def test_unknown_key_suggests_the_close_one(tmp_path: Path) -> None:
    path = write(tmp_path, "typo.toml", GOOD + 'serch_after = "5m"\n')
    with pytest.raises(PolicyLoadError) as info:
        load_policy_file(path)
    (problem,) = info.value.problems
    assert problem.field == "serch_after"
    assert "unknown setting" in problem.reason
    assert "'search_after'" in problem.reason


def test_irreversible_retry_refused_with_reason(tmp_path: Path) -> None:
    path = write(tmp_path, "pay.toml", GOOD + 'on_unknown = "retry"\nirreversible = true\n')
    with pytest.raises(PolicyLoadError) as info:
        load_policy_file(path)
    (problem,) = info.value.problems
    assert problem.field == "on_unknown"
    assert "irreversible channels never resend without a human" in str(problem)


def test_wrong_types_show_the_input(tmp_path: Path) -> None:
    path = write(tmp_path, "t.toml", GOOD + "max_attempts = true\nirreversible = 1\n")
    with pytest.raises(PolicyLoadError) as info:
        load_policy_file(path)
    reasons = {p.field: p.reason for p in info.value.problems}
    assert set(reasons) == {"max_attempts", "irreversible"}
    assert "True" in reasons["max_attempts"]
    assert "1" in reasons["irreversible"]


def test_toml_syntax_error_has_line_number(tmp_path: Path) -> None:
    path = write(tmp_path, "broken.toml", GOOD + "max_attempts 3\n")
    with pytest.raises(PolicyLoadError) as info:
        load_policy_file(path)
    (problem,) = info.value.problems
    assert problem.field == "-"
    assert "line 4" in problem.reason
    assert str(problem).startswith(f"{path}:-: TOML syntax error")


def test_toml_datetime_is_not_a_duration(tmp_path: Path) -> None:
    path = write(tmp_path, "d.toml", GOOD + "search_after = 00:05:00\n")
    with pytest.raises(PolicyLoadError) as info:
        load_policy_file(path)
    assert [p.field for p in info.value.problems] == ["search_after"]


def test_nested_table_is_an_unknown_setting(tmp_path: Path) -> None:
    path = write(tmp_path, "n.toml", GOOD + "[extra]\nx = 1\n")
    with pytest.raises(PolicyLoadError) as info:
        load_policy_file(path)
    assert [p.field for p in info.value.problems] == ["extra"]


def test_non_utf8_file(tmp_path: Path) -> None:
    path = tmp_path / "latin.toml"
    path.write_bytes(GOOD.encode() + b"# caf\xe9\n")
    with pytest.raises(PolicyLoadError) as info:
        load_policy_file(path)
    (problem,) = info.value.problems
    assert problem.field == "-"
    assert "UTF-8" in problem.reason


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(PolicyLoadError) as info:
        load_policy_file(tmp_path / "absent.toml")
    (problem,) = info.value.problems
    assert problem.field == "-"
    assert "cannot read" in problem.reason


# -- folders ------------------------------------------------------------------------------


def test_folder_loads_into_an_immutable_mapping(tmp_path: Path) -> None:
    a = write(tmp_path, "receipts.toml", GOOD)
    b = write(tmp_path, "payouts.toml", GOOD + 'on_unknown = "review"\nirreversible = true\n')
    write(tmp_path, "README.md", "not a policy")
    write(tmp_path, "receipts.toml.bak", "garbage = = =")
    write(tmp_path, ".#receipts.toml", "editor lock")
    policies = load_policy_dir(tmp_path)
    assert isinstance(policies, PolicySet)
    assert sorted(policies) == ["payouts", "receipts"]
    assert len(policies) == 2
    assert policies["payouts"].irreversible is True
    assert policies.get("receipts") is policies["receipts"]
    assert policies.get("nope") is None
    assert "receipts" in policies
    assert dict(policies.sources) == {"receipts": a, "payouts": b}
    assert policies.fingerprints() == {k: v.fingerprint for k, v in policies.items()}
    with pytest.raises(TypeError):
        policies["x"] = policies["receipts"]  # type: ignore[index]
    with pytest.raises(TypeError):
        policies.sources["x"] = a  # type: ignore[index]


def test_a_folder_without_a_policy_file_is_refused_naming_what_it_holds(tmp_path: Path) -> None:
    # Loaded as an empty set, it started a daemon that sent every job to review
    # (no-policy): a policies_dir that names the wrong folder, or files saved as
    # `receipts.tml`, were never said.
    with pytest.raises(PolicyLoadError) as empty:
        load_policy_dir(tmp_path)
    (problem,) = empty.value.problems
    assert problem.file == tmp_path and problem.field == "-"
    assert problem.reason.startswith("no policy file (CHANNEL.toml) in this folder")
    assert "every job to review" in problem.reason
    for name in ("receipts.tml", "notices.TOML", ".hidden.toml"):
        (tmp_path / name).write_text(GOOD, encoding="utf-8")
    (tmp_path / "old").mkdir()
    with pytest.raises(PolicyLoadError) as misnamed:
        load_policy_dir(tmp_path)
    (problem,) = misnamed.value.problems
    assert problem.reason.endswith(
        "; it holds notices.TOML, old, receipts.tml: only *.toml files are read"
    ), problem.reason
    (tmp_path / "a\nb.tml").write_text(GOOD, encoding="utf-8")  # the line stays one
    with pytest.raises(PolicyLoadError) as broken_name:
        load_policy_dir(tmp_path)
    assert "\n" not in str(broken_name.value.problems[0])


def test_problems_are_collected_across_all_files(tmp_path: Path) -> None:
    write(tmp_path, "good.toml", GOOD)
    one = write(tmp_path, "one.toml", GOOD + "max_attempts = 0\n")
    two = write(tmp_path, "two.toml", GOOD.replace("mail.example.com", "bad domain"))
    three = write(tmp_path, "three.toml", "provider = \n")
    problems = problems_of(tmp_path)
    rendered = [str(p) for p in problems]
    assert f"{one}:max_attempts: Input should be greater than or equal to 1, got 0" in rendered
    assert any(line.startswith(f"{two}:message_id_domain: ") for line in rendered)
    assert any(line.startswith(f"{three}:-: TOML syntax error") for line in rendered)
    assert "line 1" in next(p.reason for p in problems if p.file == three)
    assert len(problems) == 3
    assert str(PolicyLoadError(problems)).splitlines() == rendered


@pytest.mark.parametrize(
    ("line", "said"),
    [
        (
            'on_unknown = "retyr"',
            "on_unknown: Input should be 'retry', 'search-then-review' or 'review', got 'retyr'",
        ),
        ('pending_draft = "sned"', "pending_draft: Input should be 'send' or 'review', got 'sned'"),
        (
            "confirm_misses = 1000",
            "confirm_misses: Input should be less than or equal to 100, got 1000",
        ),
    ],
)
def test_a_value_out_of_its_choices_is_said_as_written(
    tmp_path: Path, line: str, said: str
) -> None:
    # A typo is seen at once when the line shows it beside what was expected.
    path = write(tmp_path, "receipts.toml", GOOD + line + "\n")
    assert [str(p) for p in problems_of(tmp_path)] == [f"{path}:{said}"]


def test_duplicate_channels(tmp_path: Path) -> None:
    first = write(tmp_path, "a.toml", 'channel = "receipts"\n' + GOOD)
    second = write(tmp_path, "receipts.toml", GOOD)
    (problem,) = problems_of(tmp_path)
    assert problem.file == second
    assert problem.field == "channel"
    assert "'receipts'" in problem.reason
    assert str(first) in problem.reason


def test_unknown_provider(tmp_path: Path) -> None:
    write(tmp_path, "ok.toml", GOOD)
    bad = write(tmp_path, "bad.toml", GOOD.replace('"support"', '"marketing"'))
    (problem,) = problems_of(tmp_path, known_providers=["support", "billing"])
    assert str(problem) == (
        f"{bad}:provider: unknown provider 'marketing' (known: billing, support)"
    )


def test_unknown_provider_with_none_configured(tmp_path: Path) -> None:
    write(tmp_path, "ok.toml", GOOD)
    (problem,) = problems_of(tmp_path, known_providers=[])
    assert "none configured" in problem.reason


def test_providers_not_checked_without_a_list(tmp_path: Path) -> None:
    write(tmp_path, "ok.toml", GOOD.replace('"support"', '"anything"'))
    assert load_policy_dir(tmp_path)["ok"].provider == "anything"


def test_missing_directory(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    (problem,) = problems_of(missing)
    assert str(problem) == (
        f"{missing}:-: no such directory: create it with one CHANNEL.toml per channel "
        "(docs/policies.md), or set daemon.policies_dir to the folder that holds them"
    )


def test_directory_is_a_file(tmp_path: Path) -> None:
    path = write(tmp_path, "file.toml", GOOD)
    (problem,) = problems_of(path)
    assert str(problem) == f"{path}:-: not a directory"


def test_unreadable_file_is_a_problem_and_others_still_checked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    locked = write(tmp_path, "locked.toml", GOOD)
    other = write(tmp_path, "other.toml", GOOD + "confirm_misses = 0\n")
    import os

    real_open = os.open

    def open_(path: Any, flags: int, *args: Any) -> int:
        if Path(path) == locked:
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, flags, *args)

    # Tests run as root, where chmod 000 locks nothing.
    monkeypatch.setattr("policies.files.os.open", open_)
    problems = problems_of(tmp_path)
    assert {(p.file, p.field) for p in problems} == {(locked, "-"), (other, "confirm_misses")}
    assert f"{locked}:-: cannot read: Permission denied" in [str(p) for p in problems]


# -- policy check -----------------------------------------------------------------------------


def test_check_policies_ok(tmp_path: Path) -> None:
    write(tmp_path, "receipts.toml", DESIGN_EXAMPLE)
    write(tmp_path, "payouts.toml", GOOD + 'on_unknown = "review"\nirreversible = true\n')
    policies, problems = check_policies(tmp_path, ["support"])
    assert problems == []
    assert policies is not None
    rows = summary_rows(policies)
    assert [r["channel"] for r in rows] == ["payouts", "receipts"]
    for row in rows:
        assert tuple(row) == SUMMARY_COLUMNS
    receipts = rows[1]
    assert receipts["on_unknown"] == "retry"
    assert receipts["irreversible"] is False
    assert receipts["search_after"] == "5m"
    assert receipts["retry_backoff_max"] == "1h"
    assert receipts["fingerprint"] == policies["receipts"].fingerprint
    assert parse_duration(receipts["search_interval"]) == 300.0
    table = render_table(rows).splitlines()
    assert len(table) == 3
    assert table[0].split() == list(SUMMARY_COLUMNS)
    assert "payouts" in table[1] and "yes" in table[1]


def test_check_policies_problems(tmp_path: Path) -> None:
    write(tmp_path, "a.toml", GOOD + "max_attempts = 0\n")
    write(tmp_path, "b.toml", GOOD)
    policies, problems = check_policies(tmp_path, ["other"])
    assert policies is None
    assert {(p.file.name, p.field) for p in problems} == {
        ("a.toml", "max_attempts"),
        ("b.toml", "provider"),
    }


REQUIRED = {
    "channel": "receipts",
    "provider": "support",
    "from": "Support <support@example.com>",
    "message_id_domain": "mail.example.com",
}
FIXTURE = Path(__file__).parents[1] / "fixtures" / "store-v1" / "policies" / "receipts.toml"


def test_a_policy_file_is_at_most_1_mib(tmp_path: Path) -> None:
    assert MAX_POLICY_BYTES == 1024 * 1024
    base = "".join(f'{k} = "{v}"\n' for k, v in REQUIRED.items() if k != "channel")
    path = tmp_path / "receipts.toml"
    path.write_text(base + "#" * (MAX_POLICY_BYTES - len(base) - 1) + "\n", encoding="utf-8")
    assert load_policy_file(path).channel == "receipts"
    path.write_text(base + "#" * (MAX_POLICY_BYTES - len(base)) + "\n", encoding="utf-8")
    with pytest.raises(PolicyLoadError, match="larger than"):
        load_policy_file(path)


def test_fields_added_later_keep_the_first_releases_fingerprint(tmp_path: Path) -> None:
    """`allowed_from`, `pending_draft`, `give_up_after`, `watch_bounces`, `on_bounce` and
    `history_after` at their defaults leave the fingerprint a policy of the first release had
    (tests/fixtures/store-v1/README.md)."""
    text = FIXTURE.read_text(encoding="utf-8")
    assert load_policy_file(FIXTURE).fingerprint == "7d06ca0409ba9b06"
    later = tmp_path / "receipts.toml"
    later.write_text(text + 'allowed_from = []\npending_draft = "send"\n', encoding="utf-8")
    assert load_policy_file(later).fingerprint == "7d06ca0409ba9b06"
    later.write_text(text + 'on_bounce = "record"\n', encoding="utf-8")
    assert load_policy_file(later).fingerprint == "7d06ca0409ba9b06"
    later.write_text(text + 'watch_bounces = "3d"\n', encoding="utf-8")
    assert load_policy_file(later).fingerprint != "7d06ca0409ba9b06"
    later.write_text(text + 'give_up_after = "4h"\n', encoding="utf-8")
    assert load_policy_file(later).fingerprint != "7d06ca0409ba9b06"
    later.write_text(text + 'history_after = "1s"\n', encoding="utf-8")
    assert load_policy_file(later).fingerprint != "7d06ca0409ba9b06"


# -- a file still being saved ----------------------------------------------------------------


def test_a_file_cut_short_by_a_save_in_progress_is_read_once_the_save_ends(
    tmp_path: Path,
) -> None:
    """A tool that rewrites a policy in place leaves, for a moment, its first lines only:
    whole key/value lines, valid TOML, a valid policy, with the defaults where the rest
    said otherwise. Loaded at that moment, the channel ran on the cut file. A file changed
    within `SETTLE_SECONDS` is read again once left alone that long, so the loader takes
    the finished file."""
    whole = GOOD + 'on_unknown = "review"\nmax_attempts = 1\n'
    path = write(tmp_path, "receipts.toml", GOOD)  # the save so far: its first lines
    finish = threading.Timer(SETTLE_SECONDS / 3, path.write_text, (whole,), {"encoding": "utf-8"})
    finish.start()
    try:
        policy = load_policy_dir(tmp_path)["receipts"]
    finally:
        finish.join()
    assert (policy.on_unknown, policy.max_attempts) == ("review", 1)


def test_a_file_left_alone_is_read_at_once(tmp_path: Path) -> None:
    path = write(tmp_path, "receipts.toml", GOOD)
    old = time.time() - 10
    os.utime(path, (old, old))
    started = time.monotonic()
    assert "receipts" in load_policy_dir(tmp_path)
    assert time.monotonic() - started < SETTLE_SECONDS


@pytest.mark.parametrize(
    "nested", ["[" * 50_000 + "]" * 50_000, "{a = " * 50_000 + "1" + "}" * 50_000]
)
def test_a_file_nested_past_the_parser_s_depth_is_a_problem_naming_it(
    tmp_path: Path, nested: str
) -> None:
    """Arrays or inline tables nested thousands deep (a corrupt or hostile file, well
    under MAX_POLICY_BYTES) overflowed the TOML parser's recursion: "unexpected failure:
    RecursionError" (exit 1), naming no file. One problem naming the file (exit 2)."""
    path = write(tmp_path, "receipts.toml", GOOD + f"x = {nested}\n")
    assert problems_of(tmp_path) == [
        PolicyProblem(path, "-", "TOML nested too deeply (arrays or inline tables)")
    ]

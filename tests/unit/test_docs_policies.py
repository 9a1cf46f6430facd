"""docs/policies.md against the policy model, in both directions (docs/development.md "Writing
the docs"): the example names every field and loads; the fields table holds every field, its
default and its bounds, and nothing else; the messages and limits the page quotes are the
loader's."""

from __future__ import annotations

import re
import tomllib
import typing
from pathlib import Path

import pytest
from pydantic import ValidationError

from policies.durations import parse_duration
from policies.loader import MAX_POLICY_BYTES, PolicyLoadError, load_policy_dir, load_policy_file
from policies.model import ChannelPolicy

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "policies.md"
FIXTURE = REPO / "tests" / "fixtures" / "store-v1" / "policies" / "receipts.toml"
#: What a policy needs besides the field under test.
REQUIRED = {
    "channel": "receipts",
    "provider": "support",
    "from": "Support <support@example.com>",
    "message_id_domain": "mail.example.com",
}
#: Defaults the page says in words, and the value each stands for.
PROSE_DEFAULTS: dict[str, object] = {
    "unset (off)": None,
    "the file's stem": None,  # the loader's, not the model's: checked below
    "`search_after`": 300.0,  # the default search_after, after validation
}


def page() -> str:
    return PAGE.read_text(encoding="utf-8")


def fields() -> dict[str, str]:
    """Field name as written in a file (`from`, not `from_`) -> attribute name."""
    return {(info.alias or name): name for name, info in ChannelPolicy.model_fields.items()}


def example() -> str:
    return page().split("```toml\n", 1)[1].split("```", 1)[0]


def table() -> list[list[str]]:
    lines = [x for x in page().splitlines() if x.startswith("| `")]
    return [[c.strip() for c in x.strip().strip("|").split("|")] for x in lines]


def test_the_example_loads_and_names_every_field(tmp_path: Path) -> None:
    assert set(tomllib.loads(example())) == set(fields())
    (tmp_path / "receipts.toml").write_text(example(), encoding="utf-8")
    policy = load_policy_file(tmp_path / "receipts.toml")
    assert policy.give_up_after == 4 * 3600 and policy.allowed_from == ("*@example.com",)


def test_the_table_holds_every_field_once_and_nothing_else() -> None:
    named = [re.fullmatch(r"`([a-z_]+)`", row[0]).group(1) for row in table()]  # type: ignore[union-attr]
    assert sorted(named) == sorted(fields())
    assert list(named) == list(fields()), "in the model's order"


def validate(**values: object) -> ChannelPolicy:
    return ChannelPolicy.model_validate({**REQUIRED, **values})


def refused(field: str, value: object, **more: object) -> bool:
    try:
        validate(**more, **{field: value})
    except ValidationError as exc:
        return any(e["loc"][:1] == (field,) for e in exc.errors())
    return False


@pytest.mark.parametrize(("field", "cell"), [(r[0].strip("`"), r[1]) for r in table()])
def test_each_default_on_the_page_is_the_models(field: str, cell: str, tmp_path: Path) -> None:
    attribute = fields()[field]
    info = ChannelPolicy.model_fields[attribute]
    if cell == "required":
        assert info.is_required() or field == "channel"
        if field != "channel":
            with pytest.raises(ValidationError, match=field):
                ChannelPolicy.model_validate({k: v for k, v in REQUIRED.items() if k != field})
        return
    default = getattr(validate(), attribute)
    if field == "channel":
        assert cell == "the file's stem"
        (tmp_path / "payouts.toml").write_text(
            "".join(f'{k} = "{v}"\n' for k, v in REQUIRED.items() if k != "channel"),
            encoding="utf-8",
        )
        assert load_policy_file(tmp_path / "payouts.toml").channel == "payouts"
        return
    if cell in PROSE_DEFAULTS:
        assert default == PROSE_DEFAULTS[cell]
        return
    value = literal(cell)
    assert getattr(validate(**{field: value}), attribute) == default, (field, cell)


def literal(cell: str) -> object:
    """A default cell's one backticked value, as a TOML value where it reads as one."""
    assert re.fullmatch(r"`[^`]+`", cell), f"say {cell!r} as one `value` or add it above"
    text = cell.strip("`")
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


RANGE = re.compile(r"(\S+) to (\S+?)(?:,|$)")


@pytest.mark.parametrize(
    ("field", "text"), [(r[0].strip("`"), r[2]) for r in table() if RANGE.match(r[2])]
)
def test_each_range_is_what_the_model_takes(field: str, text: str) -> None:
    low_text, high_text = RANGE.match(text).groups()  # type: ignore[union-attr]
    count = re.fullmatch(r"\d+", low_text) is not None
    low, high = (
        (int(low_text), int(high_text)) if count else map(parse_duration, (low_text, high_text))
    )
    step = 1 if count else 0.001
    # retry_backoff_max must also be at least retry_backoff: keep that out of the way.
    more: dict[str, object] = {"retry_backoff": low} if field == "retry_backoff_max" else {}
    if field == "retry_backoff":
        more = {"retry_backoff_max": high}
    if field == "history_after":
        more = {"search_after": "7d"}  # it must be shorter than search_after
    assert not refused(field, low, **more) and not refused(field, high, **more)
    assert refused(field, low - step, **more) and refused(field, high + step, **more)


def test_the_choices_on_the_page_are_the_models() -> None:
    for row in table():
        field = fields()[row[0].strip("`")]
        annotation = ChannelPolicy.model_fields[field].annotation
        if typing.get_origin(annotation) is typing.Literal:
            assert set(re.findall(r"`([a-z-]+)`", row[2])) == set(typing.get_args(annotation))


def test_the_quoted_refusals_are_the_loaders(tmp_path: Path) -> None:
    base = "".join(f'{k} = "{v}"\n' for k, v in REQUIRED.items() if k != "channel")
    (tmp_path / "receipts.toml").write_text(base + 'search_after = "30d"\n', encoding="utf-8")
    with pytest.raises(PolicyLoadError) as caught:
        load_policy_dir(tmp_path)
    assert str(caught.value).endswith("receipts.toml:search_after: must be at most 7d, got '30d'")
    assert refused("retry_backoff_max", "1m", retry_backoff="2m")
    assert refused("on_unknown", "retry", irreversible=True)
    assert refused("allowed_from", [f"a{i}@example.com" for i in range(1001)])
    assert refused("channel", "c" * 129) and not refused("channel", "c" * 128)
    # allowed_from: LOCAL@DOMAIN of address characters, * and ?; no character classes.
    for pattern in ("[ab]*@example.com", "support", "sup port@example.com", ""):
        assert refused("allowed_from", [pattern]), pattern
    assert not refused("allowed_from", ["*@example.com", "sales-?@*.example.com"])


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
    """`allowed_from`, `pending_draft`, `give_up_after`, `watch_bounces` and `on_bounce`
    at their defaults leave the fingerprint a policy of the first release had
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


def test_the_example_policies_load() -> None:
    policies = load_policy_dir(REPO / "examples" / "policies")
    assert set(policies) == {"payouts", "receipts"}

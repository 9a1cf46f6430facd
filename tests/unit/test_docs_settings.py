"""Every table of settings and policy fields is the models', both ways: keys, defaults, ranges
(both ends taken, just outside refused), choices (docs/development.md "Writing the docs")."""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from typing import Any

import pytest
from pydantic import BaseModel, ValidationError
from tests.unit.docs_code import KEYS, KINDS, check_default, validated
from tests.unit.docs_code import STUBS as STUBS  # tests/unit/test_settings.py imports it here
from tests.unit.docs_page import CODE, flat, keyed, page, section, table
from tests.unit.test_config_bounds import seconds_with_unit

from daemon.config import settings as cfg
from daemon.config.sizes import parse_size
from ledger.stores.index import IndexRow
from ledger.stores.library_env import APPLICATION_PREFIX, LIBRARY_VARIABLES, READ_BY_SENDLEDGER
from policies.durations import parse_duration
from policies.model import ChannelPolicy

RANGE = re.compile(r"(?:whole seconds, )?(above )?([^\s,]+(?: byte)?),? (?:to|at most) ([^\s,]+)")
#: What a field's range needs of another field: its low (0) or high (1) end, or (2) 7d.
OTHER = {"retry_backoff": ("retry_backoff_max", 1), "retry_backoff_max": ("retry_backoff", 0)}
OTHER["history_after"] = ("search_after", 2)  # history_after is shorter than it
#: The other pages' key tables: page, title, header's first cell ("": the first), model, prefix.
PROVIDERS = zip(("Gmail keys", "SMTP + IMAP setup", "Graph keys"), KINDS.values(), strict=True)
KEY_TABLES = [("providers.md", title, "", model, "") for title, model in PROVIDERS]
KEY_TABLES += [("http-api.md", "## HTTP API", "key", cfg.ApiSettings, "api.")]
KEY_TABLES += [("policies.md", "Fields, defaults and bounds", "field", ChannelPolicy, "")]


def amount(text: str) -> float:
    """A bound as a page writes it: a count, a size or a duration."""
    if text == "1 byte" or re.fullmatch(r"\d+[KMG]i?B", text):
        return parse_size(text.replace(" byte", ""))
    return float(text) if re.fullmatch(r"\d+(\.\d+)?", text) else parse_duration(text)


def number_types(annotation: Any) -> set[Any]:
    """The types a field holds apart from None (`Annotated[float, ...] | None`: float)."""
    if typing.get_origin(annotation) is typing.Annotated:
        return number_types(typing.get_args(annotation)[0])
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return set().union(*(number_types(a) for a in typing.get_args(annotation))) - {type(None)}
    return {annotation}


def check_range(model: type[BaseModel], field: str, text: str, where: str) -> None:
    """`low to high`, `above low, at most high` or `(low..high)`: both ends taken, just
    outside each refused."""
    found = RANGE.match(text) or re.search(r"\(()(\d+)\.\.(\d+s?)\)", text)
    assert found, f"{where}: {field}: no range in {text!r}"
    above, low, high = found.groups()
    ends = (amount(low), amount(high))
    whole = text.startswith("whole") or number_types(model.model_fields[field].annotation) == {int}
    step = 1.0 if whole else max(ends[1] * 1e-6, 0.0005)
    other, end = OTHER.get(field, ("", 0))
    more = {other: [*ends, "7d"][end]} if other in model.model_fields else {}

    def refused(value: float) -> bool:
        try:
            given: object = int(value) if whole else value
            if field == "purge_after":  # written with its unit, or refused: a purge is final
                given = seconds_with_unit(given)
            validated(model, **more, **{field: given})
        except ValidationError as exc:
            return any(e["loc"][:1] == (field,) for e in exc.errors())
        return False

    said = f"{where}: {field} written {text!r}, the model"
    assert not refused(ends[1]) and refused(ends[1] + step), f"{said} differs at {high}"
    assert refused(ends[0]) == bool(above), f"{said} differs at {low}"
    assert above or refused(ends[0] - step), f"{said} takes less than {low}"


def check_choices(model: type[BaseModel], field: str, cell: str, where: str) -> None:
    annotation = model.model_fields[field].annotation
    if typing.get_origin(annotation) is typing.Literal and field != "kind":
        missing = {str(c) for c in typing.get_args(annotation)}
        missing -= {c.strip('"') for c in CODE.findall(cell)}
        assert not missing, f"{where}: {field} does not name the model's choices {missing}"


def test_the_configuration_page_s_settings_index_and_variables_are_the_code_s() -> None:
    """Every setting has one row, its default, choices and range; the index's columns, each
    by the word the page gives it; the library's variables named, the ones read said."""
    rows = []  # configuration.md's key tables: a row of several keys, `a` / `b`, a row per key
    for first, kind in (("key", "gmail"), ("smtp-imap key", "smtp-imap"), ("graph key", "graph")):
        for row in table(page("configuration.md"), f"{first} | default"):
            keys = CODE.findall(row[0])
            defaults = row[1].split(" / ") if len(keys) > 1 else [row[1]]
            for key, default in zip(keys, defaults, strict=True):
                full = key if "." in key else f"{keys[0].rpartition('.')[0]}.{key}"
                rows.append((kind if full.startswith("providers.") else "", full, default, row[2]))
    listed = [(kind, key) for kind, key, _, _ in rows]
    every = set(KEYS) - {("smtp-imap", "providers.NAME.kind"), ("graph", "providers.NAME.kind")}
    assert sorted(set(listed) ^ every) == [] and len(listed) == len(set(listed))
    for kind, key, default, meaning in rows:
        check_default(*KEYS[kind, key], default, f"configuration.md, row {key}")
        check_choices(*KEYS[kind, key], meaning, f"configuration.md, row {key}")
        if key == "providers.NAME.kind":
            assert set(CODE.findall(meaning)) >= set(KINDS)
    ranged = []
    for row in table(page("configuration.md"), "key | range"):
        kinds = [k for k in KINDS if re.search(rf"\({k}\b|, {k}\b", row[0])] or list(KINDS)
        for key in CODE.findall(row[0]):
            fields = {KEYS[k, key] for k in ("", *kinds) if (k, key) in KEYS}
            assert fields, key
            for model, field in fields:
                check_range(model, field, row[1], "configuration.md, range table")
                ranged.append((model, field))
    held = {(m, f): number_types(m.model_fields[f].annotation) for m, f in KEYS.values()}
    numeric = {field for field, kinds in held.items() if kinds <= {int, float}}
    assert sorted(map(str, numeric ^ set(ranged))) == [] and len(ranged) == len(set(ranged))
    kept = flat(page("configuration.md")).split("the job index keeps", 1)[1].split(")", 1)[0]
    words = {"job_id": "key", "message_id": "Message-ID", "attempts": "attempt count"}
    words |= {"watch_mailbox": "digest", "mailbox": "From mailbox as a digest"}
    words["attempt_provider"] = "attempt's provider"
    columns = [f.name for f in dataclasses.fields(IndexRow)]  # a time by the word "times"
    said = {c: "times" if re.search(r"_(at|until|since)$", c) else words.get(c, c) for c in columns}
    assert [w for w in said.values() if w not in kept] == []
    library = section("configuration.md", "### Only sendledger's settings configure the store")
    named = set(re.findall(r"`([A-Z][A-Z_]+\*?)`", library)) - {APPLICATION_PREFIX}
    assert named & READ_BY_SENDLEDGER == set(READ_BY_SENDLEDGER)
    for name in named - READ_BY_SENDLEDGER:
        assert any(v.startswith(name.rstrip("*")) for v in LIBRARY_VARIABLES), name


@pytest.mark.parametrize(("name", "title", "first", "model", "prefix"), KEY_TABLES)
def test_each_key_table_is_its_model_s(
    name: str, title: str, first: str, model: type[BaseModel], prefix: str
) -> None:
    """Every field a row (the policy's in order, by alias), its default and range; choices."""
    where, policy = f"{name} {title!r}", model is ChannelPolicy
    fields = {prefix + (i.alias or f): f for f, i in model.model_fields.items() if f != "kind"}
    rows = keyed(section(name, title, until=3), first)
    assert list(rows) == list(fields) if policy else set(rows) == set(fields)
    for key, (default, takes) in rows.items():
        if policy and default == "the file's stem":  # the loader's, from the file name
            assert fields[key] == "channel", where
        else:
            check_default(model, fields[key], default, where)
        if re.match(r"\S+ to \S+", takes) or re.search(r"\(\d+\.\.\d+s?\)", takes):
            check_range(model, fields[key], takes, where)
        if policy:
            check_choices(model, fields[key], takes, where)

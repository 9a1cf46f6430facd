"""The ``SENDLEDGER_*`` environment: which names mean something, and which variable set a
setting, so that an error names what the user typed.

A misspelled override (``SENDLEDGER_STOR__URL``) used to be ignored, and the user wrote
to the store they thought they had left. Every ``SENDLEDGER_*`` name must therefore be
one the settings model reads (``SENDLEDGER_<SECTION>``, ``SENDLEDGER_<SECTION>__<KEY>``,
``SENDLEDGER_PROVIDERS__<NAME>[__<KEY>]``: derived from the model, so new sections and
keys are valid as soon as they exist) or one of :data:`OTHER_VARIABLES`. docs/configuration.md,
"Configuration".
"""

from __future__ import annotations

import json
import types
import typing
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pydantic is imported by the model that is passed in, not for the names
    from pydantic import BaseModel

PREFIX = "SENDLEDGER_"
DELIMITER = "__"

#: The variables read outside the settings model: the one place that lists them.
OTHER_VARIABLES: Mapping[str, str] = {
    "SENDLEDGER_CONFIG": "the config file (when --config is not given)",
    "SENDLEDGER_CRASH_POINT": "tests: the process kills itself at this point",
    "SENDLEDGER_TEST_PG_URL": "tests: the PostgreSQL server the tests use",
}

_ANY = "*"  # a name chosen by the user: a provider's name


def _models(annotation: Any) -> list[type[BaseModel]]:
    """The models a field's annotation can hold (one, or the members of a union)."""
    from pydantic import BaseModel

    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _models(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return [m for arg in typing.get_args(annotation) for m in _models(arg)]
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return []


def _paths(model: type[BaseModel]) -> set[tuple[str, ...]]:
    """Every field path an environment variable may name, upper-cased; ``*`` stands for
    a user's name (a dict key)."""
    paths: set[tuple[str, ...]] = set()
    for name, info in model.model_fields.items():
        if info.exclude:
            continue
        field = name.upper()
        paths.add((field,))
        annotation = info.annotation
        if typing.get_origin(annotation) is dict:
            annotation = typing.get_args(annotation)[1]
            paths.add((field, _ANY))
            prefix: tuple[str, ...] = (field, _ANY)
        else:
            prefix = (field,)
        for sub in _models(annotation):
            for key in sub.model_fields:
                paths.add((*prefix, key.upper()))
    return paths


def _matches(parts: tuple[str, ...], path: tuple[str, ...]) -> bool:
    return len(parts) == len(path) and all(
        p == q or (q == _ANY and p != "") for p, q in zip(parts, path, strict=True)
    )


def unknown_variable(environ: Mapping[str, str], model: type[BaseModel]) -> str | None:
    """The first (sorted) ``SENDLEDGER_*`` name that nothing reads, or None."""
    paths = _paths(model)
    others = {name.upper() for name in OTHER_VARIABLES}
    for name in sorted(environ):
        upper = name.upper()
        if not upper.startswith(PREFIX) or upper in others:
            continue
        parts = tuple(upper[len(PREFIX) :].split(DELIMITER))
        if not any(_matches(parts, path) for path in paths):
            return name
    return None


def variable_for(loc: Iterable[object], environ: Mapping[str, str]) -> str | None:
    """The variable that set the setting at ``loc`` (or the whole section holding it),
    or None when the value came from the file."""
    parts = [str(part).upper() for part in loc]
    for end in range(len(parts), 0, -1):
        wanted = PREFIX + DELIMITER.join(parts[:end])
        for name in environ:
            if name.upper() == wanted:
                return name
    return None


def missing_variable(loc: Iterable[object], environ: Mapping[str, str]) -> str | None:
    """For a required setting that is missing from a section the environment defines
    (say ``SENDLEDGER_PROVIDERS__X__KIND`` without the rest): the variable that would set
    it, since that is where the user wrote the section. None when no variable touches it."""
    parts = [str(part).upper() for part in loc]
    section = PREFIX + DELIMITER.join(parts[:-1]) + DELIMITER
    if len(parts) > 1 and any(name.upper().startswith(section) for name in environ):
        return PREFIX + DELIMITER.join(parts)
    return None


def malformed_json_variable(
    field: str, environ: Mapping[str, str], model: type[BaseModel] | None = None
) -> str | None:
    """The variable under ``field`` whose value looks like JSON and does not parse, or,
    given the settings `model`, one that sets a list, a table or a section (read as JSON)
    with a value that is not JSON: ``a,b`` or one bare value where ``["a", "b"]`` is
    meant."""
    wanted = PREFIX + field.upper()
    for name in sorted(environ):
        upper = name.upper()
        if upper != wanted and not upper.startswith(wanted + DELIMITER):
            continue
        value = environ[name].strip()
        parts = tuple(upper[len(PREFIX) :].split(DELIMITER))
        if value[:1] in ("{", "[") or (model is not None and _takes_json(model, parts)):
            try:
                json.loads(value)
            except ValueError:
                return name
    return None


def _takes_json(model: type[BaseModel], parts: tuple[str, ...]) -> bool:
    """Whether the setting at `parts` (upper-cased, a user's name where a table holds
    them) is a list, a table or a section: pydantic-settings reads its variable as JSON."""
    annotation: Any = model
    for part in parts:
        models = _models(annotation)
        if typing.get_origin(annotation) is dict:
            annotation = typing.get_args(annotation)[1]  # `part` is a user's name
            continue
        fields = {n.upper(): f for m in models for n, f in m.model_fields.items()}
        if part not in fields:
            return False
        annotation = fields[part].annotation
    return bool(_models(annotation)) or _is_collection(annotation)


def _is_collection(annotation: Any) -> bool:
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _is_collection(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        return any(_is_collection(arg) for arg in typing.get_args(annotation))
    return origin in (list, dict, set, tuple, frozenset)


__all__ = [
    "OTHER_VARIABLES",
    "malformed_json_variable",
    "unknown_variable",
    "variable_for",
]

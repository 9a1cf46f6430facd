"""The code's side that several docs tests compare the pages with (docs/development.md
"Writing the docs"): the settings models by section and provider kind and each key's field,
a default as a page writes it checked against its model, the job's events and their fields,
the make targets, every command's parser, a bench script's options and constants, and one
engine rig with its policies."""

from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import functools
import re
import socket
import tomllib
from collections.abc import Iterator
from typing import Any

import pytest
from eventsourcing.domain import Aggregate
from pydantic import BaseModel
from tests.unit.docs_page import page
from tests.unit.engine_rig import EngineRig, policy

from daemon.cli import build_parser
from daemon.config import settings as cfg
from daemon.webhooks.events import WEBHOOK_TYPES
from ledger.job import SendJob
from policies.model import ChannelPolicy

MAKE_TARGETS = set(re.findall(r"^([a-z][a-z0-9_-]*):", page("Makefile"), re.M))
SECTIONS: dict[str, type[BaseModel]] = {"store": cfg.StoreSettings, "daemon": cfg.DaemonSettings}
SECTIONS |= {"api": cfg.ApiSettings, "retention": cfg.RetentionSettings}
SECTIONS["webhooks.NAME"] = cfg.WebhookSettings
KINDS: dict[str, type[BaseModel]] = {"gmail": cfg.GmailProviderSettings}
KINDS |= {"smtp-imap": cfg.SmtpImapProviderSettings, "graph": cfg.GraphProviderSettings}
#: Every setting by (its provider kind, or "" outside `providers`; its key): model and field.
KEYS = {("", f"{p}.{f}"): (m, f) for p, m in SECTIONS.items() for f in m.model_fields}
KEYS |= {(k, f"providers.NAME.{f}"): (m, f) for k, m in KINDS.items() for f in m.model_fields}
#: The job's events by name (not the base class, nor eventsourcing's alias `Created`).
EVENTS: dict[str, Any] = {n: c for n, c in vars(SendJob).items() if isinstance(c, type)}
EVENTS = {n: c for n, c in EVENTS.items() if issubclass(c, Aggregate.Event) and n[0] != "_"}
EVENTS = {n: c for n, c in EVENTS.items() if n not in ("Event", "Created")}
FIELDS = {n: {f.name for f in dataclasses.fields(c)} for n, c in EVENTS.items()}  # bases' too


#: What a model needs besides the field under test, so that one field is validated alone.
STUBS: dict[type[BaseModel], dict[str, Any]] = {
    cfg.GmailProviderSettings: {"credentials_file": "sa.json"},
    cfg.SmtpImapProviderSettings: {"kind": "smtp-imap", "smtp_host": "smtp.example.com"}
    | {"imap_host": "imap.example.com", "username": "u", "password_file": "pw"},
    cfg.GraphProviderSettings: {"kind": "graph", "tenant_id": "t", "client_id": "c"}
    | {"user": "u@example.com", "client_secret_file": "secret"},
    cfg.WebhookSettings: {"url": "https://hooks.example.com/x", "secret_file": "whsec"},
    ChannelPolicy: {"channel": "receipts", "provider": "support"}
    | {"from": "Support <support@example.com>", "message_id_domain": "mail.example.com"},
}
#: Defaults the pages say in words, and the values each may stand for.
WORDS: dict[str, tuple[object, ...]] = dict.fromkeys(("unset", "unset (off)"), (None, ""))
WORDS |= {"the host name": (socket.gethostname(),), "all seven": (list(WEBHOOK_TYPES),)}
WORDS["twice `deadline_grace`, at least `1s`"] = (None,)  # tests/unit/test_settings.py
WORDS |= dict.fromkeys(("off", "none", "Google's", "the file's", "the `\\Sent` folder"), ("",))
WORDS |= dict.fromkeys(("", "required with `listen`"), (None,))


def validated(model: type[BaseModel], **values: Any) -> Any:
    return model.model_validate({**STUBS.get(model, {}), **values})


def check_default(model: type[BaseModel], field: str, cell: str, where: str) -> None:
    """The default written: `required`, words of WORDS, another field's name, or one `value`."""
    info = model.model_fields[field]
    default = "required" if info.is_required() else info.get_default(call_default_factory=True)
    said = f"{where}: {field} written {cell!r}, the model's default is {default!r}"
    value = re.fullmatch(r"`([^`]+)`(?: \([^)]*\))?", cell)
    if "required" in (cell, default):
        assert cell == default, said
    elif cell in WORDS:
        assert default in WORDS[cell], said
    elif value and value[1] in model.model_fields:  # unset: the other's value, now or later
        given = validated(model)
        assert default is None and getattr(given, field) in (None, getattr(given, value[1])), said
    else:
        assert value, f"{where}: {field}: write {cell!r} as one `value`, or add it to WORDS"
        try:
            written = tomllib.loads(f"v = {value[1]}")["v"]
        except tomllib.TOMLDecodeError:
            written = value[1]
        expected = None if default is None else getattr(validated(model, **{field: default}), field)
        assert getattr(validated(model, **{field: written}), field) == expected, said


@functools.cache
def parsers() -> dict[tuple[str, ...], argparse.ArgumentParser]:
    """The parser of every command path that runs something (() is the top level)."""
    found: dict[tuple[str, ...], argparse.ArgumentParser] = {}
    todo: list[tuple[tuple[str, ...], argparse.ArgumentParser]] = [((), build_parser())]
    while todo:
        path, parser = todo.pop()
        if path == () or parser.get_default("func") is not None:
            found[path] = parser
        for action in parser._actions:
            todo += [((*path, n), c) for n, c in getattr(action, "_name_parser_map", {}).items()]
    return found


@functools.cache  # read by many tests, each span of a page: parsed once
def bench(script: str) -> dict[str, Any]:
    """A bench script's options (`-n`, `--n`) with their defaults and its module-level
    constants, each as a literal (None when it is not one)."""

    def literal(node: ast.expr | None) -> Any:
        with contextlib.suppress(ValueError):
            return None if node is None else ast.literal_eval(node)

    tree, found = ast.parse(page(f"bench/{script}")), dict[str, Any]()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "add_argument":
            default = literal(next((k.value for k in node.keywords if k.arg == "default"), None))
            found |= {str(a.value): default for a in node.args[:2] if isinstance(a, ast.Constant)}
    for node in tree.body:
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            found |= {t.id: literal(node.value) for t in targets if isinstance(t, ast.Name)}
    return found


@pytest.fixture(scope="module")
def rig() -> Iterator[EngineRig]:
    """An engine on the fake provider with a `legal` policy and a `receipts` one that reviews."""
    rig = EngineRig(policy("legal"), policy("receipts", on_unknown="review"))
    with contextlib.closing(rig):
        yield rig

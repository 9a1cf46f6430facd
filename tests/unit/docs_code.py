"""The code's side that several docs tests compare the pages with (docs/development.md
"Writing the docs"): the settings models by section and provider kind, the job's events and
their fields, the make targets, every command's parser, a bench script's options and
constants, and one engine rig with its policies."""

from __future__ import annotations

import argparse
import ast
import contextlib
import dataclasses
import functools
import re
from collections.abc import Iterator
from typing import Any

import pytest
from eventsourcing.domain import Aggregate
from pydantic import BaseModel
from tests.unit.docs_page import page
from tests.unit.engine_rig import EngineRig, policy

from daemon.cli import build_parser
from daemon.config import settings as cfg
from ledger.job import SendJob

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

"""The one Hypothesis profile (tests/conftest.py): no test's verdict depends on wall-clock
time per example, and a failing example is the same on every run."""

from __future__ import annotations

import ast
import os
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

TESTS = Path(__file__).resolve().parents[1]


def test_the_loaded_profile_has_no_deadline_and_is_derandomized() -> None:
    assert settings.default is not None
    assert settings.default.deadline is None
    assert HealthCheck.too_slow in settings.default.suppress_health_check
    if os.environ.get("HYPOTHESIS_PROFILE", "sendledger") == "sendledger":
        assert settings.default.derandomize


@given(st.integers())
def test_a_given_without_settings_inherits_no_deadline(_: int) -> None:
    assert settings().deadline is None


def _settings_calls(tree: ast.AST) -> list[ast.Call]:
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and (
            (isinstance(node.func, ast.Name) and node.func.id == "settings")
            or (isinstance(node.func, ast.Attribute) and node.func.attr == "settings")
        )
    ]


def test_no_settings_brings_a_deadline_back() -> None:
    offenders = []
    for path in sorted(TESTS.rglob("test_*.py")):
        for call in _settings_calls(ast.parse(path.read_text(encoding="utf-8"))):
            for keyword in call.keywords:
                value = keyword.value
                if keyword.arg == "deadline" and not (
                    isinstance(value, ast.Constant) and value.value is None
                ):
                    offenders.append(f"{path.relative_to(TESTS)}:{call.lineno}")
    # a per-example deadline makes a test's verdict depend on the machine's load
    assert offenders == []

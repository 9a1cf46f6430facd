"""The web libraries stay inside `daemon/api`: the CLI, the engine and the domain never
import FastAPI, uvicorn, Starlette, prometheus_client or Jinja2 (docs/http-api.md "HTTP API")."""

from __future__ import annotations

from tests.unit.test_layers import SRC, imports, modules, under

WEB = ("fastapi", "uvicorn", "starlette", "prometheus_client", "jinja2", "multipart")


def test_web_libraries_are_imported_only_in_the_api_package() -> None:
    outside = [
        path
        for package in ("ledger", "policies", "daemon", "testkit")
        for path in modules(package)
        if SRC / "daemon" / "api" not in path.parents and under(imports(path), *WEB)
    ]
    assert outside == []


def test_the_engine_knows_its_observer_only_by_protocol() -> None:
    for path in modules("daemon"):
        if SRC / "daemon" / "engine" in path.parents:
            assert not under(imports(path), "daemon.api"), path

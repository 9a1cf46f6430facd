"""A real API server for tests: uvicorn on a free loopback port over a real SQLite store,
with a policy folder and a token file in the test's tmp dir."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from daemon.api.build import api_context, server_for
from daemon.config.settings import Settings, settings_from_dict
from daemon.engine import PolicyHolder
from daemon.from_settings import load_policies
from ledger.application import Ledger

TOKEN = "alice-token-0123456789abcdef"
OTHER_TOKEN = "bob-token-0123456789abcdef00"
POLICY = """provider = "support"
from = "Support <support@example.com>"
message_id_domain = "mail.example.com"
on_unknown = "review"
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def write_config(tmp: Path, store_url: str, *, max_body: str = "40MB") -> Settings:
    (tmp / "policies").mkdir(exist_ok=True)
    (tmp / "policies" / "receipts.toml").write_text(POLICY)
    (tmp / "api-tokens").write_text(f"# who:token\nalice:{TOKEN}\n{OTHER_TOKEN}\n")
    (tmp / "sa.json").write_text("{}")
    data: dict[str, Any] = {
        "store": {"url": store_url},
        "daemon": {"policies_dir": "policies"},
        "providers": {"support": {"credentials_file": "sa.json"}},
        "api": {
            "listen": f"127.0.0.1:{free_port()}",
            "token_file": "api-tokens",
            "max_body": max_body,
        },
    }
    return settings_from_dict(data, config_path=tmp / "sendledger.toml")


@dataclass
class Api:
    url: str
    ledger: Ledger
    client: httpx.Client

    def auth(self, token: str = TOKEN) -> dict[str, str]:
        return {"Authorization": f"Bearer {token}"}


@contextmanager
def running_api(settings: Settings) -> Iterator[Api]:
    with Ledger(settings.store.url, base_dir=settings.base_dir) as ledger:
        policies = PolicyHolder(lambda: load_policies(settings))
        ctx = api_context(settings, ledger, policies, dict.fromkeys(settings.providers))
        server = server_for(settings, ctx)
        server.start()
        try:
            url = f"http://{settings.api.listen}"
            with httpx.Client(base_url=url, timeout=10) as client:
                yield Api(url, ledger, client)
        finally:
            server.stop()


def job(key: str = "order-1", **changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "channel": "receipts",
        "key": key,
        "to": "Customer <customer@example.org>",
        "subject": "Your receipt",
        "body": "Thanks.",
    }
    base.update(changes)
    return base

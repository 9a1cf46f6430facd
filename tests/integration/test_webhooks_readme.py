"""The receiver snippets of docs/http-api.md "Webhooks", run as printed: the standard-library Python
one, and the n8n Code node (JavaScript, under Node.js with n8n's `$input`, `$env` and
`this.helpers` stood in for). Both must accept what the daemon signs and refuse a body
that was changed."""

from __future__ import annotations

import base64
import json
import re
import shutil
import subprocess
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from tests.conftest import IN_CI

from daemon.webhooks.signing import new_secret, signed_headers

PAGE = Path(__file__).resolve().parents[2] / "docs" / "http-api.md"
BODY = '{"type":"confirmed","key":"order-1","channel":"receipts","state":"confirmed","reason":null}'


def webhooks_blocks(language: str) -> list[str]:
    text = PAGE.read_text(encoding="utf-8")
    section = text.split("\n## Webhooks\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(rf"```{language}\n(.*?)```", section, re.S)


def signed(body: str) -> tuple[str, dict[str, str]]:
    secret = new_secret()
    return secret, signed_headers(secret, "evt_0123_4", datetime.now(UTC), body)


def test_the_standard_library_snippet_verifies_a_delivery() -> None:
    [snippet] = [b for b in webhooks_blocks("python") if "def verified(" in b]
    scope: dict[str, Any] = {}
    exec(snippet, scope)
    secret, headers = signed(BODY)
    assert scope["verified"](secret, BODY.encode(), headers)
    assert not scope["verified"](secret, BODY.replace("order-1", "order-2").encode(), headers)
    assert not scope["verified"](new_secret(), BODY.encode(), headers)


def _node() -> str:
    node = shutil.which("node")
    if node is None:
        if IN_CI:
            pytest.fail("CI is set: the n8n snippet needs Node.js")
        pytest.skip("Node.js is not installed")
    return node


def run_code_node(snippet: str, secret: str, headers: dict[str, str], body: bytes) -> Any:
    stand_ins = [
        f"const $input = {{ first: () => ({{ json: {{ headers: {json.dumps(headers)} }} }}) }};",
        f"const $env = {{ SENDLEDGER_WEBHOOK_SECRET: {json.dumps(secret)} }};",
        "const helpers = { getBinaryDataBuffer: async () => "
        f"Buffer.from({json.dumps(base64.b64encode(body).decode())}, 'base64') }};",
    ]
    harness = "\n".join(
        [
            *stand_ins,
            "(async function () {",
            snippet,
            "}).call({ helpers })",
            "  .then((out) => console.log(JSON.stringify(out)))",
            "  .catch((err) => { console.log(JSON.stringify({ error: err.message })); });",
        ]
    )
    done = subprocess.run(
        [_node(), "-e", harness], capture_output=True, text=True, timeout=30, check=True
    )
    return json.loads(done.stdout)


def test_the_n8n_code_node_snippet_verifies_a_delivery() -> None:
    [snippet] = webhooks_blocks("javascript")
    secret, headers = signed(BODY)
    out = run_code_node(snippet, secret, headers, BODY.encode())
    assert out == [{"json": json.loads(BODY)}]
    changed = run_code_node(snippet, secret, headers, BODY.replace("1", "2").encode())
    assert changed == {"error": "sendledger webhook: bad signature"}
    stale = signed_headers(secret, "evt_0123_4", datetime(2020, 1, 1, tzinfo=UTC), BODY)
    assert run_code_node(snippet, secret, stale, BODY.encode()) == changed

"""The test kit stands alone: importing it pulls in nothing from daemon, ledger or policies."""

from __future__ import annotations

import json
import subprocess
import sys

FORBIDDEN = ("daemon", "ledger", "policies")

# A fresh interpreter: in this one, other tests have already imported the daemon.
SCRIPT = f"""
import json, sys
import testkit
import testkit.credentials, testkit.gmail_emulator, testkit.mime_reader, testkit.relay
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] in {FORBIDDEN!r})))
"""


def test_importing_testkit_imports_nothing_from_the_daemon() -> None:
    result = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1]) == []


def test_public_api_is_importable_from_the_package() -> None:
    import testkit

    for name in testkit.__all__:
        assert hasattr(testkit, name), name

"""The systemd unit verifies cleanly, pointing at this installation's console script; the
package metadata builds without warnings."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tests.conftest import IN_CI

UNIT = Path(__file__).resolve().parents[2] / "packaging" / "sendledger.service"


def test_unit_file_declares_notify_and_hardening() -> None:
    text = UNIT.read_text(encoding="utf-8")
    for line in (
        "Type=notify",
        "WatchdogSec=",
        "ExecReload=/bin/kill -HUP $MAINPID",
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "TimeoutStopSec=30",
    ):
        assert line in text


def test_systemd_analyze_verify_is_clean(tmp_path: Path) -> None:
    if shutil.which("systemd-analyze") is None:
        # `make test` installs the systemd package as root (TEST_PACKAGES).
        if IN_CI:
            pytest.fail("CI is set, this test must run: systemd-analyze is not installed")
        pytest.skip("systemd-analyze is not installed (Debian package systemd)")
    script = Path(sys.executable).parent / "sendledger"
    assert script.exists(), "the console script is installed next to the interpreter"
    unit = tmp_path / "sendledger.service"
    unit.write_text(
        UNIT.read_text(encoding="utf-8").replace(
            "/opt/sendledger/.venv/bin/sendledger", str(script)
        ),
        encoding="utf-8",
    )
    result = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60
    )
    problems = [
        line
        for line in (result.stdout + result.stderr).splitlines()
        if "sendledger.service" in line
    ]
    assert result.returncode == 0 and not problems, result.stdout + result.stderr


def test_license_is_an_spdx_expression_with_a_backend_that_reads_it() -> None:
    """A `license = {text = ...}` table makes setuptools >= 77 (what pip's build isolation
    installs) warn on every install; the SPDX string needs setuptools >= 77."""
    import tomllib

    with (UNIT.parents[1] / "pyproject.toml").open("rb") as handle:
        project = tomllib.load(handle)
    assert project["project"]["license"] == "Apache-2.0"
    assert "setuptools>=77" in project["build-system"]["requires"]

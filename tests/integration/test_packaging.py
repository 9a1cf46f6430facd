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
    ):
        assert line in text


def test_the_stop_timeout_is_above_the_daemons_longest_wait() -> None:
    """docs/operations.md "Stopping": systemd's SIGKILL must never cut the daemon's own
    bounded wait short, in the shipped unit as in the one `init` writes."""
    from daemon.cli.init_command import installation, unit_text
    from daemon.config.settings import DEFAULT_STOP_TIMEOUT, DaemonSettings
    from daemon.systemd import timeout_stop_sec

    assert DaemonSettings().stop_timeout == DEFAULT_STOP_TIMEOUT
    wanted = f"TimeoutStopSec={timeout_stop_sec(DEFAULT_STOP_TIMEOUT)}\n"
    assert timeout_stop_sec(DEFAULT_STOP_TIMEOUT) > DEFAULT_STOP_TIMEOUT
    assert wanted in UNIT.read_text(encoding="utf-8")
    assert wanted in unit_text(installation(Path("/srv/mail")))
    said = f"at most daemon.stop_timeout ({DEFAULT_STOP_TIMEOUT:g} s by default)"
    assert said in UNIT.read_text(encoding="utf-8")


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

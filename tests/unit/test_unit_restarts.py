"""What systemd does with each exit code of `run` under the units sendledger ships and
writes, against the exit-code table (docs/cli.md "Exit codes"): the units' own keys, read
as systemd reads them, decide "restarted" or "not restarted" for every code of the table,
and the table's column says the same."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.unit.docs_page import keyed, section

from daemon import exit_codes
from daemon.cli.init_command import installation, unit_text
from ledger.exceptions import Refusal

SHIPPED = Path(__file__).resolve().parents[2] / "packaging" / "sendledger.service"


def _service_keys(text: str) -> dict[str, str]:
    """The [Service] section's keys; a key given again overrides (as these are)."""
    keys: dict[str, str] = {}
    section_name = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section_name = line
        elif section_name == "[Service]":
            key, _, value = line.partition("=")
            keys[key.strip()] = value.strip()
    return keys


def _restarted(keys: dict[str, str], code: int) -> bool:
    """systemd.service(5): Restart=on-failure restarts a main process that exited with a
    code other than 0, unless RestartPreventExitStatus= lists it."""
    assert keys["Restart"] == "on-failure"
    prevented = {int(word) for word in keys.get("RestartPreventExitStatus", "").split()}
    return code != 0 and code not in prevented


@pytest.mark.parametrize("unit", ["shipped", "init"])
def test_each_exit_code_is_restarted_as_the_table_says(unit: str) -> None:
    text = (
        SHIPPED.read_text(encoding="utf-8")
        if unit == "shipped"
        else unit_text(installation(Path("/srv/mail")))
    )
    keys = _service_keys(text)
    rows = keyed(section("cli.md", "### Exit codes"), "Code")
    said = {int(code): cells[1] for code, cells in rows.items()}
    done = {code: _restarted(keys, code) for code in said}
    assert {c for c, text in said.items() if text.startswith("restarted")} == {
        c for c, restarted in done.items() if restarted
    }
    assert {c for c, text in said.items() if text.startswith("not restarted")} == {
        c for c, restarted in done.items() if not restarted
    }
    # A config refused (bad input) is never tried again; what may come later (a store out
    # of reach, a secret file not there yet: exit 1) and a live daemon of the name (3) are.
    assert not done[exit_codes.REFUSAL_CODES[Refusal.BAD_INPUT]]
    assert done[exit_codes.REFUSAL_CODES[Refusal.UNAVAILABLE]]
    assert done[exit_codes.EXIT_FAILURE] and done[exit_codes.EXIT_CONFLICT]

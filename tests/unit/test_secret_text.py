"""The one reader of secret files (passwords, API tokens, store keys)."""

from __future__ import annotations

from pathlib import Path

import pytest

from daemon.config.secret_text import content_lines, read_secret_text


def test_missing_and_non_utf8_files_are_one_line_reasons(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cannot read"):
        read_secret_text(tmp_path / "absent")
    binary = tmp_path / "binary"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ValueError, match="not UTF-8"):
        read_secret_text(binary)


def test_content_lines_skip_blanks_and_comments_and_keep_numbers() -> None:
    text = "# tokens\n\n  alice:abc  \n#bob:old\nbob:def\n"
    assert list(content_lines(text)) == [(3, "alice:abc"), (5, "bob:def")]

"""The one reader of secret files (passwords, API tokens, store keys)."""

from __future__ import annotations

from pathlib import Path

import pytest

from daemon.config.secret_text import content_lines, read_secret_text
from daemon.providers.smtp_imap import read_password_file


def test_missing_and_non_utf8_files_are_one_line_reasons(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cannot read"):
        read_secret_text(tmp_path / "absent")
    binary = tmp_path / "binary"
    binary.write_bytes(b"\xff\xfe\x00")
    with pytest.raises(ValueError, match="not UTF-8"):
        read_secret_text(binary)


def test_a_byte_order_mark_is_refused_naming_the_file(tmp_path: Path) -> None:
    """The SMTP password, the store's password, API tokens and webhook secrets are all
    read here: none may start with U+FEFF, which would become part of the secret."""
    marked = tmp_path / "password"
    marked.write_bytes(b"\xef\xbb\xbfs3cret\n")
    with pytest.raises(ValueError, match=r"password: starts with a byte order mark"):
        read_secret_text(marked)
    with pytest.raises(ValueError, match="byte order mark"):
        read_password_file(marked)
    marked.write_bytes("s3cret\ufeff\n".encode())  # not at the start: the secret's own
    assert read_password_file(marked) == "s3cret\ufeff"


def test_content_lines_skip_blanks_and_comments_and_keep_numbers() -> None:
    text = "# tokens\n\n  alice:abc  \n#bob:old\nbob:def\n"
    assert list(content_lines(text)) == [(3, "alice:abc"), (5, "bob:def")]

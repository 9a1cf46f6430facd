"""`sendledger submit` of hostile message text as a process (README "Message fields and
validation"): beyond a limit or unshowable, exit 2 with one line naming the field and
nothing written; a typed encoded word is accepted as text."""

from __future__ import annotations

from typing import Any

import pytest

from ledger.content import MAX_HEADER_VALUE, MAX_SUBJECT


def job(**overrides: Any) -> dict[str, Any]:
    return {
        "channel": "receipts",
        "key": "order-2001",
        "to": "Alice <alice@example.com>",
        "subject": "Your receipt",
        "body": "Thanks for your order.",
        **overrides,
    }


@pytest.mark.parametrize(
    ("overrides", "needle"),
    [
        ({"subject": "s" * (MAX_SUBJECT + 1)}, "subject: longer than"),
        ({"headers": {"X-Tag": "v" * (MAX_HEADER_VALUE + 1)}}, "headers.X-Tag: longer than"),
        ({"cc": ['"=?utf-8?q?a?=" <c@example.com>']}, "cc[0]: a display name must not"),
        (
            {
                "attachments": [
                    {
                        "filename": "=?utf-8?q?=2E=2E=2F.bashrc?=",
                        "content_type": "text/plain",
                        "content_base64": "aGk=",
                    }
                ]
            },
            "attachments[0].filename: must not contain '=?'",
        ),
    ],
)
def test_refused_with_one_line_naming_the_field(
    cli: Any, overrides: dict[str, Any], needle: str
) -> None:
    result = cli.submit(job(**overrides))
    assert result.code == 2, result.stderr
    assert result.stdout == ""
    [line] = result.error_lines
    assert needle in line, line
    assert not (cli.root / "ledger.sqlite").exists()


def test_a_typed_encoded_word_subject_is_accepted(cli: Any) -> None:
    result = cli.submit(job(subject="=?utf-8?q?Your_receipt=0D=0ABcc:_evil@attacker.example?="))
    assert result.code == 0, result.stderr
    assert result.json()["created"] is True

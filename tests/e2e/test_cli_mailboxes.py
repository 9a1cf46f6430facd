"""`submit` with a job's own `from`: refused (exit 2, naming the field, nothing written)
when the channel's policy allows no other mailbox (docs/cli.md, "Message fields")."""

from __future__ import annotations

from typing import Any

from tests.e2e.test_cli_intake import job, one_error_line


def test_a_refused_from_exits_2_naming_the_field(cli: Any) -> None:
    refused = cli.submit(job("own-from", **{"from": "Sales <sales@example.com>"}))
    assert refused.code == 2
    one_error_line(refused, "from", "allowed_from")
    assert cli.run("status", "own-from").code in (2, 4)
    bad = cli.submit(job("bad-from", **{"from": "not an address"}))
    assert bad.code == 2
    one_error_line(bad, "from")

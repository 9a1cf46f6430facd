"""Who acted, without `--by`: the login name as the name rule takes it (docs/cli.md
"Keys"). `LOGNAME` and `USER`, which the login name is read from first, hold any bytes:
one that is not UTF-8 arrived as lone surrogates, and `submit` failed with exit 1 (an
encoding error at the store's write) while `cancel` refused it as if given as `--by`.
Such a name gives way to the passwd entry's."""

from __future__ import annotations

import os
import pwd
from typing import Any

from tests.e2e.test_cli_intake import job

#: `café` in Latin-1, as `os.environ` holds it (surrogateescape).
NOT_UTF8 = "caf\udce9"


def test_a_login_name_that_is_not_utf8_gives_way_to_the_passwd_entry_s(cli: Any) -> None:
    env = {"USER": NOT_UTF8, "LOGNAME": NOT_UTF8}
    submitted = cli.submit(job("who"), env=env, fresh=True)
    assert submitted.code == 0, submitted.stderr
    cancelled = cli.run("cancel", "who", env=env, fresh=True)
    assert cancelled.code == 0, cancelled.stderr
    history = cli.run("history", "--json", "who").json()
    person = pwd.getpwuid(os.getuid()).pw_name
    assert history[0]["submitted_by"] == person
    assert history[-1]["by"] == person

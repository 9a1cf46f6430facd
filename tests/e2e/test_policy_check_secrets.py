"""`sendledger policy check` judges the secret files `run` reads at its start as `run`
reads them: each one missing or unreadable is one line naming its setting and its file,
exit 2, and no call leaves the host (docs/cli.md "Command line")."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

from tests.e2e.conftest import config_text

from testkit.credentials import write_service_account


def test_each_secret_file_run_could_not_read_is_one_line_and_nothing_is_called(
    cli: Any, tmp_path: Path
) -> None:
    # The token endpoint a check that fetched a token would call: nothing connects.
    with socket.socket() as token_server:
        token_server.bind(("127.0.0.1", 0))
        token_server.listen(1)
        token_server.settimeout(0)
        port = token_server.getsockname()[1]
        (cli.root / "mail-password").mkdir()  # there, and a folder
        cli.config.write_text(
            config_text()
            + f'token_uri = "http://127.0.0.1:{port}/token"\n'
            + '[providers.mail]\nkind = "smtp-imap"\nsmtp_host = "127.0.0.1"\n'
            + 'smtp_security = "none"\nimap_host = "127.0.0.1"\nimap_security = "none"\n'
            + 'username = "support@example.com"\npassword_file = "mail-password"\n'
            + '[webhooks.ops]\nurl = "http://127.0.0.1:9/hook"\nsecret_file = "hook-secret"\n',
            encoding="utf-8",
        )
        checked = cli.run("policy", "check")
        assert checked.code == 2, checked.stderr
        assert checked.stdout == ""
        lines = checked.error_lines
        assert [line.split(": ", 1)[0] for line in lines] == [
            "providers.mail.password_file",
            "providers.support.credentials_file",
            "webhooks.ops.secret_file",
        ], checked.stderr
        assert f"{cli.root / 'mail-password'}: a directory" in lines[0], lines[0]
        assert f"cannot read {cli.root / 'x.json'}: No such file" in lines[1], lines[1]
        assert f"cannot read {cli.root / 'hook-secret'}: No such file" in lines[2], lines[2]

        # Put in place, the check passes, and still nothing was asked of the token endpoint.
        write_service_account(cli.root / "x.json", token_uri="http://127.0.0.1:1/token")
        (cli.root / "mail-password").rmdir()
        (cli.root / "mail-password").write_text("secret\n", encoding="utf-8")
        hook = cli.run("webhooks", "new-secret")
        (cli.root / "hook-secret").write_text(hook.stdout, encoding="utf-8")
        passed = cli.run("policy", "check")
        assert passed.code == 0, passed.stderr
        try:
            token_server.accept()
        except BlockingIOError:
            pass
        else:
            raise AssertionError("policy check called the token endpoint")


def test_a_key_file_that_holds_no_key_is_named_as_run_names_it(cli: Any) -> None:
    (cli.root / "x.json").write_text("{}\n", encoding="utf-8")
    checked = cli.run("policy", "check")
    assert checked.code == 2, checked.stderr
    assert checked.error_lines == [
        f"providers.support.credentials_file: {cli.root / 'x.json'}: unsupported credentials "
        "type None (expected 'service_account' or 'authorized_user')"
    ], checked.stderr
    # A folder checked alone is the policies alone: no config's secrets are judged.
    alone = cli.run("policy", "check", str(cli.policies))
    assert alone.code == 0, alone.stderr

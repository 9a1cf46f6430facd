"""Reading the small text files that hold secrets: a password, API tokens, store keys.

One place decides what "cannot be read" means for all of them, so every such setting
reports a missing, unreadable or non-UTF-8 file the same way; and each must be a regular
file of at most :data:`MAX_SECRET_BYTES` (a FIFO does not hang the command, a directory
or a symbolic link to nothing is named as such: `policies.files`). A file that is not
there is also said with what goes in it (:func:`missing_secret_hint`).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from ledger.exceptions import MayClearLater
from policies.files import BYTE_ORDER_MARK, FileMissing, read_regular_file, starts_with_a_mark

#: Secret files are small (a key, a password, a service-account JSON, a token list).
MAX_SECRET_BYTES = 1024 * 1024


class SecretFileMissing(FileMissing, MayClearLater):
    """A secret file that is not there: a secret mounted after the daemon's start may be
    there at its next start, so `run` refused for it exits 1, which the systemd unit
    restarts, not 2, which it does not (docs/cli.md "Exit codes")."""


def read_secret_text(path: Path) -> str:
    """The file's text. ValueError with a one-line reason when it cannot be read;
    SecretFileMissing when nothing is there."""
    try:
        data = read_regular_file(path, limit=MAX_SECRET_BYTES)
    except FileMissing as exc:
        raise SecretFileMissing(path, exc.reason) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not UTF-8 text") from None
    if starts_with_a_mark(text):
        # A Windows editor's mark, read as the first character of the password, token or
        # key: each would then fail where it is used (Azure, the server, a receiver
        # checking a signature) naming no file.
        raise ValueError(f"{path}: {BYTE_ORDER_MARK}")
    return text


def content_lines(text: str) -> Iterator[tuple[int, str]]:
    """(line number, stripped line) of every line that is neither blank nor a # comment."""
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if line and not line.startswith("#"):
            yield number, line


#: What goes in each secret file, by the setting's own name, and the page that says how
#: to make it: a first run most often stops at a secret not put in place yet, and "No
#: such file or directory" says where it goes, not what. The store key is not here: a
#: fresh key for a store that has one would leave its events unreadable.
_WHAT_GOES_THERE = {
    "credentials_file": "put the provider's JSON key there, chmod 600 "
    '(docs/providers.md "Gmail setup"), or write a config for the emulator with '
    "`sendledger init --emulator`",
    "password_file": "put the mailbox's password there, on its first line, chmod 600 "
    '(docs/providers.md "SMTP + IMAP setup")',
    "client_secret_file": "put the app registration's client secret there, on its first "
    'line, chmod 600 (docs/providers.md "Microsoft Graph setup")',
    "certificate_file": "put the app registration's certificate and its private key there "
    '(one PEM file), chmod 600 (docs/providers.md "Microsoft Graph setup")',
    "token_file": "write a name:token line there for each API user (16 or more printable "
    'characters a token), chmod 600 (docs/http-api.md "HTTP API")',
    "secret_file": "write the receiver's secret there (`sendledger webhooks new-secret`), "
    'chmod 600 (docs/http-api.md "Webhooks")',
}


def missing_secret_hint(setting: str, path: Path) -> str:
    """`"; what to do"` when the file `setting` names ("providers.mail.password_file")
    is not there, to follow the error that says so; else ""."""
    what = _WHAT_GOES_THERE.get(setting.rsplit(".", 1)[-1])
    if what is None or path.exists() or path.is_symlink():
        return ""
    return f"; {what}"

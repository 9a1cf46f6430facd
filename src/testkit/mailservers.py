"""Private Postfix + Dovecot instances on loopback: the real servers behind the SMTP + IMAP
tests and `sendledger demo --provider smtp-imap`.

Every config, queue, maildir, socket and log lives in one short folder under /tmp (Unix
socket paths are capped at 107 bytes, pytest's tmp paths are longer); listeners are on
127.0.0.1 ports the OS picked. Facts this relies on are measured in the workplace notes
(docs/providers.md "Providers" describes the server behaviour under test):

* Postfix submission on a loopback port, AUTH through Dovecot's auth socket, no TLS;
* every submitted message also goes to ``sender+Sent@`` (``sender_bcc_maps`` on the envelope
  sender), and Dovecot LMTP with ``lmtp_save_to_detail_mailbox`` files it in ``Sent``: the
  ``sent_copy = "server"`` behaviour of Gmail or Microsoft 365, by real servers;
* end-of-data answers chosen by recipient: ``defer@`` gets 451 and ``reject@`` gets 554
  after the final dot; ``unknown@`` is refused at RCPT (550);
* ``gone@`` is taken at submission (Postfix knows it) but Dovecot has no such user, so its
  LMTP refuses delivery (550 5.1.1) and Postfix's own bounce, an RFC 3464 report, lands
  in the sender's INBOX: a bounce as a real server writes it.

Copies are counted in the Maildir files, never through the provider under test. Starting the
pair needs the Debian packages (`apt-get install postfix dovecot-imapd dovecot-lmtpd`) and
root; `missing_reason()` says in one line what is missing. Like the rest of the test kit it
imports nothing from the daemon, the ledger or the policies.
"""

from __future__ import annotations

import contextlib
import grp
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from email.parser import BytesHeaderParser
from pathlib import Path

DOMAIN = "example.test"
SENDER = f"sender@{DOMAIN}"
RECIPIENT = f"rcpt@{DOMAIN}"
DEFER_RECIPIENT = f"defer@{DOMAIN}"
REJECT_RECIPIENT = f"reject@{DOMAIN}"
UNKNOWN_RECIPIENT = f"unknown@{DOMAIN}"
GONE_RECIPIENT = f"gone@{DOMAIN}"
PASSWORD = "s3cret-test-password"
MAIL_USER = "nobody"
POSTFIX_MASTER = Path("/usr/lib/postfix/sbin/master")
DOVECOT = Path("/usr/sbin/dovecot")
_USERS = ("sender", "rcpt", "defer", "reject")
INSTALL_HINT = (
    "install them as root with `apt-get install postfix dovecot-imapd dovecot-lmtpd`, "
    "or run `make test` as root"
)


def missing_reason() -> str | None:
    """Why the real servers cannot run here, or None."""
    if not POSTFIX_MASTER.exists() or shutil.which("postfix") is None:
        return f"postfix is not installed: {INSTALL_HINT}"
    if not DOVECOT.exists() or not Path("/usr/lib/dovecot/lmtp").exists():
        return f"dovecot-imapd / dovecot-lmtpd are not installed: {INSTALL_HINT}"
    if os.geteuid() != 0:
        return "private Postfix instances need root (queue ownership): run as root"
    return None


class MailServersMissing(RuntimeError):
    """The pair cannot start here; the message is `missing_reason()`."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _wait_greeting(port: int, log: Path, timeout: float = 15.0) -> None:
    """Until Postfix answers a session's greeting and EHLO: a listening port is master's,
    the answer needs an smtpd that started (and, for AUTH, found Dovecot's socket)."""
    import smtplib

    deadline = time.monotonic() + timeout
    while True:
        try:
            with smtplib.SMTP("127.0.0.1", port, timeout=2) as smtp:
                if smtp.ehlo()[0] == 250 and smtp.has_extn("auth"):
                    return
        except (OSError, smtplib.SMTPException):
            pass
        if time.monotonic() >= deadline:
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else "(no log)"
            raise RuntimeError(f"postfix smtpd did not greet on {port} within {timeout}s:\n{tail}")
        time.sleep(0.05)


def _wait_listening(
    port: int, what: str, log: Path, server: subprocess.Popen[bytes], timeout: float = 10.0
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            # A server that could not bind a port (taken since `free_port` found it free)
            # exits: no use waiting out the timeout for it (10 s a retried start).
            if server.poll() is not None:
                break
            time.sleep(0.02)
    tail = log.read_text(errors="replace")[-2000:] if log.exists() else "(no log)"
    ended = f", exit status {server.returncode}" if server.returncode is not None else ""
    raise RuntimeError(f"{what} did not listen on {port} within {timeout}s{ended}:\n{tail}")


@dataclass
class MailServers:
    """A running Postfix + Dovecot pair; see the module docstring."""

    root: Path
    smtp_port: int
    imap_port: int
    lmtp_port: int

    @property
    def maildir_root(self) -> Path:
        return self.root / "mail"

    def folder_files(self, user: str, folder: str) -> list[Path]:
        """The message files of one Maildir folder (INBOX or a subfolder)."""
        base = self.maildir_root / user / "Maildir"
        if folder.upper() != "INBOX":
            base = base / f".{folder}"
        return [
            p for sub in ("new", "cur") if (base / sub).is_dir() for p in (base / sub).iterdir()
        ]

    def message_ids(self, *, user: str = "sender", folder: str = "Sent") -> Counter[str]:
        """How many messages of `user`'s `folder` carry each Message-ID header."""
        parser = BytesHeaderParser()
        found: Counter[str] = Counter()
        for path in self.folder_files(user, folder):
            with path.open("rb") as handle:
                headers = parser.parse(handle)
            found[(headers.get("Message-ID") or "").strip()] += 1
        return found

    def copies(self, message_id: str, *, user: str = "sender", folder: str = "Sent") -> int:
        """Messages in `user`'s `folder` whose Message-ID header is exactly `message_id`."""
        return self.message_ids(user=user, folder=folder)[message_id]

    def wait_copies(
        self, message_id: str, expected: int, *, user: str = "sender", folder: str = "Sent"
    ) -> int:
        """The count once it reaches `expected` (delivery takes ~20 ms), or after 5 s."""
        deadline = time.monotonic() + 5.0
        while True:
            found = self.copies(message_id, user=user, folder=folder)
            if found >= expected or time.monotonic() > deadline:
                return found
            time.sleep(0.02)

    def settle(self, seconds: float = 0.3) -> None:
        """Give Postfix time to deliver anything still queued, so a count is final."""
        time.sleep(seconds)

    def config(self, password_file: Path, **overrides: object) -> dict[str, object]:
        """A `[providers.NAME]` table for these servers."""
        table: dict[str, object] = {
            "kind": "smtp-imap",
            "smtp_host": "127.0.0.1",
            "smtp_port": self.smtp_port,
            "smtp_security": "none",
            "imap_host": "127.0.0.1",
            "imap_port": self.imap_port,
            "imap_security": "none",
            "username": SENDER,
            "password_file": str(password_file),
            "sent_copy": "server",
            "timeout": "2s",
        }
        table.update(overrides)
        return table


def _chown(path: Path, user: str, group: str | None = None) -> None:
    uid = pwd.getpwnam(user).pw_uid
    gid = grp.getgrnam(group).gr_gid if group else -1
    os.chown(path, uid, gid)


def _write_dovecot(root: Path, imap_port: int, lmtp_port: int) -> Path:
    users = root / "users"
    users.write_text("".join(f"{u}@{DOMAIN}:{{PLAIN}}{PASSWORD}\n" for u in _USERS))
    conf = root / "dovecot.conf"
    conf.write_text(
        f"""
base_dir = {root}/d
state_dir = {root}/ds
instance_name = {root.name}
protocols = imap lmtp
listen = 127.0.0.1
log_path = {root}/dovecot.log
ssl = no
disable_plaintext_auth = no
auth_mechanisms = plain login
auth_failure_delay = 0
recipient_delimiter = +
lmtp_save_to_detail_mailbox = yes
mail_location = maildir:~/Maildir
mail_uid = {MAIL_USER}
mail_gid = {grp.getgrgid(pwd.getpwnam(MAIL_USER).pw_gid).gr_name}
first_valid_uid = {pwd.getpwnam(MAIL_USER).pw_uid}
passdb {{
  driver = passwd-file
  args = scheme=PLAIN username_format=%u {users}
}}
userdb {{
  driver = static
  args = uid={MAIL_USER} gid={pwd.getpwnam(MAIL_USER).pw_gid} home={root}/mail/%n
}}
namespace inbox {{
  inbox = yes
  separator = /
  mailbox Sent {{
    special_use = \\Sent
    auto = subscribe
  }}
  mailbox Drafts {{
    special_use = \\Drafts
    auto = create
  }}
  mailbox Trash {{
    special_use = \\Trash
    auto = create
  }}
}}
service imap-login {{
  inet_listener imap {{
    address = 127.0.0.1
    port = {imap_port}
  }}
  inet_listener imaps {{
    port = 0
  }}
}}
service lmtp {{
  inet_listener lmtp {{
    address = 127.0.0.1
    port = {lmtp_port}
  }}
}}
service auth {{
  unix_listener {root}/auth {{
    mode = 0666
  }}
}}
# No authentication penalty: after each refused login from 127.0.0.1 anvil made the next
# ones wait 2 s, then 4 s (a wrong-password test took 5 s, and slowed the tests after it).
service anvil {{
  unix_listener anvil-auth-penalty {{
    mode = 0
  }}
}}
"""
    )
    return conf


def _write_postfix(root: Path, smtp_port: int, lmtp_port: int) -> Path:
    etc = root / "postfix"
    etc.mkdir()
    queue = root / "queue"
    queue.mkdir()
    os.chmod(queue, 0o755)
    for name, owner, group, mode in (
        ("active", "postfix", None, 0o700),
        ("bounce", "postfix", None, 0o700),
        ("corrupt", "postfix", None, 0o700),
        ("defer", "postfix", None, 0o700),
        ("deferred", "postfix", None, 0o700),
        ("flush", "postfix", None, 0o700),
        ("hold", "postfix", None, 0o700),
        ("incoming", "postfix", None, 0o700),
        ("private", "postfix", None, 0o700),
        ("maildrop", "postfix", "postdrop", 0o730),
        ("public", "postfix", "postdrop", 0o710),
        ("pid", "root", None, 0o755),
        ("saved", "postfix", None, 0o700),
        ("trace", "postfix", None, 0o700),
    ):
        path = queue / name
        path.mkdir()
        _chown(path, owner, group)
        os.chmod(path, mode)
    data = root / "pfdata"
    data.mkdir()
    _chown(data, "postfix")
    # gone@: Postfix takes it, Dovecot (which has no such user) refuses its delivery.
    recipients = ", ".join(f"{u}@{DOMAIN}=ok" for u in (*_USERS, "gone"))
    (etc / "main.cf").write_text(
        f"""
compatibility_level = 3.6
queue_directory = {queue}
data_directory = {data}
mail_owner = postfix
setgid_group = postdrop
myhostname = mail.{DOMAIN}
mydomain = {DOMAIN}
myorigin = {DOMAIN}
mydestination =
inet_interfaces = 127.0.0.1
inet_protocols = ipv4
mynetworks = 127.0.0.0/8
maillog_file = {root}/postfix.log
maillog_file_prefixes = /var, /dev/stdout, /tmp
smtputf8_enable = no
biff = no
recipient_delimiter = +
virtual_mailbox_domains = {DOMAIN}
virtual_mailbox_maps = inline:{{ {recipients} }}
virtual_transport = lmtp:inet:127.0.0.1:{lmtp_port}
sender_bcc_maps = inline:{{ {SENDER}=sender+Sent@{DOMAIN} }}
smtpd_sasl_auth_enable = yes
smtpd_sasl_type = dovecot
smtpd_sasl_path = {root}/auth
smtpd_relay_restrictions = permit_sasl_authenticated, reject_unauth_destination
smtpd_end_of_data_restrictions = check_recipient_access inline:{{
    {{ {DEFER_RECIPIENT} = 451 4.3.0 deferred by the test server }},
    {{ {REJECT_RECIPIENT} = 554 5.7.1 rejected by the test server }} }}
smtpd_tls_security_level = none
smtpd_error_sleep_time = 0
# A service whose process died at start (a fatal error) is paused this long before master
# starts another; the default 60 s outlasts a whole test, and every client meanwhile
# waits for a greeting that never comes.
service_throttle_time = 1s
smtp_tls_security_level = none
lmtp_tls_security_level = none
alias_maps =
alias_database =
local_recipient_maps =
shlib_directory = /usr/lib/postfix
"""
    )
    (etc / "master.cf").write_text(
        f"""
127.0.0.1:{smtp_port} inet n - n - - smtpd
pickup    unix  n       -       n       60      1       pickup
cleanup   unix  n       -       n       -       0       cleanup
qmgr      unix  n       -       n       300     1       qmgr
tlsmgr    unix  -       -       n       1000?   1       tlsmgr
rewrite   unix  -       -       n       -       -       trivial-rewrite
bounce    unix  -       -       n       -       0       bounce
defer     unix  -       -       n       -       0       bounce
trace     unix  -       -       n       -       0       bounce
verify    unix  -       -       n       -       1       verify
flush     unix  n       -       n       1000?   0       flush
proxymap  unix  -       -       n       -       -       proxymap
smtp      unix  -       -       n       -       -       smtp
relay     unix  -       -       n       -       -       smtp
showq     unix  n       -       n       -       -       showq
error     unix  -       -       n       -       -       error
retry     unix  -       -       n       -       -       error
discard   unix  -       -       n       -       -       discard
lmtp      unix  -       -       n       -       -       lmtp
anvil     unix  -       -       n       -       1       anvil
scache    unix  -       -       n       -       1       scache
postlog   unix-dgram n  -       n       -       1       postlogd
"""
    )
    # Postfix re-reads a main.cf younger than ~2 s at start (300 ms per try): back-date.
    old = time.time() - 60
    for path in (etc / "main.cf", etc / "master.cf"):
        os.utime(path, (old, old))
    return etc


def _stop(*procs: subprocess.Popen[bytes] | None) -> None:
    """Each server's process group told to stop, then each master waited for. Each master
    leads a group of its own (`_start`) and its children are told with it: told alone,
    Postfix's master, whose own kill of its group fails in a group it does not lead, ended
    through its fatal-error path with its 1 s pause, and Dovecot's waited about a second
    for its children; 1.0 s a stop however told, 0.1 s so."""
    running = [p for p in procs if p is not None and p.poll() is None]
    for proc in running:
        _signal_group(proc, signal.SIGTERM)
    for proc in running:
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            _signal_group(proc, signal.SIGKILL)
            proc.wait(timeout=5)


def _signal_group(proc: subprocess.Popen[bytes], signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):  # the group ended meanwhile
        os.killpg(proc.pid, signum)


#: Starts tried: a port found free can be taken before the servers bind it.
START_ATTEMPTS = 3


def _start(
    root: Path, servers: MailServers
) -> tuple[subprocess.Popen[bytes], subprocess.Popen[bytes]]:
    """Dovecot and Postfix on `servers`' ports, each answering; RuntimeError when one does
    not (the processes started are left for the caller to stop: `_stop` takes None too)."""
    conf = _write_dovecot(root, servers.imap_port, servers.lmtp_port)
    etc = _write_postfix(root, servers.smtp_port, servers.lmtp_port)
    # Daemons inherit stdout/stderr: capturing them would hang; send them to files.
    with (root / "dovecot.out").open("wb") as out:
        dovecot = subprocess.Popen(
            [str(DOVECOT), "-F", "-c", str(conf)],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # a group of its own, its children's: `_stop`
        )
    try:
        with (root / "postfix.out").open("wb") as out:
            postfix = subprocess.Popen(
                [str(POSTFIX_MASTER), "-d", "-c", str(etc)],
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**os.environ, "MAIL_CONFIG": str(etc)},
                start_new_session=True,
            )
        try:
            _wait_listening(servers.imap_port, "dovecot imap", root / "dovecot.log", dovecot)
            _wait_listening(servers.lmtp_port, "dovecot lmtp", root / "dovecot.log", dovecot)
            _wait_listening(servers.smtp_port, "postfix smtpd", root / "postfix.out", postfix)
            _wait_greeting(servers.smtp_port, root / "postfix.log")
        except BaseException:
            _stop(postfix, None)
            raise
    except BaseException:
        _stop(None, dovecot)
        raise
    return dovecot, postfix


@contextmanager
def mail_servers() -> Iterator[MailServers]:
    """Start a private Postfix + Dovecot pair; stop both and remove every file after.

    Raises `MailServersMissing` when `missing_reason()` finds the pair cannot run here.
    """
    reason = missing_reason()
    if reason is not None:
        raise MailServersMissing(reason)
    for attempt in range(1, START_ATTEMPTS + 1):
        root = _new_root()
        servers = MailServers(root, free_port(), free_port(), free_port())
        try:
            dovecot, postfix = _start(root, servers)
        except RuntimeError:
            # A port found free can be taken before a server binds it (the kernel hands
            # the same range out to other processes' outgoing connections): "Address
            # already in use" in Dovecot's log; Postfix's master says it nowhere we read.
            # New ports and a new folder (a stopped Postfix leaves its state behind).
            _remove(root)
            if attempt == START_ATTEMPTS:
                raise
            continue
        try:
            yield servers
        finally:
            _stop(postfix, dovecot)
            _remove(root)
        return


def _new_root() -> Path:
    root = Path(tempfile.mkdtemp(prefix="slm-", dir="/tmp"))
    os.chmod(root, 0o755)  # unprivileged daemons (nobody, postfix, dovenull) walk into it
    mail = root / "mail"
    mail.mkdir()
    _chown(mail, MAIL_USER)
    return root


def _remove(root: Path) -> None:
    if not os.environ.get("SLM_KEEP"):
        shutil.rmtree(root, ignore_errors=True)

"""`sendledger init [DIR] [--provider gmail|smtp-imap|graph] [--mailbox ADDRESS]`: a working
starting point in DIR (README "Quick start").

It writes a commented config with only the keys a first run needs, two channel policies (one
that resends after an unknown outcome is ruled out, one that hands every unknown outcome to
a human), an API token file readable by its owner only, a first job to submit, and a systemd
unit whose paths are this installation's (the console script next to the running
interpreter, DIR). It never overwrites: every path is checked before the first is written,
and a file is created only if it does not exist (O_EXCL), so a refused or failed init leaves
nothing half-written.
"""

from __future__ import annotations

import argparse
import contextlib
import grp
import json
import os
import pwd
import secrets
import shlex
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from daemon.config.settings import DEFAULT_STOP_TIMEOUT, clear_text_elsewhere
from daemon.exit_codes import EXIT_FAILURE, EXIT_OK, CliError, bad_input
from daemon.systemd import timeout_stop_sec
from ledger.addresses import AddressError, Mailbox, parse_mailbox
from ledger.stores.mount_points import SystemMounts, unmounted_point

PROVIDERS = ("gmail", "smtp-imap", "graph")
# The [providers.NAME] each kind gets; the policies name it.
PROVIDER_NAMES = {"gmail": "gmail", "smtp-imap": "mail", "graph": "m365"}
RETRY_CHANNEL = "receipts"
REVIEW_CHANNEL = "notices"
FIRST_KEY = "first-job-1"
TOKEN_NAME = "admin"


@dataclass(frozen=True)
class Planned:
    """One file init writes: where (relative to DIR), what, its mode, and what it is for."""

    path: str
    text: str
    mode: int
    about: str


#: Where `init --emulator` expects `sendledger emulator gmail --port 8026` to listen.
DEFAULT_EMULATOR = "http://127.0.0.1:8026"
DEFAULT_LISTEN = "127.0.0.1:8025"


@dataclass(frozen=True)
class Emulated:
    """A config that runs against the bundled Gmail emulator as written (`init
    --emulator`, `sendledger try`): its endpoint (or a fault relay in front of it), its
    token endpoint, a search_after that fits its lag, and the API's address."""

    api_endpoint: str = DEFAULT_EMULATOR
    token_uri: str = DEFAULT_EMULATOR + "/token"
    search_after: str = "10s"
    listen: str = DEFAULT_LISTEN


@dataclass(frozen=True)
class Installation:
    """What the written files point at."""

    folder: Path  # DIR, absolute
    command: list[str]  # how to run sendledger here
    user: str
    group: str


def register(sub: Any) -> None:
    p = sub.add_parser(
        "init",
        help="write a starting config, two channel policies, an API token and a systemd unit",
        description="Write a working starting point into DIR (default: the current folder): "
        "sendledger.toml, policies/, api-tokens (0600), first-job.json and sendledger.service. "
        "Refuses (exit 2) if any of those files exists; nothing is overwritten.",
    )
    p.add_argument("dir", nargs="?", default=".", metavar="DIR", help="folder (created if missing)")
    p.add_argument("--provider", choices=PROVIDERS, default="gmail", help="default: gmail")
    p.add_argument(
        "--mailbox",
        default="support@example.com",
        help="the mailbox that sends: the provider's user and the policies' From "
        "(default: support@example.com, to edit later)",
    )
    p.add_argument(
        "--emulator",
        nargs="?",
        const=DEFAULT_EMULATOR,
        metavar="URL",
        help="a config for the bundled Gmail emulator at URL (default "
        f"{DEFAULT_EMULATOR}), which runs unchanged against `sendledger emulator gmail "
        "--port 8026`; gmail only",
    )
    p.set_defaults(func=cmd_init)


def cmd_init(args: argparse.Namespace) -> int:
    try:
        mailbox = parse_mailbox(args.mailbox)
    except AddressError as exc:
        raise bad_input(f"--mailbox: {exc}") from None
    if mailbox.display_name:
        raise bad_input("--mailbox: an address without a display name (support@example.com)")
    folder = Path(os.path.abspath(args.dir))
    if folder.exists() and not folder.is_dir():
        raise bad_input(f"DIR: {folder} exists and is not a folder")
    unsafe = _unit_unsafe(str(folder))
    if unsafe:
        raise bad_input(f"DIR: {folder}: {unsafe}, which a systemd unit cannot name")
    point = unmounted_point(folder, SystemMounts())
    if point is not None:
        # Written to the folder beneath, the config and the store's place would vanish
        # once the disk is mounted over them (docs/operations.md "A store on a disk of its
        # own"): exit 1, as the store's own refusal, since the mount may come.
        raise CliError(
            f"DIR: {folder} is on {point.path}, a mount point ({point.named_in}) with no "
            "file system mounted on it: mount it first; nothing was written",
            EXIT_FAILURE,
        )
    emulated = None
    if args.emulator is not None:
        if args.provider != "gmail":
            raise bad_input("--emulator: the bundled emulator is Gmail's: --provider gmail only")
        endpoint = args.emulator.rstrip("/")
        if not endpoint.startswith(("http://", "https://")):
            raise bad_input(f"--emulator: an http(s) URL expected, got {args.emulator!r}")
        emulated = Emulated(api_endpoint=endpoint, token_uri=endpoint + "/token")
    here = installation(folder)
    plan = planned_files(args.provider, mailbox, here, emulated)
    existing = [p.path for p in plan if (folder / p.path).exists()]
    for item in plan:
        for parent in (folder / item.path).parents:
            if parent.exists() and not parent.is_dir():
                raise bad_input(f"init: {parent} is not a folder; nothing was written")
    if existing:
        raise bad_input(
            f"init: {folder} already has {', '.join(existing)}; nothing was written "
            "(move them away or choose another DIR)"
        )
    write_all(folder, plan)
    print(summary(args.provider, mailbox, here, plan, emulated))
    return EXIT_OK


def console_command() -> list[str]:
    """How to run this installation's sendledger: the console script next to the running
    interpreter, else `python -m daemon`. The venv's bin folder as the interpreter was
    started from it: resolving the symlink would name the system python, outside the venv."""
    script = Path(os.path.abspath(sys.executable)).with_name("sendledger")
    return [str(script)] if os.access(script, os.X_OK) else [sys.executable, "-m", "daemon"]


def installation(folder: Path) -> Installation:
    command = console_command()
    uid, gid = os.geteuid(), os.getegid()
    try:
        user = pwd.getpwuid(uid).pw_name
    except KeyError:
        user = str(uid)
    try:
        group = grp.getgrgid(gid).gr_name
    except KeyError:
        group = str(gid)
    return Installation(folder, command, user, group)


def write_all(folder: Path, plan: list[Planned]) -> None:
    """Create every file exclusively; on any failure remove the files and folders this
    call created."""
    created: list[Path] = []
    try:
        for item in plan:
            path = folder / item.path
            missing = [p for p in (path.parent, *path.parent.parents) if not p.exists()]
            path.parent.mkdir(parents=True, exist_ok=True)
            created.extend(reversed(missing))  # removed in reverse: files, then folders
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, item.mode)
            created.append(path)
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(item.text)
            os.chmod(path, item.mode)  # the umask may have taken bits the file needs
    except FileExistsError as exc:
        _remove(created)
        raise bad_input(f"init: {exc.filename} appeared while writing; nothing was kept") from None
    except OSError as exc:
        _remove(created)
        raise bad_input(f"init: cannot write {exc.filename}: {exc.strerror}") from None


def _remove(paths: list[Path]) -> None:
    """Files first, then folders, each folder only if it is empty."""
    for path in reversed(paths):
        with contextlib.suppress(OSError):
            if path.is_dir():
                path.rmdir()
            else:
                path.unlink(missing_ok=True)


def planned_files(
    provider: str, mailbox: Mailbox, here: Installation, emulated: Emulated | None = None
) -> list[Planned]:
    name = PROVIDER_NAMES[provider]
    search_after = emulated.search_after if emulated else "5m"
    return [
        Planned("sendledger.toml", config_text(provider, mailbox, emulated), 0o644, "the config"),
        Planned(
            f"policies/{RETRY_CHANNEL}.toml",
            retry_policy(name, mailbox, search_after),
            0o644,
            f'channel "{RETRY_CHANNEL}": on_unknown = "retry"',
        ),
        Planned(
            f"policies/{REVIEW_CHANNEL}.toml",
            review_policy(name, mailbox),
            0o644,
            f'channel "{REVIEW_CHANNEL}": on_unknown = "review"',
        ),
        Planned(
            "api-tokens",
            f"{TOKEN_NAME}:{secrets.token_urlsafe(32)}\n",
            0o600,
            f'the API token "{TOKEN_NAME}" (mode 0600)',
        ),
        Planned("first-job.json", first_job(mailbox), 0o644, "a job to submit"),
        Planned("sendledger.service", unit_text(here), 0o644, "a systemd unit for this install"),
    ]


# -- the files ------------------------------------------------------------------------------

_CONFIG_HEAD = """\
# sendledger configuration, written by `sendledger init`: only what a first run needs.
# Every other setting, commented, is in config.example.toml (docs/configuration.md "Configuration").
# Relative paths are relative to this file's folder. Any key can be overridden from the
# environment: SENDLEDGER_<SECTION>__<KEY>, e.g. SENDLEDGER_STORE__URL.

[store]
# One SQLite file next to this config. Several daemons sharing the work: a
# postgresql://user@host:5432/db URL (docs/performance.md "Performance and scaling").
url = "sqlite:///ledger.sqlite"

[daemon]
# One TOML file per channel; `sendledger policy check` validates them, SIGHUP reloads.
policies_dir = "policies"

[api]
# The HTTP API, /healthz, /metrics and the review page /ui/ (docs/http-api.md "HTTP API"), served by
# `sendledger run`. Loopback only: put a TLS proxy in front to reach it from elsewhere.
listen = "{listen}"
# One "name:token" a line; the name is recorded as who resolved a review.
token_file = "api-tokens"

"""

_PROVIDER_SECTIONS: dict[str, Callable[[Mailbox], str]] = {
    "gmail": lambda m: (
        f"""\
[providers.gmail]
kind = "gmail"
# EDIT: a service-account JSON with domain-wide delegation for `user` (scopes gmail.send
# and gmail.readonly), or an authorized_user JSON with user = "me". docs/providers.md "Gmail setup".
credentials_file = "gmail-service-account.json"
# EDIT: the mailbox that sends; the policies' `from` must be this address.
user = "{m.addr_spec}"
# Every call to Gmail (send, search, read-back) gives up after this long.
timeout = "30s"
# "drafts": send through a draft (a handle Gmail enforces; needs the gmail.compose scope
# too). Run `sendledger probe` to see which path your mailbox keeps honest.
send_via = "messages"
"""
    ),
    "smtp-imap": lambda m: (
        f"""\
[providers.mail]
kind = "smtp-imap"
# EDIT: your provider's submission and IMAP servers (docs/providers.md "Providers").
smtp_host = "smtp.{m.domain}"
smtp_port = 587
smtp_security = "starttls"           # "tls" (implicit, usually 465), "starttls" (587)
imap_host = "imap.{m.domain}"
imap_port = 993
imap_security = "tls"
# EDIT: the login for both; also the envelope sender.
username = "{m.addr_spec}"
# The password is this file's first line (chmod 600).
password_file = "mail-password"
# "server": the submission server files the sent copy (Gmail, Microsoft 365, most hosts);
# the search of the sent folder depends on it.
sent_copy = "server"
timeout = "30s"
"""
    ),
    "graph": lambda m: (
        f"""\
[providers.m365]
kind = "graph"
# EDIT: the Entra ID (Azure AD) tenant and the app registration with the application
# permissions Mail.Send and Mail.ReadWrite for `user` (docs/providers.md "Microsoft
# Graph setup").
tenant_id = "00000000-0000-0000-0000-000000000000"
client_id = "00000000-0000-0000-0000-000000000000"
# The client secret is this file's first line (chmod 600).
client_secret_file = "graph-secret"
# EDIT: the mailbox that sends; the policies' `from` must be this address.
user = "{m.addr_spec}"
# Each Graph request; a send is up to three plus confirm_wait, within daemon.deadline_grace.
timeout = "10s"
"""
    ),
}

_SECRETS = {
    "gmail": "gmail-service-account.json",
    "smtp-imap": "mail-password",
    "graph": "graph-secret",
}


def _emulator_clear_text(emulated: Emulated) -> str:
    # The emulator's tokens are its own (no Google secret travels): plain http to it on
    # another host is allowed where the config is written, not refused at its load.
    if clear_text_elsewhere(emulated.api_endpoint):
        return "\n# The emulator's own tokens in clear text: no Google secret.\nallow_http = true"
    return ""


def _emulated_gmail(mailbox: Mailbox, emulated: Emulated) -> str:
    return f"""\
[providers.gmail]
kind = "gmail"
# The bundled Gmail emulator (`sendledger emulator gmail`), NOT Gmail: it accepts any
# mailbox and keeps what it is sent in memory. For a real mailbox, `sendledger init`
# without --emulator writes this section with the two values to edit (docs/providers.md
# "Gmail setup").
api_endpoint = "{emulated.api_endpoint}"
token_uri = "{emulated.token_uri}"{_emulator_clear_text(emulated)}
# Written by `sendledger emulator gmail --write-service-account` (a throw-away key the
# emulator accepts).
credentials_file = "gmail-service-account.json"
user = "{mailbox.addr_spec}"
timeout = "30s"
"""


def config_text(provider: str, mailbox: Mailbox, emulated: Emulated | None = None) -> str:
    head = _CONFIG_HEAD.replace("{listen}", emulated.listen if emulated else DEFAULT_LISTEN)
    if emulated is not None:
        return head + _emulated_gmail(mailbox, emulated)
    return head + _PROVIDER_SECTIONS[provider](mailbox)


def _policy_head(provider_name: str, mailbox: Mailbox) -> str:
    return (
        f'provider = "{provider_name}"\n'
        f'from = "Support <{mailbox.addr_spec}>"\n'
        "# Every job's Message-ID ends in @this domain; keep it once jobs exist.\n"
        f'message_id_domain = "mail.{mailbox.domain}"\n'
    )


def retry_policy(provider_name: str, mailbox: Mailbox, search_after: str = "5m") -> str:
    return (
        "# A channel where a second copy would be a nuisance, not a harm (docs/policies.md\n"
        '# "Channel policies"). After an unknown outcome the daemon waits, searches the\n'
        "# sent mail, confirms one copy, and resends (same Message-ID) only after\n"
        "# `confirm_misses` searches found none.\n"
        + _policy_head(provider_name, mailbox)
        + 'on_unknown = "retry"\n'
        + f'search_after = "{search_after}"'.ljust(37)
        + "# the search index lags behind the send\n"
        "confirm_misses = 2\n"
        "max_attempts = 3\n"
    )


def review_policy(provider_name: str, mailbox: Mailbox) -> str:
    return (
        "# A channel where a second copy would do harm: every unknown outcome goes to a\n"
        "# human, who runs `sendledger review check KEY` (a search now) and then\n"
        "# `sendledger review resolve KEY --as sent|resend|abandon`.\n"
        + _policy_head(provider_name, mailbox)
        + 'on_unknown = "review"\n'
        "irreversible = true                  # never resend without a human\n"
    )


def first_job(mailbox: Mailbox) -> str:
    job = {
        "channel": RETRY_CHANNEL,
        "key": FIRST_KEY,
        "to": mailbox.addr_spec,
        "subject": "sendledger works",
        "body": "This message was sent by sendledger, to the mailbox it sends from.\n",
    }
    return json.dumps(job, indent=2) + "\n"


_HARDENING = """\
NoNewPrivileges=yes
ProtectSystem=strict
PrivateDevices=yes
ProtectKernelTunables=yes
ProtectKernelModules=yes
ProtectKernelLogs=yes
ProtectControlGroups=yes
ProtectClock=yes
ProtectHostname=yes
ProtectProc=invisible
ProcSubset=pid
RestrictNamespaces=yes
RestrictRealtime=yes
RestrictSUIDSGID=yes
LockPersonality=yes
MemoryDenyWriteExecute=yes
RemoveIPC=yes
RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6
SystemCallArchitectures=native
SystemCallFilter=@system-service
SystemCallFilter=~@privileged @resources
CapabilityBoundingSet=
AmbientCapabilities=
UMask=0077
"""

_HOMES = ("/home", "/root", "/run/user")


def _under(path: str, tops: tuple[str, ...]) -> bool:
    return any(path == top or path.startswith(top + "/") for top in tops)


def _under_home(path: str) -> bool:
    return _under(path, _HOMES)


def _unit_unsafe(value: str) -> str | None:
    """Why a path cannot be written into a unit file (None: it can)."""
    for char in value:
        if char in "\n\r\"'\\" or not char.isprintable():
            return f"it contains {char!r}"
    return None


_STOP = f"{DEFAULT_STOP_TIMEOUT:g} s"


def _specifiers_escaped(value: str) -> str:
    """`%` doubled: systemd reads `%x` as a specifier."""
    return value.replace("%", "%%")


def _unit_word(value: str) -> str:
    """One argument of a unit's command line or path list, quoted when it holds a space."""
    value = _specifiers_escaped(value)
    return f'"{value}"' if " " in value else value


def unit_text(here: Installation) -> str:
    folder = str(here.folder)
    config = str(here.folder / "sendledger.toml")
    exec_start = " ".join(_unit_word(w) for w in [*here.command, "--config", config, "run"])
    # ProtectHome=yes hides every home folder; when this installation lives in one, the
    # daemon still needs to read it (and write DIR, which ReadWritePaths grants).
    homes = "read-only" if _under_home(folder) or _under_home(here.command[0]) else "yes"
    # PrivateTmp=yes would mount an empty /tmp over a DIR kept there.
    private_tmp = "no" if _under(folder, ("/tmp", "/var/tmp")) else "yes"
    root_note = (
        "# As written it runs as root. Better: a user of its own, e.g.\n"
        f"#   useradd --system --home {folder} sendledger && chown -R sendledger {folder}\n"
        "# then User=sendledger and Group=sendledger below.\n"
        if here.user == "root"
        else ""
    )
    return f"""\
# sendledger, written by `sendledger init` for this installation (docs/operations.md "Running under
# systemd"). Install and start it:
#   sudo cp {_unit_word(str(here.folder / "sendledger.service"))} /etc/systemd/system/
#   sudo systemctl daemon-reload && sudo systemctl enable --now sendledger
{root_note}
[Unit]
Description=sendledger email send ledger and reconciler
# The commented config this unit runs with; it names the docs/ pages for the rest.
Documentation={_specifiers_escaped((here.folder / "sendledger.toml").as_uri())}
After=network-online.target
Wants=network-online.target
# Started once the file systems of DIR (config, policies, store) are mounted, never on
# the empty folder beneath a disk not mounted yet; a store.url elsewhere adds its folder
# (docs/operations.md "A store on a disk of its own").
RequiresMountsFor={_unit_word(folder)}

[Service]
Type=notify
NotifyAccess=main
ExecStart={exec_start}
ExecReload=/bin/kill -HUP $MAINPID
# SIGTERM lets in-flight provider calls finish and record their outcome; the daemon
# waits for them at most daemon.stop_timeout ({_STOP} by default), then ends itself.
# The stop tells systemd how long it takes (EXTEND_TIMEOUT_USEC); an older systemd
# (before 236) goes by TimeoutStopSec: raise both together (docs/operations.md "Stopping").
KillSignal=SIGTERM
TimeoutStopSec={timeout_stop_sec(DEFAULT_STOP_TIMEOUT)}
WatchdogSec=60
Restart=on-failure
# Exit 2 is a config it can never start with: not restarted, it would only be refused
# again every 5 s. A secret file not there yet, a store out of reach or its folder's
# disk not mounted yet is exit 1, and restarted: a secret or a disk mounted late is read
# at the next start (docs/cli.md "Exit codes").
RestartPreventExitStatus=2
RestartSec=5
User={here.user}
Group={here.group}
WorkingDirectory={_specifiers_escaped(folder)}
Environment=PYTHONUNBUFFERED=1

# Hardening: the daemon needs its folder (config, policies, store), its secrets and
# outbound HTTPS, SMTP or IMAP.
ReadWritePaths={_unit_word(folder)}
ProtectHome={homes}
PrivateTmp={private_tmp}
{_HARDENING}
[Install]
WantedBy=multi-user.target
"""


# -- what to do next -----------------------------------------------------------------------


def summary(
    provider: str,
    mailbox: Mailbox,
    here: Installation,
    plan: list[Planned],
    emulated: Emulated | None = None,
) -> str:
    folder = here.folder
    cli = " ".join(shlex.quote(w) for w in here.command)
    config = shlex.quote(str(folder / "sendledger.toml"))
    width = max(len(p.path) for p in plan)
    lines = [f"sendledger init: wrote {folder}/"]
    lines += [f"  {p.path.ljust(width)}  {p.about}" for p in plan]
    if emulated is not None:
        port = emulated.api_endpoint.rsplit(":", 1)[-1].split("/", 1)[0]
        account = shlex.quote(str(folder / "gmail-service-account.json"))
        accepted = shlex.quote(str(folder / "accepted.jsonl"))
        lines += [
            "",
            "This config runs against the bundled Gmail emulator, not Gmail. Start it first",
            "(it writes the credentials file the config names), then the daemon, each in a",
            "terminal of its own:",
            f"  {cli} emulator gmail --port {port} --lag 2s --accept-log {accepted} "
            f"--write-service-account {account}",
            f"  {cli} --config {config} run",
            "Then:",
            f"  {cli} --config {config} submit {shlex.quote(str(folder / 'first-job.json'))}",
            f"  {cli} --config {config} status {FIRST_KEY}",
            f"The review page: http://{emulated.listen}/ui/ (the token is in "
            f"{folder / 'api-tokens'}, after the colon).",
        ]
        return "\n".join(lines)
    secret = _SECRETS[provider]
    lines += [
        "",
        "Before the first run:",
        f"  put the provider's secret in {folder / secret} (chmod 600),",
        f"  and check the lines marked EDIT in {folder / 'sendledger.toml'}"
        + (" (user: the mailbox that sends)." if provider != "smtp-imap" else "."),
    ]
    if mailbox.addr_spec == "support@example.com":
        lines.append(
            "  The mailbox is the placeholder support@example.com: `init --mailbox "
            "ADDRESS` writes yours everywhere."
        )
    lines += [
        "",
        "Then (the daemon in one terminal, the rest in another):",
        f"  {cli} --config {config} run",
        f"  {cli} --config {config} submit {shlex.quote(str(folder / 'first-job.json'))}",
        f"  {cli} --config {config} status {FIRST_KEY}",
    ]
    return "\n".join(lines)

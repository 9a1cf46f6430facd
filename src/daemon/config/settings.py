"""Settings: a TOML file plus SENDLEDGER_<SECTION>__<KEY> environment overrides.

The model is plain pydantic: a file is judged by it alone. pydantic-settings, which reads
the overrides from the environment, is imported only when a `SENDLEDGER_*` variable sets a
setting (`settings_from_dict`): its machinery cost every command line about a tenth of a
second, for the few runs that have overrides (docs/cli.md "Many keys, one process")."""

from __future__ import annotations

import difflib
import ipaddress
import os
import re
import socket
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    StringConstraints,
    Tag,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from daemon.config import environment
from daemon.config.config_file import ConfigError as ConfigError
from daemon.config.config_file import config_path_from as config_path_from
from daemon.config.config_file import read_config_file
from daemon.config.sizes import parse_size
from daemon.config.stop_bound import check_stop_fits
from daemon.config.store_section import DEFAULT_STORE_URL, sets_a_setting
from daemon.providers.base import DEFAULT_READBACK_FIRST, DEFAULT_READBACK_RATE
from daemon.webhooks.events import WEBHOOK_TYPES, WebhookType
from ledger.stores.url import (
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_LOCK_TIMEOUT,
    DEFAULT_MAX_OVERFLOW,
    DEFAULT_POOL_SIZE,
)
from policies.durations import (
    DurationError,
    parse_duration,
    parse_duration_with_unit,
    parse_duration_within,
)
from policies.model import is_provider_name
from sendledger.connecting import LOOPBACK_NAMES

MINUTE, HOUR, DAY = 60.0, 3600.0, 86400.0
#: "100 years": a retention longer than this is a typo, and any shorter one keeps every
#: cut-off time a date that exists.
CENTURY = 36525 * DAY


def _bounded(low: float, high: float, *, unit: bool = False) -> BeforeValidator:
    """A duration from `low` to `high` seconds (docs/configuration.md "Bounds, URLs, addresses and
    files"): a value past them is refused at load, never a later failure or a job that
    waits forever. `unit`: a bare number is refused (policies/durations.py)."""
    parse = parse_duration_with_unit if unit else parse_duration_within

    def check(value: Any) -> float:
        try:
            return parse(value, low, high)
        except DurationError as exc:
            raise PydanticCustomError("duration", "{reason}", {"reason": str(exc)}) from None

    return BeforeValidator(check)


Tick = Annotated[float, _bounded(0.001, HOUR)]
Timeout = Annotated[float, _bounded(0.001, HOUR)]
Grace = Annotated[float, _bounded(0.0, DAY)]
Retention = Annotated[float, _bounded(0.0, CENTURY, unit=True)]
Every = Annotated[float, _bounded(0.001, 366 * DAY)]


#: `daemon.stop_timeout`: a provider call's default timeout (30 s) and time to record it.
DEFAULT_STOP_TIMEOUT = 35.0

#: More recipients than any provider takes in one message.
MAX_RECIPIENTS = 100_000


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _whole_seconds(low: int) -> BeforeValidator:
    """Whole seconds from `low` to an hour: eventsourcing sets PostgreSQL's lock_timeout
    in whole seconds, and libpq's connect_timeout is whole seconds, at least 2."""

    def check(value: Any) -> int:
        seconds = parse_duration(value)
        if seconds != int(seconds) or not low <= seconds <= 3600:
            raise PydanticCustomError(
                "whole_seconds",
                "whole seconds from {low}s to 1h expected, got {value}",
                {"low": low, "value": repr(value)},
            )
        return int(seconds)

    return BeforeValidator(check)


class StoreSettings(_Section):
    # A command that reads only this section may take it without the model
    # (`daemon/config/store_section.py`): a check of url or encryption_key_file belongs
    # there too, or that path is to go through the model for it.
    url: str = DEFAULT_STORE_URL
    # Event state compressed and encrypted (docs/configuration.md "Encryption at rest"): one base64
    # key a line, the first encrypts, all decrypt. Unset: stored as plain JSON.
    encryption_key_file: Path | None = None
    # PostgreSQL only (docs/performance.md "Performance and scaling"); set with a sqlite:// store
    # they are refused, so that a setting that does nothing is never believed.
    pool_size: int = Field(default=DEFAULT_POOL_SIZE, ge=1, le=1000)
    max_overflow: int = Field(default=DEFAULT_MAX_OVERFLOW, ge=0, le=1000)
    lock_timeout: Annotated[int, _whole_seconds(1)] = DEFAULT_LOCK_TIMEOUT
    # A new connection's wait, and a thread's wait for one from the pool, before the store
    # call fails and is tried again (the database is down: a restart, a failover).
    connect_timeout: Annotated[int, _whole_seconds(2)] = DEFAULT_CONNECT_TIMEOUT
    # SQLite only: a store folder on a mount point of /etc/fstab (or a mount unit) with
    # nothing mounted on it is refused (docs/operations.md "A store on a disk of its own").
    check_mounts: bool = True

    @property
    def postgres_only(self) -> list[str]:
        """The PostgreSQL-only keys this configuration sets."""
        keys = ("pool_size", "max_overflow", "lock_timeout", "connect_timeout")
        return [key for key in keys if key in self.model_fields_set]


def _daemon_name(value: Any) -> Any:
    if isinstance(value, str) and (
        not value.strip() or len(value) > 200 or not value.isprintable()
    ):
        raise ValueError("1 to 200 printable characters expected")
    return value


class DaemonSettings(_Section):
    tick: Tick = 1.0
    policies_dir: Path = Path("policies")
    # Provider calls of different jobs in flight at once (each within its provider's quota).
    concurrency: int = Field(default=4, ge=1, le=256)
    # Searches, verifications and recoveries in flight at once (their own workers, so a
    # backlog of sends never delays a due search); default: `concurrency`.
    search_concurrency: int | None = Field(default=None, ge=1, le=256)
    # A provider scope's circuit opens after this many "unavailable" calls in a row (sends,
    # draft steps, searches, read-backs: refused, DNS, quota...); one probe then after
    # `circuit_probe_after`, doubling up to `circuit_probe_max` (docs/operations.md,
    # "Outages and quotas").
    circuit_failures: int = Field(default=3, ge=1, le=1000)
    circuit_probe_after: Timeout = 1.0
    circuit_probe_max: Timeout = 60.0
    # Jobs taken per state per tick; the rest wait for the next tick.
    batch_size: int = Field(default=200, ge=1, le=100_000)
    # Added to the provider timeout to form an attempt's deadline: past it, an
    # attempt with no outcome (a crash, kill -9) is treated as Unknown.
    deadline_grace: Grace = 30.0
    # How often each mailbox with watched jobs (a channel's `watch_bounces`) is read for
    # delivery reports: one read per mailbox, whatever the number of jobs it serves
    # (docs/how-it-works.md "Bounces").
    bounce_interval: Timeout = 60.0
    # How often systemd's STATUS= line (the open jobs per state) is read and sent
    # (docs/operations.md "Running under systemd"): each line is a count query on the store.
    status_interval: Timeout = 5.0
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    # The longest a stopping daemon (SIGTERM, Ctrl-C) waits for its provider calls in
    # flight; then it exits anyway and their claims are recovered at the next start. A
    # unit's TimeoutStopSec must be above it (docs/operations.md "Stopping").
    stop_timeout: Timeout = DEFAULT_STOP_TIMEOUT
    # Recorded on this daemon's claims; one live daemon per name (a lock in the store),
    # and at start-up it recovers its own earlier claims at once.
    name: Annotated[str, BeforeValidator(_daemon_name)] = Field(default_factory=socket.gethostname)
    # Daemons on one store each own some quota scopes (a provider, or one of its
    # mailboxes) through a lease this long, renewed every third of it; a dead daemon's
    # scopes go to the others when it ends (docs/performance.md "Several daemons").
    # Unset: twice deadline_grace, at least 1s.
    scope_lease: Timeout | None = None

    @model_validator(mode="after")
    def _lease_outlives_the_grace(self) -> DaemonSettings:
        # An owner stops `deadline_grace` before its lease ends: what is left must span
        # the renewals.
        if self.scope_lease is not None and self.scope_lease < 2 * self.deadline_grace:
            raise PydanticCustomError(
                "scope_lease",
                "scope_lease: {lease}s is shorter than twice deadline_grace ({grace}s)",
                {"grace": f"{2 * self.deadline_grace:g}", "lease": f"{self.scope_lease:g}"},
            )
        return self

    @property
    def scope_lease_seconds(self) -> float:
        """`scope_lease`, or its default."""
        if self.scope_lease is not None:
            return self.scope_lease
        return max(2 * self.deadline_grace, 1.0)


def _http_url(value: Any) -> Any:
    """Empty (the default), or an http(s) URL with a host: what the Google client and
    google-auth are pointed at. Anything else (`file:///etc/passwd`, a bare host, a URL
    with spaces or a password in it) is refused at load."""
    if not isinstance(value, str) or not value:
        return value
    problem = _url_problem(value)
    if problem:
        raise PydanticCustomError(
            "http_url",
            "an http(s) URL expected ({problem}), got {value}",
            {"problem": problem, "value": repr(value)},
        )
    return value


def _url_problem(value: str) -> str | None:
    if any(char.isspace() or not char.isprintable() or not char.isascii() for char in value):
        return "spaces, controls and non-ASCII characters are percent-encoded"
    try:
        parts = urlsplit(value)
        port = parts.port  # a port that is not a number, or past 65535, raises here
    except ValueError as exc:
        return str(exc)
    if port == 0:
        return "port 0: a port from 1 to 65535"
    if parts.scheme not in ("http", "https"):
        return f"scheme {parts.scheme or 'missing'!r}: http or https only"
    if not parts.hostname:
        return "no host"
    if parts.username is not None or parts.password is not None:
        return "no user or password in it"
    if parts.query or parts.fragment:
        return "no query or fragment"
    return None


HttpUrl = Annotated[str, BeforeValidator(_http_url)]


class GmailProviderSettings(_Section):
    kind: Literal["gmail"] = "gmail"
    credentials_file: Path
    user: str = "me"
    # Before the URLs, which their check reads it for (fields validate in this order).
    allow_http: bool = False
    api_endpoint: HttpUrl = ""
    token_uri: HttpUrl = ""
    timeout: Timeout = 30.0
    # "messages": users.messages.send; "drafts": drafts.create then drafts.send, a handle
    # Gmail itself enforces (needs gmail.compose; docs/providers.md "Gmail setup").
    send_via: Literal["messages", "drafts"] = "messages"
    # With send_via = "messages": record the mailbox's historyId with each claim and read
    # the history since it after an unknown outcome, before any search (docs/providers.md
    # "What each handle proves"); false: the search alone, as before.
    read_history: bool = True
    quota_units_per_second: float = Field(default=250.0, gt=0, le=1_000_000)
    # The Message-ID read-back after confirmed sends: the first N after start, then this
    # share of the rest (a provider that replaces our Message-IDs is still caught).
    readback_first: int = Field(default=DEFAULT_READBACK_FIRST, ge=1, le=1_000_000)
    readback_rate: float = Field(default=DEFAULT_READBACK_RATE, ge=0.0, le=1.0)
    # Checked at intake, so a job the provider would refuse is never accepted: Gmail sends
    # at most 25 MB per message (after encoding) and 500 recipients per message.
    max_message_bytes: Annotated[int, BeforeValidator(parse_size)] = 25_000_000
    max_recipients: int = Field(default=500, ge=1, le=MAX_RECIPIENTS)

    @field_validator("api_endpoint", "token_uri")
    @classmethod
    def _clear_text(cls, value: str, info: ValidationInfo) -> str:
        return _clear_text_checked(value, info)


MailSecurity = Literal["tls", "starttls", "none"]


def _is_loopback(host: str, *, names: bool = True) -> bool:
    """Whether `host` is loopback as written: a loopback address, or (with `names`) a
    loopback name, which is then connected to on its loopback addresses only
    (`sendledger.connecting.loopback_only`)."""
    if names and host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _clear_text_checked(value: str, info: ValidationInfo) -> str:
    """A provider's URL (`api_endpoint`, `token_uri`): `http://` carries the access token
    (or what gets one) in clear text, so only to a loopback address, as an SMTP password,
    or with the section's `allow_http = true`, as a webhook's payload."""
    if clear_text_elsewhere(value) and not info.data.get("allow_http"):
        raise PydanticCustomError(
            "plaintext",
            "http:// to {host} sends the access token in clear text: use https://, "
            "or set allow_http = true (loopback: write 127.0.0.1 or [::1])",
            {"host": urlsplit(value).hostname or ""},
        )
    return value


def clear_text_elsewhere(url: str) -> bool:
    """Whether a provider's `url` is `http://` to a host that is not a loopback address:
    what needs the provider's `allow_http = true`. An address only: the Google and Graph
    clients connect a name (`localhost`) wherever a resolver says, with no loopback-only
    filter as the webhooks and SMTP/IMAP have."""
    parts = urlsplit(url)
    # The scheme as the clients read it: urlsplit lowers it, as httplib2 does (`HTTP://`
    # is clear text too).
    return parts.scheme == "http" and not _is_loopback(parts.hostname or "", names=False)


class SmtpImapProviderSettings(_Section):
    """SMTP submission + IMAP search of the sent folder (docs/providers.md "Providers")."""

    kind: Literal["smtp-imap"]
    smtp_host: str = Field(min_length=1)
    smtp_port: int = Field(default=587, ge=1, le=65535)
    smtp_security: MailSecurity = "starttls"
    imap_host: str = Field(min_length=1)
    imap_port: int = Field(default=993, ge=1, le=65535)
    imap_security: MailSecurity = "tls"
    # The login for both, and the envelope sender (server-side sent copies key on it).
    username: str = Field(min_length=1)
    password_file: Path
    # Empty: the folder flagged \Sent (RFC 6154).
    sent_folder: str = ""
    # "server": the submission server files the copy; "client": the daemon APPENDs it
    # after the 250, so a miss proves nothing and on_unknown = "retry" is refused.
    sent_copy: Literal["server", "client"] = "server"
    timeout: Timeout = 30.0
    # Connections kept between sends (SMTP, with their login) and between searches (IMAP):
    # messages (IMAP: calls) per connection, its age at most, and the idle time after
    # which it is checked with NOOP before its next use (docs/providers.md "Connections
    # kept between sends"). connection_max_messages = 1 or connection_max_age = 0: a
    # connection per call.
    connection_max_messages: int = Field(default=100, ge=1, le=100_000)
    connection_max_age: Grace = 300.0
    connection_idle_check: Grace = 2.0
    # MAIL, RCPT and DATA in one write where the server offers PIPELINING (RFC 2920);
    # false: one command a round trip, for a server that offers it and mishandles it.
    pipelining: bool = True
    # Checked at intake; RFC 5321 servers take at least 100 recipients per message.
    max_message_bytes: Annotated[int, BeforeValidator(parse_size)] = 25_000_000
    max_recipients: int = Field(default=100, ge=1, le=MAX_RECIPIENTS)

    @field_validator("smtp_host", "imap_host")
    @classmethod
    def _address_unbracketed(cls, value: str) -> str:
        # `[::1]` is how a URL writes an IPv6 address; smtplib and imaplib look the host
        # up as written, and no resolver knows `[::1]`: taken as the address it holds.
        inner = value[1:-1] if value.startswith("[") and value.endswith("]") else ""
        try:
            return str(ipaddress.IPv6Address(inner))
        except ValueError:
            return value

    @field_validator("smtp_security", "imap_security")
    @classmethod
    def _plaintext_on_loopback_only(cls, value: str, info: ValidationInfo) -> str:
        host = info.data.get(f"{(info.field_name or '').split('_')[0]}_host")
        if value == "none" and isinstance(host, str) and not _is_loopback(host):
            raise PydanticCustomError(
                "plaintext",
                '"none" sends the password in clear text: loopback hosts only, not {host}',
                {"host": host},
            )
        return value


# Its own duration type (bounds on each field), so this section does not depend on how the
# other sections spell theirs.
_GraphSeconds = Annotated[float, BeforeValidator(parse_duration)]


class GraphProviderSettings(_Section):
    """Microsoft Graph with application permissions (docs/providers.md "Providers", "Microsoft
    Graph setup")."""

    kind: Literal["graph"]
    tenant_id: str = Field(min_length=1)
    client_id: str = Field(min_length=1)
    # Exactly one: the client secret (its first line), or a PEM holding the private key
    # and the certificate registered with the application.
    client_secret_file: Path | None = None
    certificate_file: Path | None = None
    # A mailbox address, or "{from}": each job's From mailbox.
    user: str = Field(min_length=1)
    # Before api_endpoint, which its check reads it for (fields validate in this order).
    allow_http: bool = False
    api_endpoint: str = "https://graph.microsoft.com/v1.0"
    # The token endpoint is {authority}/{tenant_id}/oauth2/v2.0/token; msal takes https only.
    authority: str = "https://login.microsoftonline.com"
    # Each request's; a send is up to three (create, send, read-back) plus confirm_wait,
    # which daemon.deadline_grace should cover: 2 x timeout + confirm_wait.
    timeout: _GraphSeconds = Field(default=10.0, gt=0, le=3600)
    # Requests in flight at once per mailbox (Graph's limit is 4 per app and mailbox).
    max_concurrent: int = Field(default=4, ge=1, le=64)
    # After a 202, how long the send reads the draft's id back for the filed copy
    # (Confirmed at once); 0 or past it: Unknown, settled by the search.
    confirm_wait: _GraphSeconds = Field(default=3.0, ge=0, le=60)
    # Checked at intake: a MIME create is one request of at most 4 MB, base64 included;
    # Exchange Online takes 500 recipients per message.
    max_message_bytes: Annotated[int, BeforeValidator(parse_size)] = 3_000_000
    max_recipients: int = Field(default=500, ge=1, le=100_000)

    @field_validator("authority")
    @classmethod
    def _https_authority(cls, value: str) -> str:
        if not value.startswith("https://") or len(value) <= len("https://"):
            raise PydanticCustomError(
                "https_url",
                "an https:// URL expected (msal takes no other), got {value}",
                {"value": repr(value)},
            )
        return str(_http_url(value)).rstrip("/")

    @field_validator("api_endpoint")
    @classmethod
    def _http_endpoint(cls, value: str, info: ValidationInfo) -> str:
        # The whole URL as the Gmail ones are, not its scheme alone: with only that,
        # `https://graph.microsoft.com@evil.example` sent the token to evil.example.
        if not value:
            raise PydanticCustomError(
                "http_url", "an http(s):// URL expected, got {value}", {"value": repr(value)}
            )
        return _clear_text_checked(str(_http_url(value)), info).rstrip("/")

    @model_validator(mode="after")
    def _one_credential(self) -> GraphProviderSettings:
        if (self.certificate_file is None) == (self.client_secret_file is None):
            raise PydanticCustomError(
                "graph_credential",
                "client_secret_file: set exactly one of client_secret_file and certificate_file",
            )
        return self


def _provider_kind(value: Any) -> str:
    # A table without `kind` is a Gmail provider (the only kind before smtp-imap).
    kind = value.get("kind", "gmail") if isinstance(value, dict) else getattr(value, "kind", None)
    return kind if kind in _PROVIDER_TAGS else "unknown kind"


ProviderSettings = Annotated[
    Annotated[GmailProviderSettings, Tag("gmail")]
    | Annotated[SmtpImapProviderSettings, Tag("smtp-imap")]
    | Annotated[GraphProviderSettings, Tag("graph")],
    Discriminator(
        _provider_kind,
        custom_error_type="provider_kind",
        custom_error_message='expected "gmail", "smtp-imap" or "graph"',
    ),
]
_PROVIDER_TAGS = ("gmail", "smtp-imap", "graph")


def _webhook_events(value: Any) -> Any:
    if isinstance(value, list) and len(set(map(str, value))) != len(value):
        raise ValueError("an event is named twice")
    return value


def _webhook_wait(value: Any) -> float:
    # Bounded: "1e400s" or "-1s" would make a backoff that never ends or never waits.
    try:
        seconds = parse_duration(value)
    except ValueError as exc:
        raise PydanticCustomError("duration", "{reason}", {"reason": str(exc)}) from None
    if not 0.001 <= seconds <= 86400:
        raise PydanticCustomError(
            "duration", "a duration from 1ms to 1d expected, got {value}", {"value": repr(value)}
        )
    return seconds


WebhookWait = Annotated[float, BeforeValidator(_webhook_wait)]


class WebhookSettings(_Section):
    """`[webhooks.NAME]` (docs/http-api.md "Webhooks")."""

    url: str
    # One line, "whsec_<base64>" (`sendledger webhooks new-secret` makes one).
    secret_file: Path
    events: Annotated[list[WebhookType], BeforeValidator(_webhook_events)] = Field(
        default_factory=lambda: list(WEBHOOK_TYPES),  # type: ignore[arg-type]
        min_length=1,
    )
    timeout: WebhookWait = Field(default=10.0, le=300)
    # After a failed attempt: doubling from retry_backoff up to retry_backoff_max, for as
    # long as it takes (nothing is given up).
    retry_backoff: WebhookWait = 1.0
    retry_backoff_max: WebhookWait = 300.0
    # http:// to a host that is not loopback sends the payload in clear text (the
    # signature still proves where it came from): refused unless this says so.
    allow_http: bool = False

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        # Checked as written, because it is not requested as written: urlsplit drops tabs
        # and newlines, http.client refuses a space, a control character or a non-ASCII
        # path on every attempt, and the socket and TLS layers encode a non-ASCII host
        # with IDNA 2003 ("straße" -> "strasse", another domain than IDNA 2008's).
        for index, char in enumerate(value):
            if char == " ":
                raise ValueError(f"a space at character {index + 1}: write it %20")
            if char < " " or char == "\x7f":
                raise ValueError(f"a control character ({char!r}) at character {index + 1}")
            if not char.isascii():
                raise ValueError(
                    f"non-ASCII {char!r} at character {index + 1}: write the host in its "
                    "xn-- form and percent-encode the rest"
                )
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"an http:// or https:// URL expected, got {value!r}")
        if parts.username is not None or parts.password is not None:
            raise ValueError(
                "credentials in the URL are not supported (the signature is the credential)"
            )
        try:
            if parts.port == 0:
                raise ValueError
        except ValueError:
            raise ValueError(f"the port of {value!r} is not a number from 1 to 65535") from None
        return value

    @model_validator(mode="after")
    def _plaintext_on_loopback_only(self) -> WebhookSettings:
        parts = urlsplit(self.url)
        if (
            parts.scheme == "http"
            and not self.allow_http
            and not _is_loopback(parts.hostname or "")
        ):
            raise PydanticCustomError(
                "plaintext",
                "url: http:// to {host} sends the payload in clear text: use https://, "
                "or set allow_http = true",
                {"host": parts.hostname},
            )
        if self.retry_backoff_max < self.retry_backoff:
            raise PydanticCustomError(
                "backoff", "retry_backoff_max is shorter than retry_backoff", {}
            )
        return self


WebhookName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]


def provider_name_allowed(name: object) -> bool:
    """A provider's name: any a policy's `provider` takes (printable, no spaces around
    it), but no `/`, which joins the name and a mailbox in its quota scopes. Not the
    webhooks' narrower rule: a job keeps the name its attempt was made on, so a name
    refused after an upgrade could only be renamed, stranding such jobs."""
    return isinstance(name, str) and is_provider_name(name) and "/" not in name


class RetentionSettings(_Section):
    # Off unless set: jobs settled for good (confirmed, abandoned, cancelled) longer ago than this
    # lose their content and keep their trail (docs/configuration.md "Retention").
    purge_after: Retention | None = None
    # How often the daemon purges (first run a minute after start-up, or sooner if this
    # is shorter).
    every: Every = DAY


class ApiSettings(_Section):
    # Off unless set: "127.0.0.1:8025" (HOST:PORT; [::1]:8025 for IPv6).
    listen: str = ""
    # One token a line, optionally "name:token"; the name is recorded as who acted.
    token_file: Path | None = None
    # Request bodies above this are refused (413); just above Gmail's 35 MB message limit.
    max_body: Annotated[int, BeforeValidator(parse_size)] = 40_000_000
    # Host names a request's Host header must be one of ("*.example.com" for subdomains);
    # empty: any Host is accepted (it is never reflected: redirects are paths).
    trusted_hosts: list[str] = []
    # The address users reach the API at, when a TLS proxy is in front
    # ("https://mail.example.com"): an https one marks the session cookie Secure.
    public_url: str = ""

    @property
    def host_port(self) -> tuple[str, int]:
        listen = parse_listen(self.listen)
        if listen is None:
            raise ValueError(f"api.listen: not an address: {self.listen!r}")
        return listen

    @field_validator("trusted_hosts")
    @classmethod
    def _trusted_hosts(cls, value: list[str]) -> list[str]:
        for host in value:
            name = host.removeprefix("*.")
            if host != "*" and (
                not name or not all(_HOST_LABEL.fullmatch(p) for p in name.split("."))
            ):
                raise PydanticCustomError(
                    "trusted_hosts",
                    "a host name expected (mail.example.com, *.example.com, localhost), "
                    "got {value}",
                    {"value": repr(host)},
                )
        return value

    @field_validator("public_url")
    @classmethod
    def _public_url(cls, value: str) -> str:
        parts = urlsplit(value)
        if value and (parts.scheme not in ("http", "https") or not parts.hostname):
            raise PydanticCustomError(
                "public_url",
                "an http:// or https:// URL expected (https://mail.example.com), got {value}",
                {"value": repr(value)},
            )
        return value.rstrip("/")

    @field_validator("listen")
    @classmethod
    def _listen(cls, value: str) -> str:
        if value and parse_listen(value) is None:
            raise PydanticCustomError(
                "listen",
                "HOST:PORT expected (127.0.0.1:8025, [::1]:8025, localhost:8025; "
                "port 1 to 65535), got {value}",
                {"value": repr(value)},
            )
        return value


_HOST_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")


def parse_listen(value: str) -> tuple[str, int] | None:
    """(host, port) of an `api.listen` value, or None when it is not one: an IPv4
    address, a host name or a bracketed IPv6 address, a colon, and a port from 1 to
    65535 in ASCII digits."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isascii() or not port.isdigit() or not 0 < int(port) < 65536:
        return None
    if host.startswith("[") and host.endswith("]"):
        try:
            return str(ipaddress.IPv6Address(host[1:-1])), int(port)
        except ValueError:
            return None
    try:
        return str(ipaddress.IPv4Address(host)), int(port)
    except ValueError:
        pass
    labels = host.split(".")
    if len(host) > 253 or not all(_HOST_LABEL.fullmatch(label) for label in labels):
        return None
    if labels[-1].isdigit():
        return None  # "1.2.3.999" is a mistyped address, not a host name
    return host, int(port)


class Settings(BaseModel):
    # validate_default as pydantic-settings has it, so a file reads as it did through it.
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)

    store: StoreSettings = StoreSettings()
    daemon: DaemonSettings = DaemonSettings()
    providers: dict[str, ProviderSettings] = Field(default_factory=dict)
    api: ApiSettings = ApiSettings()
    retention: RetentionSettings = RetentionSettings()
    webhooks: dict[WebhookName, WebhookSettings] = Field(default_factory=dict)

    # Where the config came from; relative paths in it are relative to its folder.
    config_path: Path | None = Field(default=None, exclude=True)

    @field_validator("providers", mode="before")
    @classmethod
    def _provider_names(cls, value: Any) -> Any:
        # `/` joins a provider's name and a mailbox in its quota scopes ("g/a@example.com"
        # for `user = "{from}"`): a provider of that name shared the scope, its circuit,
        # queue and lease, with another's mailbox. And a name is read in logs and commands.
        for name in value if isinstance(value, dict) else ():
            if not provider_name_allowed(name):
                raise PydanticCustomError(
                    "provider_name",
                    "a provider's name is printable text without '/' and without spaces "
                    "around it (the name and a mailbox make its quota scopes, joined by "
                    "'/'), got {name}: rename it, and its policies' provider",
                    {"name": repr(name)},
                )
        return value

    @property
    def base_dir(self) -> Path:
        return self.config_path.parent if self.config_path else Path.cwd()

    def resolve(self, path: Path) -> Path:
        return path if path.is_absolute() else self.base_dir / path

    @property
    def policies_dir(self) -> Path:
        return self.resolve(self.daemon.policies_dir)

    def credentials_file(self, provider: str) -> Path:
        config = self.providers[provider]
        if not isinstance(config, GmailProviderSettings):
            raise ConfigError(f"providers.{provider}: kind {config.kind!r} has no credentials_file")
        return self.resolve(config.credentials_file)

    def client_copy_providers(self) -> set[str]:
        """Providers whose sent copy the daemon files itself (`sent_copy = "client"`)."""
        return {
            name
            for name, config in self.providers.items()
            if isinstance(config, SmtpImapProviderSettings) and config.sent_copy == "client"
        }


def _file_loc(loc: tuple[int | str, ...]) -> tuple[int | str, ...]:
    """An error's location as the user's file has it: a provider's kind tag is part of
    pydantic's location, not of the file."""
    if len(loc) > 2 and loc[0] == "providers" and loc[2] in _PROVIDER_TAGS:
        return (*loc[:2], *loc[3:])
    return loc


def _first_to_say(errors: list[Any]) -> Any:
    """The error to report: the first, except that an unknown key beside a missing one of
    the same section is the cause (`credential_file` for `credentials_file`), said first."""
    missing = {_file_loc(e["loc"])[:-1] for e in errors if e["type"] == "missing"}
    for error in errors:
        if error["type"] == "extra_forbidden" and _file_loc(error["loc"])[:-1] in missing:
            return error
    return errors[0]


def _did_you_mean(loc: tuple[int | str, ...], errors: list[Any]) -> str:
    """ "; did you mean KEY?" for an unknown key close to a missing key of its section, or
    to a key the section has (docs/configuration.md "Configuration")."""
    typed, section = str(loc[-1]), loc[:-1]
    missing = [
        str(_file_loc(e["loc"])[-1])
        for e in errors
        if e["type"] == "missing" and _file_loc(e["loc"])[:-1] == section
    ]
    # Every key of the section is a candidate, a missing one first: `USER` beside a
    # missing `credentials_file` is the key `user`, not a typo of the missing one.
    known = missing + [key for key in _keys_of(section) if key not in missing]
    # Keys are lower case: `[API]` or `URL` is as far from its key as difflib can measure.
    close = [key for key in known if key.lower() == typed.lower()]
    close = close or difflib.get_close_matches(typed, missing, n=1, cutoff=0.6)
    close = close or difflib.get_close_matches(typed, known, n=1, cutoff=0.6)
    if not close:
        return ""
    required = " (required, and missing)" if close[0] in missing else ""
    return f"; did you mean {close[0]}{required}?"


def _keys_of(section: tuple[int | str, ...]) -> list[str]:
    """The keys a section of the file may hold: a top-level one, or one provider or
    webhook (every provider kind's keys: the kind may be the typo)."""
    models: list[type[BaseModel]] = [Settings]
    for depth, part in enumerate(section):
        fields: dict[str, Any] = {}
        for model in models:
            fields.update(model.model_fields)
        name = str(part)
        if depth == 1 and section[0] in ("providers", "webhooks"):
            continue  # a name the user chose
        if name not in fields:
            return []
        annotation = fields[name].annotation
        if name == "providers":
            models = [GmailProviderSettings, SmtpImapProviderSettings, GraphProviderSettings]
        elif name == "webhooks":
            models = [WebhookSettings]
        elif isinstance(annotation, type) and issubclass(annotation, BaseModel):
            models = [annotation]
        else:
            return []
    if section and section[0] in ("providers", "webhooks") and len(section) == 1:
        return []
    keys = {name for model in models for name in model.model_fields}
    return sorted(keys - {"config_path"})


def load_settings(explicit: str | Path | None = None) -> Settings:
    path, data = read_config_file(explicit)
    return settings_from_dict(data, config_path=path)


def settings_from_dict(data: dict[str, Any], *, config_path: Path | None = None) -> Settings:
    label = str(config_path) if config_path else "config"
    if "config_path" in data:
        raise ConfigError(f"{label}: config_path: unknown key")
    unknown = environment.unknown_variable(os.environ, Settings)
    if unknown:
        raise ConfigError(
            f"{unknown}: unknown variable (SENDLEDGER_<SECTION>__<KEY> names a setting; "
            "a misspelled one would be ignored)"
        )

    try:
        if sets_a_setting(os.environ):
            loaded = _with_environment(data, config_path, label)
        else:
            loaded = Settings.model_validate({**data, "config_path": config_path})
    except ValidationError as exc:
        raise _config_error(exc, label) from None
    # Across two sections: the stop's lock waits must fit its timeout.
    source = environment.variable_for(("daemon", "stop_timeout"), os.environ) or label
    store = loaded.store
    check_stop_fits(store.url, store.lock_timeout, loaded.daemon.stop_timeout, source)
    return loaded


def _config_error(exc: ValidationError, label: str) -> ConfigError:
    """The one line a refused configuration is: where the value came from (the file, or
    the variable that set it), the setting's path, and why."""
    errors = exc.errors()
    error = _first_to_say(errors)
    loc = _file_loc(error["loc"])
    message = "unknown key" if error["type"] == "extra_forbidden" else error["msg"]
    if error["type"] == "extra_forbidden":
        message += _did_you_mean(loc, errors)
    if error["type"] == "provider_kind":
        # Said of the provider's table: named by its `kind`, with what was written there.
        loc = (*loc, "kind")
        written = error["input"].get("kind") if isinstance(error["input"], dict) else None
        message += f", got {written!r}" if isinstance(written, str) else ""
    where = ".".join(str(part) for part in loc)
    # A value from the environment is named by its variable, not by the file.
    source = environment.variable_for(loc, os.environ)
    if source is None and error["type"] == "missing":
        source = environment.missing_variable(loc, os.environ)
    source = source or label
    return ConfigError(f"{source}: {where}: {message}")


def _with_environment(data: dict[str, Any], config_path: Path | None, label: str) -> Settings:
    """The file with the `SENDLEDGER_*` overrides read by pydantic-settings (environment
    first: an operator's override beats the file)."""
    from pydantic_settings import (
        BaseSettings,
        PydanticBaseSettingsSource,
        SettingsConfigDict,
        SettingsError,
    )

    class _TomlSource(PydanticBaseSettingsSource):
        def get_field_value(self, field: Any, field_name: str) -> tuple[Any, str, bool]:
            return data.get(field_name), field_name, False

        def __call__(self) -> dict[str, Any]:
            return dict(data)

    class _FileSettings(BaseSettings, Settings):
        model_config = SettingsConfigDict(
            env_prefix="SENDLEDGER_",
            env_nested_delimiter="__",
            extra="forbid",
            frozen=True,
        )

        @classmethod
        def settings_customise_sources(
            cls,
            settings_cls: type[BaseSettings],
            init_settings: PydanticBaseSettingsSource,
            env_settings: PydanticBaseSettingsSource,
            dotenv_settings: PydanticBaseSettingsSource,
            file_secret_settings: PydanticBaseSettingsSource,
        ) -> tuple[PydanticBaseSettingsSource, ...]:
            return (init_settings, env_settings, _TomlSource(settings_cls))

    try:
        return _FileSettings(config_path=config_path)
    except ValidationError as exc:
        raise _config_error(exc, label) from None
    except SettingsError as exc:
        # pydantic-settings: a variable holding malformed JSON for a section.
        field = str(exc).partition('field "')[2].partition('"')[0]
        variable = environment.malformed_json_variable(field, os.environ, Settings)
        raise ConfigError(f"{variable or 'environment'}: {field}: not valid JSON") from None

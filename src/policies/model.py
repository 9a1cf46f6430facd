"""The channel policy: one TOML file per channel, validated strictly, fingerprinted.

A policy answers one question for its channel: when a send's outcome is unknown, may the
daemon ever send again on its own (``on_unknown = "retry"``), or does a human decide? The
timing fields say how long to wait for the provider's search index before a miss is believed.

Every decision recorded in the ledger carries the policy's name and :attr:`fingerprint`, so
an audit can tell which exact version of a policy made it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from email.headerregistry import Address
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictStr,
    ValidationInfo,
    field_validator,
)
from pydantic_core import PydanticCustomError

from ledger.addresses import AddressError, parse_mailbox
from ledger.message_id import MessageIdError, validate_domain
from ledger.vocabulary import PolicyRef, Sender
from policies.durations import DurationError, format_duration, parse_duration
from policies.senders import MAX_PATTERNS, job_sender, pattern_problem, sends_as

__all__ = [
    "MAX_ATTEMPTS",
    "MAX_COUNT",
    "MAX_DURATION",
    "MAX_DURATIONS",
    "MIN_DURATION",
    "PAUSE_AFTER_UNANSWERED",
    "ChannelPolicy",
    "OnBounce",
    "OnUnknown",
    "is_provider_name",
    "parse_from_address",
]

OnUnknown = Literal["retry", "search-then-review", "review"]
#: What a job on a `send_via = "drafts"` provider does when its attempt's outcome was
#: unknown and its draft is found still unsent (docs/policies.md "Channel policies").
PendingDraft = Literal["send", "review"]
#: What a permanent bounce of a confirmed job does (docs/policies.md "Channel policies"):
#: "record" only records it; "review" sends the job to a human too.
OnBounce = Literal["record", "review"]

#: The smallest window a policy may set (tests use "50ms"; zero would mean "search at once",
#: which is exactly what the search index's lag forbids).
MIN_DURATION = 0.001
_DAY = 86400.0
#: The largest window each duration may set (docs/policies.md "Fields, defaults and bounds"). A
#: search index lags minutes, not weeks, and a backoff past a day is an outage for a human; a
#: longer value is a typo that would leave jobs waiting where nobody looks.
MAX_DURATIONS: dict[str, float] = {
    "search_after": 7 * _DAY,
    "search_interval": 7 * _DAY,
    "retry_backoff": _DAY,
    "retry_backoff_max": 7 * _DAY,
    "verify_after": 30 * _DAY,
    "history_after": _DAY,
    # Reports of a delayed delivery come for up to five days (RFC 5321's give-up time);
    # a month covers the slowest, and a longer watch would keep jobs from retention.
    "watch_bounces": 30 * _DAY,
}
MAX_DURATION = max(MAX_DURATIONS.values())
#: Counts past these would keep a job searching (confirm_misses) or retrying
#: (max_attempts) for longer than any window: years, unseen.
MAX_COUNT = 100
MAX_ATTEMPTS = 1000
#: The default `pause_after_unanswered`: a provider that took the message and lost its
#: answer is this product's ordinary ambiguous outcome, but ten in a row with no answer
#: in between is a front end answering nothing.
PAUSE_AFTER_UNANSWERED = 10

# Matched whole (`fullmatch`): `$` after `.match` lets a final line feed through.
_CHANNEL = re.compile(r"[A-Za-z0-9._-]+")
_CHANNEL_MAX = 128


def is_provider_name(value: str) -> bool:
    """A provider's name as a policy's `provider` names it, and as the config's
    `[providers.NAME]` must be (which also refuses a `/`): not empty, printable, no spaces
    around it."""
    return bool(value.strip()) and value == value.strip() and value.isprintable()


def _error(reason: str) -> PydanticCustomError:
    # The reason goes through the context so that braces in user input are not templates.
    return PydanticCustomError("policy", "{reason}", {"reason": reason})


def _to_seconds(value: object, info: ValidationInfo) -> object:
    """Durations as operators write them ("250ms", "30s", "5m", "1h", "1d") or seconds,
    from 1ms to the field's :data:`MAX_DURATIONS`."""
    if value is None:
        return None
    try:
        seconds = parse_duration(value)
    except DurationError as exc:
        raise _error(str(exc)) from None
    if seconds < MIN_DURATION:
        raise _error(f"must be at least 1ms, got {value!r}")
    most = MAX_DURATIONS.get(info.field_name or "", MAX_DURATION)
    if seconds > most:
        raise _error(f"must be at most {format_duration(most)}, got {value!r}")
    return seconds


Duration = Annotated[float, BeforeValidator(_to_seconds), Field(strict=True)]
PositiveInt = Annotated[int, Field(strict=True, ge=1, le=MAX_COUNT)]


def parse_from_address(value: str) -> Address:
    """Parse a ``From`` value with the one address validator every address field uses
    (``ledger/addresses.py``): exactly one mailbox, display name allowed. Raises
    ValueError with a one-line reason."""
    try:
        return parse_mailbox(value).address
    except AddressError as exc:
        raise ValueError(str(exc)) from None


class ChannelPolicy(BaseModel):
    """One channel's policy, as written in ``policies_dir/<channel>.toml``.

    Durations are stored in seconds. After validation ``search_interval`` is never None: it
    defaults to ``search_after``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    channel: StrictStr
    provider: StrictStr
    from_: StrictStr = Field(alias="from")
    message_id_domain: StrictStr
    # ``irreversible`` is declared before ``on_unknown`` so that the check that refuses
    # "retry" on an irreversible channel can be reported against ``on_unknown``.
    irreversible: StrictBool = False
    on_unknown: OnUnknown = "search-then-review"
    search_after: Duration = 300.0
    search_interval: Duration | None = Field(default=None, validate_default=True)
    confirm_misses: PositiveInt = 2
    max_attempts: Annotated[int, Field(strict=True, ge=1, le=MAX_ATTEMPTS)] = 3
    retry_backoff: Duration = 30.0
    retry_backoff_max: Duration = Field(default=3600.0, validate_default=True)
    # After a job that was resent (a believed miss, or a human's resend) is confirmed,
    # count its copies once more this long later: an index lag longer than the search
    # windows would otherwise hide a duplicate.
    verify_after: Duration = 3600.0
    # Patterns of the mailboxes a job may name as its own `from` (policies/senders.py);
    # empty: every job is sent as `from`.
    allowed_from: tuple[StrictStr, ...] = ()
    # A draft found still unsent after an unknown outcome proves that attempt sent nothing:
    # "send" sends the same draft again (even on a review or irreversible channel: the
    # provider makes at most one message of a draft); "review" leaves it to a human.
    pending_draft: PendingDraft = "send"
    # How long a job may wait for an unavailable provider (refused connections, quota
    # errors: nothing sent) before a human decides; None: it waits for as long as it takes.
    give_up_after: Duration | None = None
    # Gmail's history handle (docs/policies.md "Channel policies"): how long after an unknown
    # outcome a read of the mailbox's history that finds no copy of ours is believed (the
    # history lag `sendledger probe` measured, with a margin); the search is then due at
    # once. None: absence in the history proves nothing, the search decides after
    # `search_after` as without it.
    history_after: Duration | None = None
    # After a job is confirmed, look for delivery reports (bounces) about it in its
    # mailbox for this long; None: never (docs/how-it-works.md "Bounces").
    watch_bounces: Duration | None = None
    on_bounce: OnBounce = "record"
    # Sends in a row its provider (or a proxy before it) closed with no response, no send
    # answered in between, that pause the scope's sends as an open circuit does: a front
    # end dropping every send made each due job one more Unknown, search and review
    # (docs/operations.md "Outages and quotas"). Large enough that the ordinary dropped
    # answer, now and then among answered sends, never pauses anything.
    pause_after_unanswered: Annotated[int, Field(strict=True, ge=1, le=MAX_ATTEMPTS)] = (
        PAUSE_AFTER_UNANSWERED
    )

    @field_validator("channel")
    @classmethod
    def _check_channel(cls, value: str) -> str:
        if not value:
            raise _error("must not be empty")
        if len(value) > _CHANNEL_MAX:
            raise _error(f"must be at most {_CHANNEL_MAX} characters")
        if not _CHANNEL.fullmatch(value):
            raise _error(f"may contain only letters, digits, '.', '_' and '-': {value!r}")
        return value

    @field_validator("provider")
    @classmethod
    def _check_provider(cls, value: str) -> str:
        if not value.strip():
            raise _error("must not be empty")
        if not is_provider_name(value):
            raise _error(f"must be a provider name without spaces around it: {value!r}")
        return value

    @field_validator("from_")
    @classmethod
    def _check_from(cls, value: str) -> str:
        try:
            parse_from_address(value)
        except ValueError as exc:
            raise _error(str(exc)) from None
        return value.strip()

    @field_validator("allowed_from", mode="before")
    @classmethod
    def _check_allowed_from(cls, value: object) -> object:
        if not isinstance(value, list | tuple):
            raise _error('must be a list of address patterns like ["*@example.com"]')
        if len(value) > MAX_PATTERNS:
            raise _error(f"at most {MAX_PATTERNS} patterns")
        for index, pattern in enumerate(value):
            if not isinstance(pattern, str):
                raise _error(f"[{index}] must be a string")
            problem = pattern_problem(pattern)
            if problem:
                raise _error(f"[{index}] {problem}")
        return tuple(value)

    @field_validator("message_id_domain")
    @classmethod
    def _check_domain(cls, value: str) -> str:
        try:
            return validate_domain(value)
        except MessageIdError as exc:
            raise _error(f"{exc} (a host name like mail.example.com)") from None

    @field_validator("on_unknown")
    @classmethod
    def _check_on_unknown(cls, value: OnUnknown, info: ValidationInfo) -> OnUnknown:
        if value == "retry" and info.data.get("irreversible") is True:
            raise _error(
                '"retry" is refused because irreversible = true: '
                "irreversible channels never resend without a human"
            )
        return value

    @field_validator("on_bounce")
    @classmethod
    def _check_on_bounce(cls, value: OnBounce, info: ValidationInfo) -> OnBounce:
        if value == "review" and info.data.get("watch_bounces", 0) is None:
            raise _error('"review" needs watch_bounces: no bounce is looked for without it')
        return value

    @field_validator("search_interval")
    @classmethod
    def _default_search_interval(cls, value: float | None, info: ValidationInfo) -> float | None:
        if value is None:
            after = info.data.get("search_after")
            return after if isinstance(after, float) else None
        return value

    @field_validator("retry_backoff_max")
    @classmethod
    def _check_backoff_max(cls, value: float, info: ValidationInfo) -> float:
        backoff = info.data.get("retry_backoff")
        if isinstance(backoff, float) and backoff > value:
            raise _error(
                f"must be at least retry_backoff ({format_duration(backoff)}), "
                f"got {format_duration(value)}"
            )
        return value

    @field_validator("history_after")
    @classmethod
    def _check_history_after(cls, value: float | None, info: ValidationInfo) -> float | None:
        after = info.data.get("search_after")
        if value is not None and isinstance(after, float) and value >= after:
            raise _error(
                f"must be shorter than search_after ({format_duration(after)}), "
                f"got {format_duration(value)}: it replaces the index wait with a shorter one"
            )
        return value

    # -- derived views ---------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self.channel

    @property
    def ref(self) -> PolicyRef:
        """What a decision event records of this policy: its name and fingerprint."""
        return PolicyRef(self.name, self.fingerprint)

    @property
    def sender(self) -> Sender:
        """What this policy contributes to each new job of its channel."""
        return Sender(self.from_, self.message_id_domain, self.ref)

    def sender_for(self, job_from: str | None) -> Sender:
        """The Sender of one job that names its own `from` (None: the policy's own).
        Raises policies.senders.SenderRefused when `allowed_from` does not allow it."""
        return job_sender(self.sender, self.allowed_from, job_from)

    def sends_as(self, from_addr: str) -> bool:
        """Whether this policy, as it stands now, lets a job send as `from_addr`: its own
        `from`, or an address its `allowed_from` allows."""
        return sends_as(self.from_, self.allowed_from, from_addr)

    @property
    def from_address(self) -> str:
        """The bare addr-spec of ``from`` (``support@example.com``)."""
        return parse_from_address(self.from_).addr_spec

    @property
    def effective_search_interval(self) -> float:
        return self.search_after if self.search_interval is None else self.search_interval

    def normalized(self) -> dict[str, Any]:
        """Field values as the TOML names them, normalized: durations in seconds, the default
        search interval filled in, ``from`` re-rendered from its parsed parts."""
        address = parse_from_address(self.from_)
        values = self.model_dump(by_alias=True)
        values["from"] = str(Address(address.display_name, addr_spec=address.addr_spec))
        values["search_interval"] = self.effective_search_interval
        if not self.allowed_from:
            # Absent, as before the field existed: unchanged policies keep their fingerprint.
            del values["allowed_from"]
        else:
            values["allowed_from"] = list(self.allowed_from)
        if self.pending_draft == "send":
            del values["pending_draft"]  # the default keeps the fingerprint it had before
        if self.give_up_after is None:
            del values["give_up_after"]  # unchanged policies keep their fingerprint
        if self.history_after is None:
            del values["history_after"]  # unchanged policies keep their fingerprint
        if self.watch_bounces is None:
            del values["watch_bounces"]  # as give_up_after
        if self.on_bounce == "record":
            del values["on_bounce"]
        if self.pause_after_unanswered == PAUSE_AFTER_UNANSWERED:
            del values["pause_after_unanswered"]  # as on_bounce
        return values

    @property
    def fingerprint(self) -> str:
        """First 16 hex digits of sha256 over the canonical JSON of :meth:`normalized`.

        Identical content gives an identical fingerprint whatever the TOML formatting, key
        order or duration spelling ("5m" == 300); any change of a value changes it.
        Every recorded decision carries it, so it is computed once per distinct policy.
        """
        return _fingerprint(self)


@functools.lru_cache(maxsize=1024)
def _fingerprint(policy: ChannelPolicy) -> str:
    # Keyed by the frozen model itself (hash and equality over its field values), not
    # cached on the instance: a copy with other values can never inherit a stale one.
    canonical = json.dumps(
        policy.normalized(), sort_keys=True, separators=(",", ":"), ensure_ascii=True
    )
    return hashlib.sha256(canonical.encode("ascii")).hexdigest()[:16]

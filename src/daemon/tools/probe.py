"""``sendledger probe``: the method checked against the user's own mailbox (docs/providers.md
"Providers").

It sends ONE real, clearly labelled message through a built-in relay that drops the
provider's reply to the send (the exact ambiguity the daemon exists for), then searches the
real mailbox until the copy shows up, and reports whether the provider kept our Message-ID,
the index lag it observed (time until the search first found the copy) and the
`search_after` it recommends. On a provider that reads its mailbox's history (Gmail's
messages.send), it takes the claim's historyId before the send, reads the history beside
the searches, and reports the history's own lag, the `history_after` it recommends and
which handle to rely on (docs/providers.md "What each handle proves"). It sends real mail,
so it refuses to run without `--yes` or an interactive "yes".
"""

from __future__ import annotations

import argparse
import math
import socket
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

from daemon.bootstrap import build_provider
from daemon.cli import output
from daemon.config.settings import (
    ConfigError,
    GmailProviderSettings,
    ProviderSettings,
    Settings,
    SmtpImapProviderSettings,
)
from daemon.exit_codes import EXIT_FAILURE, EXIT_OK, bad_input
from daemon.from_settings import settings_for
from daemon.providers.base import Provider, ProviderError, SearchResult, for_job
from daemon.providers.draft_handle import drafts_of
from daemon.providers.history_handle import HistoryProvider, HistoryTooOld
from daemon.providers.kept import opened_at
from daemon.runtime import check_provider_access
from daemon.tools.probe_drafts import (
    LAG_FACTOR,
    MIN_SEARCH_AFTER,
    drafts_handle_works,
    recommend,
    recommend_search_after,
    run_drafts_probe,
)
from ledger.content import JobInputError, validate_address
from ledger.mime import build_message
from policies.durations import DurationError, format_duration, parse_duration_within
from testkit.relay import FaultPlan, FaultRelay
from testkit.smtp_relay import SmtpFaultRelay

GMAIL_API = "https://gmail.googleapis.com"


def register(sub: Any) -> None:
    p = sub.add_parser(
        "probe", help="send one labelled real message with its reply dropped, then reconcile it"
    )
    p.add_argument("--provider", required=True, help="a [providers.NAME] of the config")
    p.add_argument("--to", required=True, help="the recipient of the probe message")
    p.add_argument("--from", dest="from_addr", help="From (default: the provider's mailbox)")
    p.add_argument("--yes", action="store_true", help="send without asking (it is real mail)")
    p.add_argument("--max-wait", default="10m", help="give up searching after this long")
    p.add_argument("--interval", default="2s", help="between searches")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_probe)


def _duration(option: str, value: str, high: float) -> float:
    try:
        return parse_duration_within(value, 0.001, high)
    except (DurationError, ValueError) as exc:
        raise bad_input(f"{option}: {exc}") from None


#: The history's recommendation never goes below this: one observation of a lag near 0
#: is not the worst case either.
MIN_HISTORY_AFTER = 1.0


def recommend_history_after(lag: float) -> float:
    """A few times the history's observed lag, rounded up to a whole second, at least one."""
    return max(MIN_HISTORY_AFTER, float(math.ceil(lag * LAG_FACTOR)))


def _confirmed(args: argparse.Namespace, name: str) -> bool:
    if args.yes:
        return True
    if not sys.stdin.isatty():
        return False
    answer = input(
        f"probe sends one real message to {args.to} through provider {name!r}. Send? [y/N] "
    )
    return answer.strip().lower() in ("y", "yes")


@contextmanager
def _through_relay(settings: Settings, name: str, *, send_via: str = "") -> Iterator[Provider]:
    """The configured provider, its sends through a relay that drops the first reply
    (a gmail provider with `send_via` replaced when given)."""
    config = settings.providers[name]
    if send_via and isinstance(config, GmailProviderSettings):
        config = config.model_copy(update={"send_via": send_via})
    if isinstance(config, SmtpImapProviderSettings):
        security = config.smtp_security

        def connect(address: tuple[str, int], timeout: float) -> socket.socket:
            # The login passes through the relay: to `localhost` with "none", on its
            # loopback addresses only, as the daemon's own SMTP client connects.
            host, port = address
            return opened_at(
                host,
                port,
                security,
                timeout,
                lambda at: socket.create_connection((at, port), timeout),
            )

        with SmtpFaultRelay(
            config.smtp_host,
            config.smtp_port,
            modes=["drop-response"],
            upstream_security=config.smtp_security,
            timeout=config.timeout,
            hang_seconds=0.0,
            connect=connect,
        ) as smtp_relay:
            local = config.model_copy(
                update={
                    "smtp_host": "127.0.0.1",
                    "smtp_port": smtp_relay.port,
                    "smtp_security": "none",
                }
            )
            yield _built(settings, name, local)
        return
    upstream = config.api_endpoint or GMAIL_API
    with FaultRelay(upstream, plan=FaultPlan(send=["drop-response"])) as http_relay:
        yield _built(settings, name, config.model_copy(update={"api_endpoint": http_relay.url}))


def _built(settings: Settings, name: str, config: ProviderSettings) -> Provider:
    patched = settings.model_copy(update={"providers": {**settings.providers, name: config}})
    return build_provider(patched, name)


def _sender(args: argparse.Namespace, settings: Settings, name: str) -> str:
    config = settings.providers[name]
    default = config.username if isinstance(config, SmtpImapProviderSettings) else config.user
    value = args.from_addr or default
    try:
        return validate_address("from", value)
    except JobInputError:
        raise bad_input(f"--from: the provider's mailbox is {value!r}: give an address") from None


def probe_message(sender: str, to: str, *, path: str = "") -> tuple[str, bytes]:
    """A fresh probe message (Message-ID, raw MIME), labelled as a test in its subject."""
    domain = sender.rpartition("@")[2].rstrip(">") or "sendledger.invalid"
    token = uuid.uuid4().hex
    message_id = f"<sendledger-probe-{token}@{domain}>"
    via = f" ({path})" if path else ""
    raw = build_message(
        from_addr=sender,
        to=[to],
        subject=f"sendledger probe {token[:8]}{via}: a test message, please ignore",
        body=(
            "This message was sent by `sendledger probe` to check that the provider keeps\n"
            "the Message-ID it was given and to measure its search index lag.\n"
            "It needs no answer.\n"
        ),
        message_id=message_id,
        date=datetime.now(UTC),
    )
    return message_id, raw


#: Seconds between two "still not found" lines of a probe's search.
PROGRESS_EVERY = 30.0


def search_until(
    provider: Provider,
    message_id: str,
    started: float,
    *,
    max_wait: float,
    interval: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    history: tuple[HistoryProvider, str] | None = None,
    progress: Callable[[str], None] = lambda _line: None,
) -> dict[str, Any]:
    """Search until the copy shows up or `max_wait` after `started` has passed; with
    `history` (the handle and the historyId taken before the send), read the history since
    it beside the searches, until it lists the copy too (its result under "history").
    `progress` is told at the first miss, then every `PROGRESS_EVERY` seconds: the wait
    is minutes long where the copy never shows (a replaced Message-ID)."""
    result: dict[str, Any] = {
        "searches": 0,
        "search_errors": 0,
        "found": False,
        "copies": 0,
        "index_lag_seconds": None,
        "query": None,
    }
    read = None if history is None else _HistoryRead(*history, message_id)
    while True:
        if read is not None and not read.done:
            read.once(clock() - started)
        last: SearchResult | None = None
        if not result["found"]:
            try:
                last = provider.search(message_id)
                result["searches"] += 1
                result["query"] = last.query
            except ProviderError as exc:
                result["search_errors"] += 1
                result["last_error"] = exc.reason
        elapsed = clock() - started
        if last is not None and last.hits:
            result.update(found=True, copies=last.count, index_lag_seconds=round(elapsed, 3))
        if read is not None:
            result["history"] = read.result
        if (result["found"] and (read is None or read.done)) or elapsed >= max_wait:
            return result
        if not result["found"]:
            said = _said_while_searching(message_id, result, elapsed, interval, max_wait)
            if said:
                progress(said)
        sleep(min(interval, max(0.0, max_wait - elapsed)))


def _said_while_searching(
    message_id: str, result: dict[str, Any], elapsed: float, interval: float, max_wait: float
) -> str:
    """The line for `search_until`'s `progress` after a miss, or "" between two."""
    searches = result["searches"] + result["search_errors"]
    if searches == 1:
        return (
            f"searching the sent mail for {message_id} every {format_duration(interval)}, "
            f"for at most {format_duration(max_wait)}: not found yet"
        )
    before = elapsed - interval  # the miss before this one
    if elapsed // PROGRESS_EVERY > max(before, 0.0) // PROGRESS_EVERY:
        step = elapsed // PROGRESS_EVERY * PROGRESS_EVERY
        return f"still not found after {format_duration(step)} ({searches} searches)"
    return ""


class _HistoryRead:
    """The history since the probe's historyId, read until it lists the copy."""

    def __init__(self, history: HistoryProvider, start: str, message_id: str) -> None:
        self.history = history
        self.start = start
        self.message_id = message_id
        self.done = False
        self.result: dict[str, Any] = {
            "history_id": start,
            "reads": 0,
            "errors": 0,
            "found": False,
            "copies": 0,
            "lag_seconds": None,
        }

    def once(self, elapsed: float) -> None:
        try:
            answer = self.history.sent_since(self.start, self.message_id)
        except HistoryTooOld as exc:
            self.result.update(errors=self.result["errors"] + 1, last_error=exc.reason)
            self.done = True  # it will not answer for this start
            return
        except ProviderError as exc:
            self.result.update(errors=self.result["errors"] + 1, last_error=exc.reason)
            return
        self.result["reads"] += 1
        self.result["query"] = answer.query
        if answer.hits:
            self.result.update(found=True, copies=answer.count, lag_seconds=round(elapsed, 3))
            self.done = True


def run_probe(
    provider: Provider,
    *,
    sender: str,
    to: str,
    max_wait: float,
    interval: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    progress: Callable[[str], None] = lambda _line: None,
) -> dict[str, Any]:
    """Send the probe with its reply dropped, then search until the copy shows up."""
    message_id, raw = probe_message(sender, to)
    # As the sender's mailbox (a gmail provider with user = "{from}" acts per mailbox).
    provider = for_job(provider, sender, None)
    handle = provider.history()
    # As a claim records it: the mailbox's historyId before the send.
    mark = handle.history_mark() if handle is not None else None
    started = clock()
    outcome = provider.send_raw(raw)
    result: dict[str, Any] = {
        "message_id": message_id,
        "send_outcome": outcome.kind.value,
        "send_reason": outcome.reason,
        "kept_message_id": None,
        "recommended_search_after": None,
    }
    searched = search_until(
        provider,
        message_id,
        started,
        max_wait=max_wait,
        interval=interval,
        clock=clock,
        sleep=sleep,
        history=None if handle is None or mark is None else (handle, mark),
        progress=progress,
    )
    result.update(searched)
    if searched["found"]:
        lag = searched["index_lag_seconds"]
        result.update(
            kept_message_id=True,
            recommended_search_after=format_duration(recommend_search_after(lag)),
        )
    # Never found: the Message-ID was replaced, or the index lags beyond max_wait (or the
    # send was really lost). Either way no search_after can be trusted.
    if handle is not None:
        _history_verdict(result, has_mark=mark is not None)
    return result


def _history_verdict(result: dict[str, Any], *, has_mark: bool) -> None:
    """The history handle's part of the report: which handle answers sooner."""
    if not has_mark:
        result["history"] = {"found": False, "error": "no historyId could be had"}
    result.update(rely_on(result))


def rely_on(result: dict[str, Any]) -> dict[str, Any]:
    """Which handle answers a lost reply sooner, and the `history_after` that believes a
    history miss (only when the history showed the copy, shorter than the search's wait)."""
    history = result.get("history") or {}
    history_lag = history.get("lag_seconds") if history.get("found") else None
    index_lag = result["index_lag_seconds"] if result["found"] else None
    after = None
    if history_lag is not None:
        candidate = recommend_history_after(history_lag)
        if candidate < recommend_search_after(index_lag or 0.0):
            after = format_duration(candidate)
    if history_lag is not None and (index_lag is None or history_lag <= index_lag):
        why = (
            "the history listed the copy before the search index did"
            if index_lag is not None
            else "only the history listed the copy"
        )
        return {"rely_on": "history", "rely_on_why": why, "recommended_history_after": after}
    if index_lag is not None:
        why = (
            "the search index showed the copy first"
            if history_lag is not None
            else "the history never listed the copy: it confirms nothing here"
        )
        return {"rely_on": "search", "rely_on_why": why, "recommended_history_after": after}
    return {
        "rely_on": None,
        "rely_on_why": "neither handle found the copy",
        "recommended_history_after": None,
    }


def run_gmail_drafts_probe(
    provider: Provider,
    *,
    sender: str,
    to: str,
    max_wait: float,
    interval: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    progress: Callable[[str], None] = lambda _line: None,
) -> dict[str, Any]:
    """The drafts path (daemon/tools/probe_drafts.py) on a provider built with send_via =
    "drafts", as the sender's mailbox."""
    scoped = for_job(provider, sender, None)
    drafts = drafts_of(scoped)
    if drafts is None:
        return {"error": f"provider {provider.name!r} has no drafts"}
    message_id, raw = probe_message(sender, to, path="drafts")

    def searched(mid: str, started: float) -> dict[str, Any]:
        return search_until(
            scoped,
            mid,
            started,
            max_wait=max_wait,
            interval=interval,
            clock=clock,
            sleep=sleep,
            progress=progress,
        )

    return run_drafts_probe(drafts, raw, message_id, search_until=searched, clock=clock)


def _probe_args(args: argparse.Namespace, settings: Settings, name: str) -> dict[str, Any]:
    """The probe's arguments, each checked (exit 2 naming its option), and the operator's
    confirmation that a real message goes out."""
    if name not in settings.providers:
        known = ", ".join(sorted(settings.providers)) or "none configured"
        raise bad_input(f"--provider: unknown provider {name!r} (known: {known})")
    try:
        to = validate_address("to", args.to)
    except JobInputError as exc:
        raise bad_input(f"--to: {exc}") from None
    max_wait = _duration("--max-wait", args.max_wait, 86400.0)
    interval = _duration("--interval", args.interval, 3600.0)
    sender = _sender(args, settings, name)
    if not _confirmed(args, name):
        raise bad_input("probe sends a real message: confirm with --yes (or answer y)")
    probe_args: dict[str, Any] = {
        "sender": sender,
        "to": to,
        "max_wait": max_wait,
        "interval": interval,
        # On stderr, --json too: stdout holds the report alone.
        "progress": lambda line: print(f"probe: {line}", file=sys.stderr, flush=True),
    }
    return probe_args


def cmd_probe(args: argparse.Namespace) -> int:
    settings = settings_for(args.config)
    name = args.provider
    probe_args = _probe_args(args, settings, name)
    # On Gmail the first message goes by messages.send whatever send_via says.
    with _through_relay(settings, name, send_via="messages") as provider:
        try:
            result = run_probe(provider, **probe_args)
        finally:
            provider.close()
    to = probe_args["to"]
    result = {"provider": name, "kind": settings.providers[name].kind, "to": to, **result}
    config = settings.providers[name]
    ok = bool(result["found"])
    if isinstance(config, GmailProviderSettings):
        try:
            with _through_relay(settings, name, send_via="drafts") as provider:
                try:
                    check_provider_access({name: provider})  # names a missing gmail.compose
                    drafts = run_gmail_drafts_probe(provider, **probe_args)
                finally:
                    provider.close()
        except ConfigError as exc:
            drafts = {"error": str(exc)}
        result["send_via_now"] = config.send_via
        result["drafts"] = drafts
        result["recommended"] = recommend(result, drafts)
        ok = ok or drafts_handle_works(drafts)
    if args.json:
        print(output.dumps(result))
    else:
        print(_report(result, probe_args["max_wait"]))
    return EXIT_OK if ok else EXIT_FAILURE


def _report(result: dict[str, Any], max_wait: float) -> str:
    lines = [
        f"provider {result['provider']} ({result['kind']}): probe sent to {result['to']}",
        f"  Message-ID:       {result['message_id']}",
        f"  send (reply dropped by the relay): {result['send_outcome']} ({result['send_reason']})",
    ]
    if result["found"]:
        lines += [
            f"  found by search:  {result['copies']} copy(ies),"
            f" after {result['searches']} search(es)",
            "  Message-ID kept:  yes (the stored copy's header is exactly ours)",
            f"  index lag:        {result['index_lag_seconds']}s (send to first hit)",
            f'  recommended:      search_after = "{result["recommended_search_after"]}"'
            f" (at least {LAG_FACTOR:g} x the lag, at least {format_duration(MIN_SEARCH_AFTER)})",
        ]
    else:
        lines += [
            f"  NOT FOUND within {format_duration(max_wait)} ({result['searches']} searches,"
            f" {result['search_errors']} failed): the provider may replace the Message-ID, or"
            ' its index lags longer; do not use on_unknown = "retry" with it',
        ]
    if "rely_on" in result:
        lines += _history_report(result, max_wait)
    if "drafts" in result:
        lines += _drafts_report(result["drafts"], result["recommended"], result["send_via_now"])
    return "\n".join(lines)


def _history_report(result: dict[str, Any], max_wait: float) -> list[str]:
    history = result.get("history") or {}
    if history.get("found"):
        found = f"{history['lag_seconds']}s (send to first listing, {history['reads']} read(s))"
    elif history.get("error") or history.get("last_error"):
        found = f"not read ({history.get('error') or history.get('last_error')})"
    else:
        found = f"never listed with our Message-ID within {format_duration(max_wait)}"
    lines = [f"  history lag:      {found}"]
    choice = result["rely_on"]
    lines.append(
        f"  rely on:          the {choice}: {result['rely_on_why']}"
        if choice
        else f"  rely on:          nothing: {result['rely_on_why']}"
    )
    if result.get("recommended_history_after"):
        lines.append(
            f'  recommended:      history_after = "{result["recommended_history_after"]}"'
            f" (at least {LAG_FACTOR:g} x the history's lag, at least"
            f" {format_duration(MIN_HISTORY_AFTER)}; a policy field)"
        )
    return lines


def _yes_no(value: object) -> str:
    if value is None:
        return "not known"
    return "yes" if value else "NO"


def _drafts_report(drafts: dict[str, Any], recommended: dict[str, Any], now: str) -> list[str]:
    lines = ["drafts path (drafts.create, then drafts.send with its reply dropped):"]
    if "message_id" in drafts:
        lines.append(f"  Message-ID:       {drafts['message_id']}")
    if drafts.get("send_outcome") is not None:
        lines.append(f"  send:             {drafts['send_outcome']} ({drafts['send_reason']})")
    if drafts.get("error"):
        lines.append(f"  FAILED:           {drafts['error']}")
    if drafts.get("draft_created"):
        lag = drafts.get("index_lag_seconds")
        lines += [
            f"  consumed draft answered as gone:         {_yes_no(drafts['gone_after_send'])}",
            f"  sent message found under its message id: {_yes_no(drafts['found_by_message_id'])}",
            f"  Message-ID kept on drafts.send:          {_yes_no(drafts['kept_message_id'])}",
            f"  index lag:        {'not measured' if lag is None else f'{lag}s'}",
        ]
    choice = recommended["send_via"]
    lines.append(
        f'recommended: send_via = "{choice}" (now "{now}"): {recommended["why"]}'
        if choice
        else f"recommended: {recommended['why']}"
    )
    if recommended.get("search_after"):
        lines.append(
            f'             search_after = "{recommended["search_after"]}"'
            f" ({recommended['search_note']})"
        )
    elif recommended.get("search_note"):
        lines.append(f"             {recommended['search_note']}")
    return lines

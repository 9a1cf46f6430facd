"""`sendledger emulator gmail|graph` and `sendledger relay`: the test kit's doubles as processes.

The doubles themselves live in the standalone `testkit` package; this module is only their
command line (flags, duration parsing, signal handling), which is why it belongs to the daemon.
"""

from __future__ import annotations

import argparse
import json
import secrets
import signal
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

from ledger.exceptions import SendledgerError
from policies.durations import DurationError, parse_duration_within
from testkit import MODES, FaultPlan, FaultRelay, GmailEmulator, Mode, check_mode
from testkit.credentials import write_service_account
from testkit.graph_emulator import DEFAULT_CLIENT_ID as GRAPH_CLIENT_ID
from testkit.graph_emulator import DEFAULT_TENANT as GRAPH_TENANT
from testkit.graph_emulator import GraphEmulator
from testkit.tls import make_loopback_tls

#: The request kinds the relay's options break (testkit.relay.classify).
RELAY_KINDS = ("send", "search", "token", "history", "other")


class _BadOption(SendledgerError):
    def __init__(self, option: str, message: str) -> None:
        super().__init__(f"{option}: {message}")


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    emulator = subparsers.add_parser("emulator", help="run a provider emulator")
    kinds = emulator.add_subparsers(dest="emulator_kind", metavar="KIND", required=True)
    gmail = kinds.add_parser(
        "gmail",
        help="the Gmail API and Google's OAuth token endpoint on one port",
        description="Serve /token and the Gmail API paths until SIGINT or SIGTERM. Prints "
        "its URL on one line.",
    )
    gmail.add_argument("--host", default="127.0.0.1", help="address to listen on (127.0.0.1)")
    gmail.add_argument("--port", default="0", help="0 picks a free port (default)")
    gmail.add_argument("--lag", default="0", help="search index lag, e.g. 30s (default 0)")
    gmail.add_argument(
        "--history-lag", default="0", help="users.history.list lag, e.g. 2s (default 0)"
    )
    gmail.add_argument("--accept-log", metavar="PATH", help="append accepted messages as JSON")
    gmail.add_argument("--no-auth", action="store_true", help="accept requests without a token")
    gmail.add_argument(
        "--rewrite-message-id",
        action="store_true",
        help="replace the Message-ID of each message sent, by messages.send and by"
        " drafts.send, in search, get and history alike (simulates the reported Gmail"
        " behaviour)",
    )
    gmail.add_argument(
        "--write-service-account",
        metavar="PATH",
        help="write a service-account JSON whose token_uri is this emulator's",
    )
    gmail.set_defaults(func=run_gmail)

    graph = kinds.add_parser(
        "graph",
        help="Microsoft Graph mail and the identity platform's token endpoint on one port",
        description="Serve msal's tenant discovery, /{tenant}/oauth2/v2.0/token and the Graph "
        "mail paths over HTTPS (a throw-away CA; msal takes https only) until SIGINT or "
        "SIGTERM. Prints one JSON line: url, authority, api_endpoint, tenant_id, client_id, "
        "ca_file; trust ca_file through REQUESTS_CA_BUNDLE.",
    )
    graph.add_argument("--host", default="127.0.0.1", help="address to listen on (127.0.0.1)")
    graph.add_argument("--port", default="0", help="0 picks a free port (default)")
    graph.add_argument("--lag", default="0", help="$filter search lag, e.g. 30s (default 0)")
    graph.add_argument(
        "--file-delay", default="0", help="202 to the copy in Sent Items, e.g. 2s (default 0)"
    )
    graph.add_argument("--accept-log", metavar="PATH", help="append sent messages as JSON")
    graph.add_argument("--tenant-id", default=GRAPH_TENANT, help="the tenant it answers for")
    graph.add_argument("--client-id", default=GRAPH_CLIENT_ID, help="the app it gives tokens to")
    graph.add_argument(
        "--client-secret-file",
        metavar="PATH",
        help="the client secret is this file's first line (default: written to --tls-dir)",
    )
    graph.add_argument(
        "--tls-dir", metavar="DIR", help="where the CA and certificate go (default: a temp dir)"
    )
    graph.add_argument(
        "--rewrite-message-id",
        action="store_true",
        help="replace each sent Message-ID (a provider that does not keep ours)",
    )
    graph.set_defaults(func=run_graph)

    relay = subparsers.add_parser(
        "relay",
        help="a fault-injecting HTTP relay in front of a provider",
        description="Forward to --upstream, breaking chosen requests. A single mode applies "
        "to every request of its kind; a comma-separated list is used one request at a "
        f"time, then --default applies. Modes: {', '.join(MODES)}.",
    )
    relay.add_argument(
        "--upstream", required=True, metavar="URL", help="the API it relays to (the emulator)"
    )
    relay.add_argument("--host", default="127.0.0.1", help="address to listen on (127.0.0.1)")
    relay.add_argument("--port", default="0", help="0 picks a free port (default)")
    for kind in RELAY_KINDS:
        relay.add_argument(
            f"--{kind}",
            metavar="MODE[,MODE...]",
            help=f"what each {kind} request meets, in order; then --default",
        )
    relay.add_argument(
        "--default", default="pass", metavar="MODE", help="the mode after a list (pass)"
    )
    relay.add_argument("--seed", help="with --send-mix: seeded random modes")
    relay.add_argument(
        "--send-mix", metavar="MODE=WEIGHT,...", help="random modes for sends, by weight"
    )
    relay.add_argument(
        "--search-mix", metavar="MODE=WEIGHT,...", help="random modes for searches, by weight"
    )
    relay.add_argument("--hang", default="30s", help="how long hang modes hold (default 30s)")
    relay.add_argument(
        "--slow", default="1s", help="how long slow mode waits before it forwards (default 1s)"
    )
    relay.add_argument(
        "--retry-after", default="1s", help="Retry-After on 429/503/403 faults, or 'none'"
    )
    relay.add_argument("--reset", action="store_true", help="drop connections with a TCP RST")
    relay.add_argument(
        "--upstream-ca",
        metavar="FILE",
        help="CA file an https upstream is checked against (e.g. emulator graph's ca_file)",
    )
    relay.set_defaults(func=run_relay)


def _port(value: str) -> int:
    try:
        port = int(value)
    except ValueError as exc:
        raise _BadOption("--port", f"not a port number: {value!r}") from exc
    if not 0 <= port <= 65535:
        raise _BadOption("--port", f"out of range: {port}")
    return port


def _duration(option: str, value: str) -> float:
    try:
        return parse_duration_within(value, 0.0, 86400.0)  # a test's lag or hang: <= 1d
    except DurationError as exc:
        raise _BadOption(option, str(exc)) from exc


def _modes(option: str, value: str) -> Mode | list[Mode]:
    try:
        modes = [check_mode(item.strip()) for item in value.split(",")]
    except ValueError as exc:
        raise _BadOption(option, str(exc)) from exc
    return modes[0] if len(modes) == 1 else modes


def _weights(option: str, value: str) -> dict[Mode, float]:
    weights: dict[Mode, float] = {}
    for item in value.split(","):
        name, sep, number = item.partition("=")
        try:
            mode = check_mode(name.strip())
            weight = float(number)
        except ValueError as exc:
            raise _BadOption(option, f"expected MODE=WEIGHT, got {item!r} ({exc})") from exc
        if not sep or weight < 0:
            raise _BadOption(option, f"expected MODE=WEIGHT with WEIGHT >= 0, got {item!r}")
        weights[mode] = weight
    if not any(weights.values()):
        raise _BadOption(option, "at least one weight must be positive")
    return weights


def _build_plan(args: argparse.Namespace) -> FaultPlan:
    if args.send_mix is None and args.search_mix is None:
        if args.seed is not None:
            raise _BadOption("--seed", "only meaningful with --send-mix")
        kwargs: dict[str, Mode | list[Mode]] = {}
        for kind in RELAY_KINDS:
            value = getattr(args, kind)
            if value is not None:
                kwargs[kind] = _modes(f"--{kind}", value)
        default = _modes("--default", args.default)
        if isinstance(default, list):
            raise _BadOption("--default", "takes one mode")
        return FaultPlan(**kwargs, default=default)
    if args.send_mix is None:
        raise _BadOption("--search-mix", "needs --send-mix")
    if args.seed is None:
        raise _BadOption("--send-mix", "needs --seed N (runs must be reproducible)")
    if args.send is not None or args.search is not None:
        raise _BadOption("--send-mix", "cannot be combined with --send or --search")
    try:
        seed = int(args.seed)
    except ValueError as exc:
        raise _BadOption("--seed", f"not an integer: {args.seed!r}") from exc
    search = _weights("--search-mix", args.search_mix) if args.search_mix else None
    return FaultPlan.random(seed, _weights("--send-mix", args.send_mix), search)


def _wait_for_signal(args: argparse.Namespace) -> None:
    """Until SIGINT or SIGTERM: the handlers were installed by `_guarded` before anything
    started, so a signal sent as soon as the URL is printed is never the default action."""
    stop: threading.Event = args.stop_signal
    # A timed wait keeps the main thread responsive to signals on every platform.
    while not stop.wait(0.5):
        pass


def _guarded(body: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        stop = args.stop_signal = threading.Event()

        def handler(signum: int, frame: FrameType | None) -> None:
            stop.set()

        previous = {sig: signal.signal(sig, handler) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            return body(args)
        except _BadOption as exc:
            print(f"sendledger: {exc}", file=sys.stderr)
            return 2
        except OSError as exc:
            print(f"sendledger: cannot listen: {exc}", file=sys.stderr)
            return 1
        finally:
            for sig, old in previous.items():
                signal.signal(sig, old)

    return run


def _run_gmail(args: argparse.Namespace) -> int:
    port = _port(args.port)
    lag = _duration("--lag", args.lag)
    history_lag = _duration("--history-lag", args.history_lag)
    emulator = GmailEmulator(
        host=args.host,
        port=port,
        lag=lag,
        history_lag=history_lag,
        acceptance_log=Path(args.accept_log) if args.accept_log else None,
        require_auth=not args.no_auth,
        rewrite_message_id=args.rewrite_message_id,
    ).start()
    try:
        if args.write_service_account:
            write_service_account(Path(args.write_service_account), token_uri=emulator.token_uri)
        print(emulator.url, flush=True)
        _wait_for_signal(args)
    finally:
        emulator.stop()
    return 0


def _run_graph(args: argparse.Namespace) -> int:
    port = _port(args.port)
    lag = _duration("--lag", args.lag)
    file_delay = _duration("--file-delay", args.file_delay)
    with tempfile.TemporaryDirectory(prefix="sendledger-graph-") as scratch:
        folder = Path(args.tls_dir) if args.tls_dir else Path(scratch)
        if args.client_secret_file:
            try:
                secret = Path(args.client_secret_file).read_text("utf-8").splitlines()[0]
            except (OSError, UnicodeDecodeError, IndexError) as exc:
                raise _BadOption(
                    "--client-secret-file", f"cannot read a first line: {exc}"
                ) from exc
            secret_file = Path(args.client_secret_file)
        else:
            folder.mkdir(parents=True, exist_ok=True)
            secret, secret_file = secrets.token_urlsafe(24), folder / "client-secret"
            secret_file.write_text(secret + "\n", encoding="utf-8")
            secret_file.chmod(0o600)
        emulator = GraphEmulator(
            host=args.host,
            port=port,
            tls=make_loopback_tls(folder),
            tenant_id=args.tenant_id,
            clients={args.client_id: secret},
            lag=lag,
            file_delay=file_delay,
            acceptance_log=Path(args.accept_log) if args.accept_log else None,
            rewrite_message_id=args.rewrite_message_id,
        ).start()
        try:
            assert emulator.tls is not None
            facts = {
                "url": emulator.url,
                "authority": emulator.authority,
                "api_endpoint": emulator.api_endpoint,
                "tenant_id": args.tenant_id,
                "client_id": args.client_id,
                "client_secret_file": str(secret_file.absolute()),
                "ca_file": str(emulator.tls.ca_file.absolute()),
            }
            print(json.dumps(facts), flush=True)
            _wait_for_signal(args)
        finally:
            emulator.stop()
    return 0


def _run_relay(args: argparse.Namespace) -> int:
    port = _port(args.port)
    hang = _duration("--hang", args.hang)
    slow = _duration("--slow", args.slow)
    retry_after = (
        None
        if args.retry_after.strip().lower() == "none"
        else _duration("--retry-after", args.retry_after)
    )
    plan = _build_plan(args)
    try:
        relay = FaultRelay(
            args.upstream,
            host=args.host,
            port=port,
            plan=plan,
            hang_seconds=hang,
            slow_seconds=slow,
            retry_after=retry_after,
            reset=args.reset,
            upstream_ca=args.upstream_ca,
        )
    except ValueError as exc:
        raise _BadOption("--upstream", str(exc)) from exc
    except OSError as exc:  # an unreadable CA file: before anything listens
        raise _BadOption("--upstream-ca", f"cannot load {args.upstream_ca}: {exc}") from exc
    relay.start()
    try:
        print(relay.url, flush=True)
        _wait_for_signal(args)
    finally:
        relay.stop()
    return 0


run_gmail = _guarded(_run_gmail)
run_relay = _guarded(_run_relay)
run_graph = _guarded(_run_graph)

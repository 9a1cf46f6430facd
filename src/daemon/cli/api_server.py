"""`sendledger api`: the HTTP API alone (intake, job state, review; no sending), for hosts
that share a PostgreSQL store with the sending daemons (docs/http-api.md "HTTP API")."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from daemon.config.secret_files import warn_exposed_secrets
from daemon.config.settings import parse_listen
from daemon.engine.policy_holder import PolicyHolder
from daemon.exit_codes import bad_input
from daemon.from_settings import declare_server, load_policies, open_ledger, settings_for
from daemon.logs import setup_logging
from ledger.stores.identity import IdentityLock, IdentityTaken, api_lock_name

if TYPE_CHECKING:
    from daemon.config.settings import Settings
    from ledger.application import Ledger
    from ledger.stores.identity import NameSession

log = logging.getLogger("sendledger")


def register(sub: Any) -> None:
    p = sub.add_parser("api", help="serve the HTTP API and review page alone (no sending)")
    p.add_argument("--listen", help="HOST:PORT (default: api.listen)")
    p.set_defaults(func=cmd_api)


def cmd_api(args: argparse.Namespace) -> int:
    from daemon.cli import keep_hangups

    # Until the server's own handlers are in place: a SIGHUP's default action would end
    # the process, and the policies may be read already (and changed since). Kept (from
    # `main`'s first line), it reloads them once the server runs.
    keep_hangups()
    settings = settings_for(args.config)
    if args.listen:
        if parse_listen(args.listen) is None:
            raise bad_input(
                f"--listen: HOST:PORT expected (127.0.0.1:8025, [::1]:8025), got {args.listen!r}"
            )
        api = settings.api.model_validate({**settings.api.model_dump(), "listen": args.listen})
        settings = settings.model_copy(update={"api": api})
    if not settings.api.listen:
        raise bad_input(f"{settings.config_path}: api.listen: not set (or pass --listen)")
    setup_logging(settings.daemon.log_level)
    # As `run` does: a token file (or any secret) others can read is said at start-up.
    warn_exposed_secrets(settings)
    policies = PolicyHolder(lambda: load_policies(settings))  # exit 2 on a broken folder
    from daemon.secret_reads import load_tokens

    load_tokens(settings)  # a bad token file is refused before the store is created
    name = settings.daemon.name
    # A store too new is refused at the open, nothing written; the server declares its
    # event format once it holds its name, as `run` does: a second `api` of the name
    # refused replaces nothing of the running one's (docs/configuration.md "Daemon names").
    with open_ledger(settings, service=True, writes=False) as ledger:
        identity = _hold_name(ledger, name)
        try:
            return _serve(settings, ledger, policies, identity)
        finally:
            identity.release()


def _hold_name(ledger: Ledger, name: str) -> IdentityLock:
    """This API server's name on the store: one per `daemon.name` and store, apart from
    the daemon's own (`api_lock_name`). IdentityTaken (exit 3) while another `sendledger
    api` of the name runs on it."""
    try:
        return ledger.hold_identity(api_lock_name(name))
    except IdentityTaken as exc:
        raise IdentityTaken(name, exc.where, by=_BY) from None


_BY = "sendledger api"


def _serve(
    settings: Settings, ledger: Ledger, policies: PolicyHolder, identity: IdentityLock
) -> int:
    from daemon.api.build import api_context, bound_server
    from daemon.cli import HANGUPS
    from daemon.service_layer.loaded import (
        announce_policies,
        format_watch,
        give_back_refused_start,
    )
    from ledger.event_format import StoreFormatNewer
    from ledger.stores.loaded_policies import API

    name = settings.daemon.name
    try:
        declare_server(ledger, (API, name))
    except BaseException:
        give_back_refused_start(ledger)  # put back while the name is held
        raise
    # Intake judged as `submit` judges: by the folder and the daemons' rows, not by a
    # set of this process's own that only its SIGHUP changes.
    ctx = api_context(settings, ledger, policies, dict.fromkeys(settings.providers), by_folder=True)
    try:
        server = bound_server(settings, ctx, option="--listen")
    except BaseException:
        give_back_refused_start(ledger)  # the store as this refused start found it
        raise
    log.info("sendledger api on http://%s (intake and review only)", settings.api.listen)
    # Its loaded set in the store, beside the daemons' (an operator's view; intake
    # judges by the daemons' rows, since they are what sends).
    # Its heartbeat reads the store's event format again, as the daemon's does: on a
    # newer one it stops, exit 2 and the start's line (docs/operations.md "Upgrading");
    # and asks its name: on PostgreSQL a database restart ends the name's lock, taken
    # again here, and taken meanwhile by another `sendledger api`, this one stops, exit 3.
    stops: list[StoreFormatNewer | IdentityTaken] = []

    def stop_for(exc: StoreFormatNewer | IdentityTaken) -> None:
        log.error("stopping: %s", exc)
        stops.append(exc)

    def held_by() -> NameSession | None:
        # Before each write of its row, not after: a lock the restart ended is taken
        # again first, and a name another `sendledger api` took meanwhile stops this one
        # with its row left to that one (written only while this session holds the
        # name); before, it wrote over the new server's row once more, up to a beat
        # (20 s) after, and its stop then removed it.
        if not stops:
            _check_name(identity, name, stop_for)
        return identity.session()

    try:
        announcer = announce_policies(
            ledger, name, policies, API, on_beat=format_watch(ledger, stop_for), held_by=held_by
        )
    except BaseException:
        # Refused as at the bind (its heartbeat's thread not started, the store gone):
        # its port let go, and its declaration taken back as `run` does; left, it
        # counted as a server starting on the store (`admin copy-store` refused it).
        server.stop()
        give_back_refused_start(ledger)
        raise
    try:
        # SIGHUP reloads the policies intake judges by, as in the daemon: without it
        # the signal's default action ended the process, and a changed folder was
        # never read.
        code = server.run(on_hangup=policies.reload, hangups=HANGUPS, stop_when=lambda: bool(stops))
    finally:
        announcer.stop()
    if stops:
        raise stops[0]
    return code


def _check_name(identity: IdentityLock, name: str, lost: Callable[[IdentityTaken], None]) -> None:
    try:
        identity.check()
    except IdentityTaken as exc:
        lost(IdentityTaken(name, exc.where, by=_BY))
    except Exception as exc:
        # The store cannot be reached now (a restart): asked again at the next beat.
        log.debug("daemon.name %r not asked at the heartbeat: %s", name, exc)

"""`sendledger admin copy-store` and `sendledger admin backup` (docs/operations.md "Moving
to PostgreSQL", "Backups"): what a copy carries is `daemon/service_layer/copy_store.py`,
how a backup is taken `ledger/stores/sqlite_backup.py`."""

from __future__ import annotations

import argparse
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from daemon.cli import output
from daemon.cli.admin_purge import ctrl_c_between_steps
from daemon.cli.parsers import add_command
from daemon.config.store_section import encryption_keys
from daemon.exit_codes import EXIT_INTERRUPTED, EXIT_OK, bad_input
from daemon.from_settings import open_ledger, store_settings_for, store_spec
from ledger.display import printable
from ledger.stores import store_exists
from ledger.stores.keycheck import COPY_FINISHED, COPY_STARTED
from ledger.stores.url import (
    MemoryStore,
    SqliteStore,
    StoreSpec,
    StoreUrlError,
    parse_store_url,
)

#: How a store's open and its URL's parse begin a refusal (`ledger.stores`).
STORE_URL = "store.url: "
#: Seconds between two progress lines of a copy.
PROGRESS_EVERY = 2.0
#: Seconds between two looks at a read of the destination after a Ctrl-C (`_read_aside`).
WAIT_STEP = 0.1
T = TypeVar("T")


def register(admin: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = add_command(
        admin,
        "copy-store",
        cmd_copy_store,
        "copy every event of the store into an empty one, rebuild its index, verify it "
        "(docs/operations.md 'Moving to PostgreSQL')",
    )
    p.add_argument(
        "--to",
        required=True,
        metavar="URL",
        help="the empty destination store, e.g. postgresql://user:pw@host:5432/db",
    )
    p = add_command(
        admin,
        "backup",
        cmd_backup,
        "a consistent copy of a SQLite store into FILE, while the daemon runs "
        "(docs/operations.md 'Backups')",
    )
    p.add_argument("file", metavar="FILE", help="the new file (never overwritten)")


def cmd_copy_store(args: argparse.Namespace) -> int:
    from daemon.service_layer.copy_store import copy_store, left_at

    settings = store_settings_for(args.config)
    try:
        destination = parse_store_url(args.to, base_dir=settings.base_dir)
    except StoreUrlError as exc:
        raise bad_input(f"--to: {exc}") from None
    if isinstance(destination, MemoryStore):
        raise bad_input("--to: a memory:// store ends with this command: sqlite or postgresql")
    keys = encryption_keys(settings)
    shown = [0.0]

    def progress(copied: int, total: int) -> None:
        now = time.monotonic()
        if now - shown[0] >= PROGRESS_EVERY:
            shown[0] = now
            print(f"... {copied} of {total} events copied", file=sys.stderr, flush=True)

    try:
        with (
            open_ledger(settings, create=False) as source,
            ctrl_c_between_steps() as asked,
        ):
            try:
                result = copy_store(
                    source,
                    destination,
                    encryption_keys=keys,
                    progress=progress,
                    stop=lambda: bool(asked),
                )
            except StoreUrlError as exc:
                # The destination's open words it as a store's (`store.url: ...`, as its
                # URL's parse does above), and the source is open already: said of --to.
                if not str(exc).startswith(STORE_URL):
                    raise
                raise bad_input(f"--to: {exc}") from None
    except KeyboardInterrupt:
        # A second Ctrl-C interrupts wherever the copy was: what it left is read, so
        # that a finished copy is not emptied on a guess, nor an unfinished one used.
        try:
            mark = _read_aside(lambda: left_at(destination, keys))
        except (Exception, KeyboardInterrupt) as exc:
            # The destination may be what the copy was stuck on (a server gone silent),
            # and a third Ctrl-C may end this read too: the interruption is still said.
            _say_unread(destination, str(exc) or "Ctrl-C again")
            return EXIT_INTERRUPTED
        _say_interrupted(destination, mark)
        return EXIT_INTERRUPTED
    if result.finished and asked:
        # Asked once the last check had passed: the copy was marked finished and the
        # source's end read once more. Stopping it then would throw a sound copy away.
        output.error(
            f"Ctrl-C came after the copy's last check: not stopped, {result.destination} "
            "is a finished copy, verified"
        )
    if not result.finished:
        output.error(
            f"interrupted: {result.events} of {result.total} events copied; "
            f"{_unfinished(result.destination)}"
        )
        return EXIT_INTERRUPTED
    if args.json:
        print(output.dumps(result.as_dict()))
        return EXIT_OK
    print(
        f"copied {result.events} events from {result.source} to {result.destination} "
        f"in {result.seconds:.1f}s"
    )
    print(
        f"verified: each of the {result.aggregates} aggregates has the same event count and "
        "last version on both sides, every event the same bytes in the same order"
    )
    print(
        f"index rebuilt: {result.jobs} jobs; webhook positions copied: {result.webhooks}; "
        f"point store.url at {result.destination} before a daemon starts"
    )
    return EXIT_OK


def _read_aside(read: Callable[[], T]) -> T:
    """`read()` in a thread of its own, this one waiting for it a tenth of a second at a
    time: a Ctrl-C's handler runs only in this thread, between two Python steps, and the
    read may wait in C (SQLite's busy timeout, 30 s, on a destination another process
    holds): a third Ctrl-C was answered only once it ended. Now it is at once (the
    KeyboardInterrupt is raised here; the read is left to end with the process)."""
    answer: list[T] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            answer.append(read())
        except BaseException as exc:  # handed to the waiting thread, which raises it
            failure.append(exc)

    reader = threading.Thread(target=run, name="copy-store-read-destination", daemon=True)
    reader.start()
    while reader.is_alive():
        reader.join(WAIT_STEP)
    if failure:
        raise failure[0]
    return answer[0]


def _unfinished(destination: str) -> str:
    return (
        f"{destination} is marked an unfinished copy, which nothing opens: empty it "
        "(remove the SQLite file, or drop the PostgreSQL schema) and copy again"
    )


def _say_interrupted(destination: StoreSpec, mark: str | None) -> None:
    from daemon.service_layer.copy_store import where

    name = where(destination)
    if mark == COPY_FINISHED:
        output.error(
            f"interrupted after the copy was finished: {name} is a finished copy, "
            f"verified; point store.url at {name} before a daemon starts"
        )
    elif mark == COPY_STARTED:
        output.error(f"interrupted: {_unfinished(name)}")
    else:
        output.error(f"interrupted before the copy wrote to {name}: nothing to empty")


def _say_unread(destination: StoreSpec, why: str) -> None:
    from daemon.service_layer.copy_store import where

    reason = why.strip().splitlines()[0]
    output.error(
        f"interrupted; what the copy left at {where(destination)} could not be read "
        f"({reason}): nothing opens it while it is an unfinished copy, and the command "
        "run again says what to empty"
    )


def cmd_backup(args: argparse.Namespace) -> int:
    from ledger.stores.sqlite_backup import backup

    settings = store_settings_for(args.config)
    try:
        spec = store_spec(settings)
    except StoreUrlError as exc:
        raise bad_input(f"{settings.config_path}: {exc}") from None
    if not isinstance(spec, SqliteStore):
        raise bad_input(
            f"admin backup copies a SQLite store; {spec.describe()} is backed up by its "
            "server's own tools (pg_dump)"
        )
    if not store_exists(spec):
        raise bad_input(f"no store at {spec.describe()} (store.url of {settings.config_path})")
    target = Path(args.file)
    try:
        result = backup(spec, target)
    except StoreUrlError as exc:
        raise bad_input(str(exc)) from None
    if args.json:
        print(output.dumps(result.as_dict()))
    else:
        # printable: a file name may hold a line break, and this is one line
        print(
            f"backed up {printable(result.store)} to {printable(result.file)} "
            f"({result.bytes} bytes, {result.seconds:.1f}s)"
        )
    return EXIT_OK


__all__ = ["cmd_backup", "cmd_copy_store", "register"]

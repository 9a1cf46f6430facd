"""`sendledger api` as a process over a folder of its own, its provider the Gmail
emulator in this process (so a check searches a real, emulated mailbox); what the
review-page and the HTTP examples tests run against. It is forked from the test worker's
fork server (tests/e2e/fork_server.py), which imported the API's stack (FastAPI, the
providers, the stores) once: a process of its own, as the console script would be, without
the seconds of imports that made it miss its start-up deadline on a loaded machine."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import httpx
from tests.e2e.daemon_kit import shared_fork_server
from tests.integration.api_kit import TOKEN, free_port

from testkit.credentials import write_service_account
from testkit.gmail_emulator import GmailEmulator

MAILBOX = "shop@shop.example"


@contextmanager
def sendledger_api(
    folder: Path,
    starting: Callable[[list[int]], AbstractContextManager[object]] | None = None,
    exits: int = 0,
) -> Iterator[tuple[str, Path, GmailEmulator]]:
    """(the API's URL, the folder, the emulator) while `sendledger api` runs. `starting`
    (a test that holds the start-up up): entered before the process starts, with a list
    that then gets its pid, and left before the wait for it to answer. `exits`: its exit
    code once SIGTERM stopped it, or once it stopped by itself."""
    port = free_port()
    emulator = GmailEmulator()
    emulator.start()
    write_service_account(folder / "sa.json", token_uri=emulator.token_uri)
    (folder / "policies").mkdir()
    (folder / "policies" / "receipts.toml").write_text(
        'provider = "support"\nfrom = "Support <support@example.com>"\n'
        'message_id_domain = "mail.example.com"\non_unknown = "review"\n'
    )
    (folder / "api-tokens").write_text(f"alice:{TOKEN}\n")
    (folder / "sendledger.toml").write_text(
        '[store]\nurl = "sqlite:///ledger.sqlite"\n[daemon]\npolicies_dir = "policies"\n'
        '[providers.support]\nkind = "gmail"\ncredentials_file = "sa.json"\n'
        f'user = "{MAILBOX}"\napi_endpoint = "{emulator.url}"\n'
        f'token_uri = "{emulator.token_uri}"\n'
        f'[api]\nlisten = "127.0.0.1:{port}"\ntoken_file = "api-tokens"\n'
    )
    log = folder / "api.log"
    server = shared_fork_server()
    pids: list[int] = []
    with starting(pids) if starting is not None else contextlib.nullcontext():
        pid = server.start(["--config", str(folder / "sendledger.toml"), "api"], folder, log)
        pids.append(pid)
    (folder / "api.pid").write_text(str(pid))  # for a test that signals it
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            try:
                code, _at = server.exited(pid, timeout=0.05)
            except TimeoutError:  # still starting
                pass
            else:
                raise AssertionError(f"sendledger api exited {code}: {log.read_text()}")
            assert time.monotonic() < deadline, "sendledger api did not start"
        yield url, folder, emulator
    finally:
        with contextlib.suppress(ProcessLookupError):  # it may have stopped by itself
            os.kill(pid, signal.SIGTERM)
        assert server.exited(pid, timeout=15)[0] == exits, log.read_text()
        emulator.stop()

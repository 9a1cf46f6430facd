"""`sendledger api` as a process over a folder of its own, its provider the Gmail
emulator in this process (so a check searches a real, emulated mailbox); what the
review-page and the HTTP examples tests run against."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
from tests.e2e.conftest import sendledger_command
from tests.integration.api_kit import TOKEN, free_port

from testkit.credentials import write_service_account
from testkit.gmail_emulator import GmailEmulator

MAILBOX = "shop@shop.example"


@contextmanager
def sendledger_api(folder: Path) -> Iterator[tuple[str, Path, GmailEmulator]]:
    """(the API's URL, the folder, the emulator) while `sendledger api` runs."""
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
    log = (folder / "api.log").open("wb")
    process = subprocess.Popen(
        [*sendledger_command(), "--config", str(folder / "sendledger.toml"), "api"],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                if httpx.get(url + "/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert process.poll() is None, (folder / "api.log").read_text()
            assert time.monotonic() < deadline, "sendledger api did not start"
            time.sleep(0.05)
        yield url, folder, emulator
    finally:
        process.terminate()
        assert process.wait(timeout=15) == 0
        log.close()
        emulator.stop()

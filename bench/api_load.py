"""HTTP intake under load: 2,000 POST /v1/jobs from a second process, 32 at a time, on
loopback, next to the ledger's direct `Ledger.submit` rate measured in the same run.

The server is `sendledger api` (a subprocess, SQLite store in a temp folder). The client
(this process) posts new jobs, then re-posts a tenth of them (must be 200) and one with
changed content (must be 409). Afterwards every key is in the store exactly once. A
measurement, not a test: the exit code is 1 only if a job was lost or doubled or an
undocumented status came back.

    .venv/bin/python bench/api_load.py [--n 2000] [--concurrency 32]
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from ledger.application import Ledger, Sender
from ledger.content import parse_job
from ledger.vocabulary import PolicyRef

TOKEN = "bench-token-0123456789abcdef"
SENDER = Sender(
    "Support <support@example.com>", "mail.example.com", PolicyRef("receipts", "f" * 16)
)


def job(i: int, subject: str = "Your receipt") -> dict[str, object]:
    return {
        "channel": "receipts",
        "key": f"order-{i}",
        "to": "c@example.org",
        "subject": subject,
        "body": "Thanks.",
    }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def post_all(url: str, bodies: list[dict[str, object]], concurrency: int) -> Counter[int]:
    statuses: Counter[int] = Counter()
    queue = list(reversed(bodies))
    async with httpx.AsyncClient(
        base_url=url, timeout=60, headers={"Authorization": f"Bearer {TOKEN}"}
    ) as client:

        async def worker() -> None:
            while queue:
                body = queue.pop()
                statuses[(await client.post("/v1/jobs", json=body)).status_code] += 1

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return statuses


def direct_rate(folder: Path, n: int) -> float:
    with Ledger(f"sqlite:///{folder / 'direct.sqlite'}") as ledger:
        started = time.perf_counter()
        for i in range(n):
            ledger.submit(parse_job(job(i)), SENDER)
        return n / (time.perf_counter() - started)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "policies").mkdir()
        (folder / "policies" / "receipts.toml").write_text(
            'provider = "support"\nfrom = "Support <support@example.com>"\n'
            'message_id_domain = "mail.example.com"\n'
        )
        (folder / "tokens").write_text(f"bench:{TOKEN}\n")
        (folder / "sa.json").write_text("{}")
        port = free_port()
        (folder / "sendledger.toml").write_text(
            '[store]\nurl = "sqlite:///api.sqlite"\n[daemon]\npolicies_dir = "policies"\n'
            '[providers.support]\ncredentials_file = "sa.json"\n'
            f'[api]\nlisten = "127.0.0.1:{port}"\ntoken_file = "tokens"\n'
        )
        server = subprocess.Popen(
            [sys.executable, "-m", "daemon", "--config", str(folder / "sendledger.toml"), "api"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            for _ in range(200):
                try:
                    if httpx.get(url + "/healthz").status_code == 200:
                        break
                except httpx.TransportError:
                    time.sleep(0.05)
            started = time.perf_counter()
            created = asyncio.run(post_all(url, [job(i) for i in range(args.n)], args.concurrency))
            http_rate = args.n / (time.perf_counter() - started)
            again = [job(i) for i in range(0, args.n, 10)] + [job(0, subject="changed")]
            repeated = asyncio.run(post_all(url, again, args.concurrency))
        finally:
            server.terminate()
            server.wait(timeout=30)
        rate = direct_rate(folder, args.n)
        with Ledger(f"sqlite:///{folder / 'api.sqlite'}") as ledger:
            keys = Counter(row.key for row in ledger.jobs())
    print(f"POST /v1/jobs new jobs: {dict(created)}; repeats: {dict(repeated)}")
    print(f"HTTP intake   {http_rate:8.0f} jobs/s  ({args.n} POSTs, {args.concurrency} at a time)")
    print(f"direct submit {rate:8.0f} jobs/s  (Ledger.submit, same machine, same run)")
    print(f"ratio         {http_rate / rate:8.2f}")
    lost = [f"order-{i}" for i in range(args.n) if keys[f"order-{i}"] != 1]
    ok = (
        created == Counter({201: args.n})
        and not lost
        and len(keys) == args.n
        and repeated == Counter({200: len(again) - 1, 409: 1})
    )
    print("jobs lost or doubled: none" if not lost else f"jobs lost or doubled: {lost[:5]}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""A command line that answers at once (issue 30): `sendledger status KEY`, `submit` and
`review list` on SQLite next to `python -c pass`, in one run.

A folder like the one `sendledger init` writes (a config, a policy, a SQLite store) gets
`--keys` jobs, submitted as one list. Then, `--rounds` times, one process each, taken in
turn so that the machine's load falls on all of them alike:

  pass       `python -c pass` (the same interpreter): what starting Python costs
  status     `sendledger status KEY` of one job
  status-N   `sendledger status KEY1 ... KEYN` of all `--keys` jobs in one process
  submit     `sendledger submit FILE` of one new job (one process per job)
  review     `sendledger review list` (the store holds no job in review: the command's
             own cost, not a listing's)

and prints the median wall time of each, its ratio to `pass`, the median CPU time the
process used (user + system: what the load of other work changes least), and what a job
costs when `status` is asked for N keys at once against N processes. Goal: `status` <=
0.25 s.
The console script is the one next to the interpreter (else `python -m daemon`); bytecode
caches are written and used, as an installed package has them (the first round warms
them and is not counted).

    .venv/bin/python bench/cli_latency.py [--rounds 15] [--keys 100]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

GOAL = 0.25  # seconds, `status KEY` median wall

CONFIG = """\
[store]
url = "sqlite:///ledger.sqlite"

[daemon]
policies_dir = "policies"

[providers.support]
credentials_file = "credentials.json"
user = "support@example.com"
"""

POLICY = """\
provider = "support"
from = "Support <support@example.com>"
message_id_domain = "mail.example.com"
"""


def sendledger() -> list[str]:
    script = Path(sys.executable).with_name("sendledger")
    return [str(script)] if script.is_file() else [sys.executable, "-m", "daemon"]


def job(key: str) -> dict[str, str]:
    return {
        "channel": "receipts",
        "key": key,
        "to": "Alice <alice@example.com>",
        "subject": "Your receipt",
        "body": "Thanks for your order.",
    }


def wall(argv: Sequence[str], cwd: Path, env: dict[str, str]) -> tuple[float, float]:
    """The process's wall time and CPU time (user + system), in seconds."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    took = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:4])}...: exit {proc.returncode}: {proc.stderr}")
    return took, after.ru_utime + after.ru_stime - used.ru_utime - used.ru_stime


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15, help="processes of each kind")
    parser.add_argument("--keys", type=int, default=100, help="jobs asked for in one status")
    args = parser.parse_args()

    # Bytecode caches as an installed package has them; no SENDLEDGER_* from the shell.
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("SENDLEDGER_") and k != "PYTHONDONTWRITEBYTECODE"
    }
    with tempfile.TemporaryDirectory(prefix="sendledger-cli-") as tmp:
        root = Path(tmp)
        (root / "policies").mkdir()
        (root / "policies" / "receipts.toml").write_text(POLICY, encoding="utf-8")
        (root / "sendledger.toml").write_text(CONFIG, encoding="utf-8")
        keys = [f"order-{n:05d}" for n in range(args.keys)]
        (root / "jobs.json").write_text(json.dumps([job(k) for k in keys]), encoding="utf-8")
        cli = [*sendledger(), "--config", str(root / "sendledger.toml")]
        wall([*cli, "submit", str(root / "jobs.json")], root, env)  # the jobs asked for

        def submit_one(round_: int) -> list[str]:
            path = root / f"job-{round_}.json"
            path.write_text(json.dumps(job(f"new-{round_:05d}")), encoding="utf-8")
            return [*cli, "submit", str(path)]

        kinds: dict[str, Callable[[int], list[str]]] = {
            "pass": lambda _: [sys.executable, "-c", "pass"],
            "status": lambda r: [*cli, "status", keys[r % len(keys)]],
            f"status-{args.keys}": lambda _: [*cli, "status", *keys],
            "submit": submit_one,
            "review list": lambda _: [*cli, "review", "list"],
        }
        times: dict[str, list[float]] = {name: [] for name in kinds}
        cpus: dict[str, list[float]] = {name: [] for name in kinds}
        for round_ in range(args.rounds + 1):
            for name, argv in kinds.items():
                took, cpu = wall(argv(round_), root, env)
                if round_:  # the first round writes the bytecode caches
                    times[name].append(took)
                    cpus[name].append(cpu)

    median = {name: statistics.median(values) for name, values in times.items()}
    base = median["pass"]
    many = median[f"status-{args.keys}"]
    print(f"median wall of {args.rounds} processes each, load average {os.getloadavg()[0]:.1f}")
    print(f"{'command':<28} {'median':>8} {'range':>15} {'x pass':>7} {'CPU':>8} {'x pass':>7}")
    cpu_base = statistics.median(cpus["pass"])
    for name, values in times.items():
        spread = f"{min(values):.3f}-{max(values):.3f}"
        cpu = statistics.median(cpus[name])
        print(
            f"{name:<28} {median[name]:>7.3f}s {spread:>15} {median[name] / base:>7.1f} "
            f"{cpu:>7.3f}s {cpu / cpu_base:>7.1f}"
        )
    print(
        f"status of {args.keys} keys: one process {many:.3f} s "
        f"({many / args.keys * 1000:.1f} ms a key), {args.keys} processes "
        f"{median['status'] * args.keys:.1f} s ({median['status'] * args.keys / many:.0f}x)"
    )
    print(f"submit, one process per job: {1 / median['submit']:.2f} jobs/s")
    verdict = "met" if median["status"] <= GOAL else "MISSED"
    print(f"goal: status <= {GOAL} s median: {verdict} ({median['status']:.3f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

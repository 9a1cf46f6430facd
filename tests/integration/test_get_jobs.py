"""`Ledger.get_jobs`: a dispatch wave's jobs read in one query on the SQL stores, equal to
reading each with `get_job` (memory: one by one)."""

from __future__ import annotations

import pytest
from tests.unit.engine_rig import claimed_by

from ledger.application import Ledger
from ledger.content import parse_job
from ledger.vocabulary import JobState, PolicyRef, Sender

SENDER = Sender("Support <support@example.com>", "mail.example.com", PolicyRef("receipts", "f"))


def submit(ledger: Ledger, key: str) -> None:
    document = {"channel": "receipts", "key": key, "to": "a@example.net", "subject": "s"}
    ledger.submit(parse_job({**document, "body": f"order {key}\n"}), SENDER)


@pytest.mark.parametrize("store_url", ["sqlite", "postgresql"], indirect=True)
def test_get_jobs_reads_what_get_job_reads(store_url: str) -> None:
    with Ledger(store_url) as ledger:
        for n in range(5):
            submit(ledger, f"k{n}")
        ledger.save_job(claimed_by(ledger, "k1", "d"))  # a job with more than one event
        keys = ["k3", "k1", "missing", "k0", "k4", "k2"]
        jobs = ledger.get_jobs(keys)
        assert sorted(jobs) == ["k0", "k1", "k2", "k3", "k4"]
        for key, job in jobs.items():
            alone = ledger.get_job(key)
            assert (job.key, job.version, job.state, job.message_id, job.content) == (
                alone.key,
                alone.version,
                alone.state,
                alone.message_id,
                alone.content,
            )
        assert jobs["k1"].state is JobState.ATTEMPTED and jobs["k1"].version == 2
        assert ledger.get_jobs([]) == {}


def test_memory_reads_one_by_one() -> None:
    with Ledger("memory://") as ledger:
        submit(ledger, "k0")
        assert list(ledger.get_jobs(["k0", "nope"])) == ["k0"]

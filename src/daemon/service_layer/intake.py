"""Intake: from decoded job JSON to Requested events, for `submit` and `POST /v1/jobs`.

One path for both doors (docs/architecture.md, "The life of one job", step 1): the job
JSON is validated by `ledger.content.parse_job`, the channel's policy gives the `Sender`,
and `Ledger.submit` records each job. A batch is all or nothing: every job is validated
and every key checked for a conflict before any job is written.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from daemon.service_layer.job_json import DUPLICATE_REASON, duplicate_field
from daemon.service_layer.job_json import loads as decode_jobs
from daemon.service_layer.problems import MAX_LISTED, FieldProblem
from ledger.content import JobContent, JobInputError, JobInputErrors, parse_job
from ledger.exceptions import Refusal, SendledgerError
from ledger.job import SendJob, created_at
from ledger.message_id import message_id_for
from ledger.vocabulary import Sender

if TYPE_CHECKING:
    from ledger.application import Ledger, Proved, SubmitResult
    from ledger.mime import MessageLimits
    from policies.loader import PolicySet

# The renderer (`ledger/message.py`), the MIME limits and the policies' sender
# rules are imported where a submission needs them: the read commands import this module's
# types only.


class IntakeError(SendledgerError, ValueError):
    """The submitted jobs were refused; nothing was written. `problems` lists every
    problem of each refused job's fields (then one per job for what is checked after
    them: the channel's policy, the rendered message), in order, at most MAX_LISTED of
    them; `total` counts them all. The sentence names the first and says how many more."""

    kind = Refusal.BAD_INPUT

    def __init__(self, problems: Sequence[FieldProblem], total: int | None = None) -> None:
        self.problems = list(problems[:MAX_LISTED])
        self.total = max(total or 0, len(problems))
        more = f" (and {self.total - 1} more)" if self.total > 1 else ""
        super().__init__(f"{self.problems[0]}{more}")


class Problems:
    """Problems found one job at a time: the first MAX_LISTED kept, all counted."""

    def __init__(self) -> None:
        self.listed: list[FieldProblem] = []
        self.total = 0

    def add(self, problem: FieldProblem) -> None:
        self.total += 1
        if len(self.listed) < MAX_LISTED:
            self.listed.append(problem)

    def extend(self, error: IntakeError) -> None:
        for problem in error.problems:
            self.add(problem)
        self.total += error.total - len(error.problems)

    def refuse(self) -> None:
        """Raise IntakeError when any problem was found."""
        if self.total:
            raise IntakeError(self.listed, self.total)


def parse_jobs(data: object) -> list[JobContent]:
    """One job (an object) or several (a list), as `daemon.service_layer.job_json.loads`
    decoded them (a name given twice in an object is refused naming it). Every job is validated
    before the caller writes any, so a bad batch leaves nothing half-written."""
    items = data if isinstance(data, list) else [data]
    batch = isinstance(data, list)
    if not items:
        raise IntakeError([FieldProblem(None, "job", "an empty list")])
    jobs: list[JobContent] = []
    problems = Problems()
    for index, item in enumerate(items):
        where = index if batch else None
        duplicate = duplicate_field(item)
        if duplicate is not None:
            # Decoded by `daemon.service_layer.job_json.loads`: a name given twice is never read.
            problems.add(FieldProblem(where, duplicate, DUPLICATE_REASON))
            continue
        try:
            jobs.append(parse_job(item))
        except JobInputErrors as exc:
            for each in exc.problems:
                problems.add(FieldProblem(where, each.field, each.reason))
        except JobInputError as exc:
            problems.add(FieldProblem(where, exc.field, exc.reason))
    problems.refuse()
    return jobs


def channel_sender(policies: PolicySet, channel: str, index: int | None = None) -> Sender:
    """The Sender of the channel's policy; a channel without a policy is refused."""
    policy = policies.get(channel)
    if policy is None:
        raise IntakeError([FieldProblem(index, "channel", unknown_channel(policies, channel))])
    return policy.sender


def unknown_channel(policies: PolicySet, channel: str) -> str:
    """Why `channel` is refused, with the channels there are (a typo is then plain)."""
    known = ", ".join(sorted(policies)) or "none: the policies folder holds no policy file"
    return f"no policy file for channel {channel!r} (the channels: {known})"


def senders_for(
    policies: PolicySet,
    jobs: Sequence[JobContent],
    *,
    batch: bool,
    thread_providers: Collection[str] = (),
) -> list[Sender]:
    """Each job's Sender from its channel's policy (with the job's own `from` when the
    policy's `allowed_from` allows it); every job without one is listed. A `thread_id`
    is refused unless the channel's provider is in `thread_providers` (the gmail ones):
    no other provider has a thread to put the message in."""
    from policies.senders import SenderRefused

    senders: list[Sender] = []
    problems = Problems()
    for index, job in enumerate(jobs):
        where = index if batch else None
        try:
            channel_sender(policies, job.channel, where)  # refuses a channel without policy
            policy = policies[job.channel]
            if job.thread_id is not None and policy.provider not in thread_providers:
                reason = f"provider {policy.provider!r} of this channel is not a gmail provider"
                raise IntakeError([FieldProblem(where, "thread_id", reason)])
            senders.append(policy.sender_for(job.sender))
        except SenderRefused as exc:
            problems.add(FieldProblem(where, exc.field, exc.reason))
        except IntakeError as exc:
            problems.extend(exc)
    problems.refuse()
    return senders


def submit_jobs(
    ledger: Ledger,
    jobs: Sequence[JobContent],
    senders: Sequence[Sender],
    *,
    by: str = "",
    proved: Proved | None = None,
) -> list[SubmitResult]:
    """Record every job, or none when any key is known with other content.

    One job is written without a read first (`Ledger.submit`); a batch goes through
    `Ledger.submit_many`: every key is checked (given twice with other content, or
    known with other content) before anything is written, and the new jobs are written
    in one transaction, so a racing writer cannot leave half a batch behind. `by`, who
    submitted, is recorded on each Requested event, and so is `proved`, how
    `check_messages` proved their messages (`ledger/message.py: render_checked`)."""
    if len(jobs) == 1:
        return [ledger.submit(jobs[0], senders[0], by=by, proved=proved)]
    return ledger.submit_many(list(zip(jobs, senders, strict=True)), by=by, proved=proved)


def check_messages(
    policies: PolicySet,
    jobs: Sequence[JobContent],
    senders: Sequence[Sender],
    limits: Mapping[str, MessageLimits],
    *,
    batch: bool,
    at: datetime,
) -> None:
    """Whatever cannot be built is refused here, not at send time (where the job would
    land in review): each job's message is built once with the very function the daemon
    sends with (`ledger/message.py: render`), and held against its provider's
    `limits` (by provider name). Every refused job is listed."""
    from ledger.message import render
    from ledger.mime import check_recipients, check_size

    problems = Problems()
    for index, (content, sender) in enumerate(zip(jobs, senders, strict=True)):
        policy = policies[content.channel]
        try:
            job = SendJob.request(
                content,
                from_addr=sender.from_addr,
                message_id=message_id_for(content.key, sender.message_id_domain),
                policy=sender.policy,
                at=created_at(at, index, len(jobs)),
            )
            limit = limits.get(policy.provider)
            if limit is not None:
                check_recipients(content.to, content.cc, limit, content.bcc)
            raw = render(job)
            if limit is not None:
                # With files attached, they are what made it large.
                check_size(raw, limit, "attachments" if content.attachments else "body")
        except JobInputError as exc:
            problems.add(FieldProblem(index if batch else None, exc.field, exc.reason))
    problems.refuse()


__all__ = [
    "MAX_LISTED",
    "FieldProblem",
    "IntakeError",
    "Problems",
    "channel_sender",
    "check_messages",
    "decode_jobs",
    "parse_jobs",
    "senders_for",
    "submit_jobs",
    "unknown_channel",
]

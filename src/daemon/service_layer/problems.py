"""What a refusal of the services says: its kind and message (`ServiceError`), and for
invalid input one field and one reason per problem, at most `MAX_LISTED` of them, at most
`MAX_BATCH` jobs in one request. Intake (`intake.py`) finds problems, a listing's query
(`listing.py`) too, the services raise the error, and each door maps it once
(`daemon/api/errors.py`: a 422 for problems). Below the services: a door names these
without importing them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ledger.characters import recorded
from ledger.exceptions import Refusal, SendledgerError

__all__ = [
    "MAX_BATCH",
    "MAX_LISTED",
    "FieldProblem",
    "NotAtVersion",
    "ServiceError",
    "batch_too_long",
]


@dataclass(frozen=True)
class FieldProblem:
    """One refused field: `index` is the job's place in a list (None for one job)."""

    index: int | None
    field: str
    reason: str

    def __str__(self) -> str:
        where = "job." if self.index is None else f"job[{self.index}]."
        return f"{where}{self.field}: {self.reason}"


#: At most this many problems are kept (and listed by a 422), whatever the batch's size:
#: an 8 MB list of `{}` must not make a response many times its size (docs/http-api.md "HTTP API").
MAX_LISTED = 100
#: The most jobs one `POST /v1/jobs` takes (docs/http-api.md "HTTP API"). A longer list is
#: refused whole before any job is looked at: validating an 8 MB list of `{}` (2.7 million
#: jobs, 13 million problems counted) took minutes; one at the limit takes well under a
#: second. The command line reads its own files and takes any number.
MAX_BATCH = 10_000


def batch_too_long(jobs: int) -> FieldProblem:
    """The one problem of a list longer than MAX_BATCH."""
    return FieldProblem(None, "job", f"a list of {jobs} jobs: at most {MAX_BATCH} in one request")


class ServiceError(SendledgerError):
    """A service's refusal: its `kind` (ledger/exceptions.py: Refusal) is given where it is
    raised, and each door maps it as it maps every error of the tree."""

    kind: Refusal

    def __init__(
        self,
        kind: Refusal,
        message: str,
        problems: Sequence[FieldProblem] = (),
        total: int | None = None,
    ) -> None:
        # A refusal may quote another's text whole (a provider's 10 MB error body, in
        # "provider NAME cannot be used: ..."): bounded here, once, for every door that
        # answers with it (an HTTP body, the review page, the command line).
        message = recorded(message)
        super().__init__(message)
        self.kind = kind
        self.message = message
        self.problems = list(problems)
        # How many problems there were: `problems` lists at most MAX_LISTED.
        self.total = max(total or 0, len(self.problems))


class NotAtVersion(ServiceError):
    """A decision refused because the job is not at the version it was made on
    (`expected_version`): moved on since (a conflict) or never at it (bad input). A door
    that took the version in its own words answers in them (HTTP's `If-Match`: 412,
    docs/http-api.md "Conditional requests")."""

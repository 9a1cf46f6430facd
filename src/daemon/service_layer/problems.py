"""What a refused input says, and how much of it: one field and one reason per problem,
at most `MAX_LISTED` of them, at most `MAX_BATCH` jobs in one request. Intake
(`intake.py`) finds them, a listing's query (`listing.py`) too, and the doors print them
(`daemon/api/errors.py`: a 422). No imports of ours."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MAX_BATCH", "MAX_LISTED", "FieldProblem", "batch_too_long"]


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

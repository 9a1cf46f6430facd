"""Loading a folder of policy files, one TOML file per channel.

Every problem in every file is collected before anything is refused, so an operator sees
the whole list at once (``file:field: reason``, one per line), not one error per attempt.
A folder either loads completely or not at all: the daemon keeps its last good set.
"""

from __future__ import annotations

import difflib
import os
import time
import tomllib
from collections.abc import Collection, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from pydantic import ValidationError

from ledger.exceptions import Refusal, SendledgerError
from policies.files import BYTE_ORDER_MARK, FileProblem, read_regular_file, starts_with_a_mark
from policies.model import ChannelPolicy
from policies.toml_text import parse_toml

__all__ = [
    "PartialPolicies",
    "PolicyLoadError",
    "PolicyProblem",
    "PolicySet",
    "load_policy_dir",
    "load_policy_dir_partial",
    "load_policy_file",
]

WHOLE_FILE = "-"
#: A policy is a few lines of TOML; a bigger file is not one.
MAX_POLICY_BYTES = 1024 * 1024
#: A file changed less than this long ago may be a save still under way (a tool or editor
#: that rewrites it in place shows its first lines for a moment, a valid policy with the
#: defaults where the rest said otherwise): it is read again this long after, and taken
#: when both reads agree (docs/policies.md "Broken policy files and reloads").
SETTLE_SECONDS = 0.1
#: Reads of a file that keeps changing before it is refused as still being saved.
SETTLE_READS = 30

_FIELDS: tuple[str, ...] = tuple(
    (info.alias or name) for name, info in ChannelPolicy.model_fields.items()
)


@dataclass(frozen=True)
class PolicyProblem:
    """One reason a policy file was refused. ``field`` is the key as written in the file
    (``from``, not ``from_``), or ``"-"`` for the whole file."""

    file: Path
    field: str
    reason: str

    def __str__(self) -> str:
        return f"{self.file}:{self.field}: {self.reason}"


class PolicyLoadError(SendledgerError):
    """Policies were refused; :attr:`problems` lists every reason, across all files."""

    kind = Refusal.BAD_INPUT

    def __init__(self, problems: list[PolicyProblem]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(str(p) for p in self.problems) or "policies refused")


class PolicySet(Mapping[str, ChannelPolicy]):
    """An immutable mapping of channel name to policy, with the file each came from."""

    __slots__ = ("_policies", "_sources")

    def __init__(
        self,
        policies: Mapping[str, ChannelPolicy] | None = None,
        sources: Mapping[str, Path] | None = None,
    ) -> None:
        self._policies: Mapping[str, ChannelPolicy] = MappingProxyType(dict(policies or {}))
        self._sources: Mapping[str, Path] = MappingProxyType(dict(sources or {}))

    @property
    def sources(self) -> Mapping[str, Path]:
        return self._sources

    def __getitem__(self, channel: str) -> ChannelPolicy:
        return self._policies[channel]

    def __iter__(self) -> Iterator[str]:
        return iter(self._policies)

    def __len__(self) -> int:
        return len(self._policies)

    def __repr__(self) -> str:
        inner = ", ".join(f"{name}={p.fingerprint}" for name, p in self._policies.items())
        return f"PolicySet({inner})"

    def fingerprints(self) -> dict[str, str]:
        return {name: policy.fingerprint for name, policy in self._policies.items()}


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _field_of(loc: tuple[int | str, ...]) -> str:
    if not loc:
        return WHOLE_FILE
    return ".".join(str(part) for part in loc)


#: Refusals that are said with the value as written: pydantic's words name what was
#: expected only ("Input should be 'retry', 'search-then-review' or 'review'").
_SAYS_WHAT_WAS_WRITTEN = frozenset(
    {
        "int_type",
        "string_type",
        "bool_type",
        "float_type",
        "int_from_float",
        "literal_error",
        "greater_than_equal",
        "less_than_equal",
    }
)


def _reason_of(error: Mapping[str, Any]) -> str:
    kind = error.get("type")
    loc = error.get("loc", ())
    if kind == "extra_forbidden":
        key = str(loc[-1]) if loc else ""
        close = difflib.get_close_matches(key, _FIELDS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        return f"unknown setting{hint}; known settings: {', '.join(_FIELDS)}"
    if kind == "missing":
        return "required"
    message = str(error.get("msg", "invalid"))
    for prefix in ("Value error, ", "Assertion failed, "):
        message = message.removeprefix(prefix)
    if kind in _SAYS_WHAT_WAS_WRITTEN:
        message = f"{message}, got {error.get('input')!r}"
    return _one_line(message)


def _changed_at(path: Path) -> tuple[int, int] | None:
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_mtime_ns, info.st_size


def _read_settled(path: Path) -> bytes | None:
    """The file's bytes once it is left alone for `SETTLE_SECONDS` (at once for a file
    changed longer ago); None while it keeps changing. FileProblem as `read_regular_file`.
    The time of change is read after the bytes, so a change during the read counts."""
    raw = read_regular_file(path, limit=MAX_POLICY_BYTES)
    changed = _changed_at(path)
    for _ in range(SETTLE_READS):
        # A time of change ahead of the clock (a copied file, a clock stepped back) is
        # settled by two equal reads, like a recent one.
        if changed is not None and time.time_ns() - changed[0] >= SETTLE_SECONDS * 1e9:
            return raw
        time.sleep(SETTLE_SECONDS)
        again = read_regular_file(path, limit=MAX_POLICY_BYTES)
        now = _changed_at(path)
        if again == raw and now == changed:
            return raw
        raw, changed = again, now
    return None


def _parse(path: Path) -> tuple[dict[str, Any] | None, list[PolicyProblem]]:
    try:
        raw = _read_settled(path)
    except FileProblem as exc:
        return None, [PolicyProblem(path, WHOLE_FILE, f"cannot read: {exc.reason}")]
    if raw is None:
        seconds = SETTLE_READS * SETTLE_SECONDS
        return None, [
            PolicyProblem(
                path, WHOLE_FILE, f"still being written: changed again and again for {seconds:g}s"
            )
        ]
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        return None, [PolicyProblem(path, WHOLE_FILE, f"not UTF-8 text (byte {exc.start})")]
    if starts_with_a_mark(text):
        return None, [PolicyProblem(path, WHOLE_FILE, BYTE_ORDER_MARK)]
    try:
        return parse_toml(text), []
    except tomllib.TOMLDecodeError as exc:
        return None, [PolicyProblem(path, WHOLE_FILE, _one_line(f"TOML syntax error: {exc}"))]
    except RecursionError:
        # tomllib parses nested arrays and inline tables recursively: a few thousand
        # levels (a corrupt or hostile file) overflow it. A problem of this file, not a
        # crash of the loader naming none.
        reason = "TOML nested too deeply (arrays or inline tables)"
        return None, [PolicyProblem(path, WHOLE_FILE, reason)]


def _load(path: Path) -> tuple[ChannelPolicy | None, list[PolicyProblem]]:
    data, problems = _parse(path)
    if data is None:
        return None, problems
    data.setdefault("channel", path.stem)
    try:
        return ChannelPolicy.model_validate(data), []
    except ValidationError as exc:
        return None, [
            PolicyProblem(path, _field_of(err["loc"]), _reason_of(err)) for err in exc.errors()
        ]


def load_policy_file(path: Path) -> ChannelPolicy:
    """Load and validate one policy file; ``channel`` defaults to the file's stem.

    Raises PolicyLoadError listing every problem in the file.
    """
    policy, problems = _load(Path(path))
    if policy is None:
        raise PolicyLoadError(problems)
    return policy


def _policy_files(directory: Path) -> list[Path]:
    # Dotfiles are skipped: editors leave ".#name.toml" lock links and the like behind.
    # Every other entry named *.toml is a policy: one that is not a readable regular file
    # (a dangling link, a FIFO, a directory) is a load error naming it, never skipped, or
    # its channel would silently disappear.
    return sorted(
        entry
        for entry in directory.iterdir()
        if entry.name.endswith(".toml") and not entry.name.startswith(".")
    )


#: The problem of a policies folder that is not there.
NO_FOLDER = (
    "no such directory: create it with one CHANNEL.toml per channel (docs/policies.md), or set "
    "daemon.policies_dir to the folder that holds them"
)


#: The problem of a policies folder that holds no policy file.
NO_POLICY = (
    "no policy file (CHANNEL.toml) in this folder: a daemon without one sends every job to "
    "review (no-policy); write one per channel (docs/policies.md), or set "
    "daemon.policies_dir to the folder that holds them"
)
#: The other entries a folder without a policy file names, at most.
NAMED_ENTRIES = 5


def _no_policy(directory: Path) -> PolicyProblem:
    """The folder holds no policy file: said with what it holds instead (`receipts.tml`,
    `Receipts.TOML`), which is what a tired hand typed."""
    try:
        held = sorted(e.name for e in directory.iterdir() if not e.name.startswith("."))
    except OSError:
        held = []
    if not held:
        return PolicyProblem(directory, WHOLE_FILE, NO_POLICY)
    named = ", ".join(repr(name)[1:-1] for name in held[:NAMED_ENTRIES])
    if len(held) > NAMED_ENTRIES:
        named += f" and {len(held) - NAMED_ENTRIES} more"
    reason = f"{NO_POLICY}; it holds {named}: only *.toml files are read"
    return PolicyProblem(directory, WHOLE_FILE, reason)


def _listed(directory: Path) -> list[Path]:
    """The folder's policy files; PolicyLoadError when the folder itself cannot be read."""
    if not directory.exists():
        # Said with what to do: a first run's folder is often just not made yet, or the
        # config names another (a relative path is the config file's folder's).
        raise PolicyLoadError([PolicyProblem(directory, WHOLE_FILE, NO_FOLDER)])
    if not directory.is_dir():
        raise PolicyLoadError([PolicyProblem(directory, WHOLE_FILE, "not a directory")])
    try:
        return _policy_files(directory)
    except OSError as exc:
        raise PolicyLoadError(
            [PolicyProblem(directory, WHOLE_FILE, f"cannot list: {exc.strerror or exc}")]
        ) from None


@dataclass(frozen=True)
class PartialPolicies:
    """A folder read file by file: the channels whose policy is sound, and for every
    channel whose file has a problem, its problems (`broken`). Intake refuses the broken
    channels only (docs/policies.md "Channel policies"); the daemon still loads all or nothing."""

    policies: PolicySet
    broken: Mapping[str, list[PolicyProblem]]
    problems: list[PolicyProblem]


def load_policy_dir_partial(
    directory: Path,
    *,
    known_providers: Collection[str] | None = None,
    client_copy_providers: Collection[str] = (),
) -> PartialPolicies:
    """As `load_policy_dir`, but a problem refuses only the channel of its file (named by
    the file's `channel`, else its stem). A folder that cannot be read raises
    PolicyLoadError."""
    return _scan(_listed(Path(directory)), known_providers, client_copy_providers)


def _declared_channel(path: Path) -> str:
    data, _ = _parse(path)
    channel = data.get("channel") if data is not None else None
    return channel if isinstance(channel, str) and channel else path.stem


def _scan(
    files: list[Path],
    known_providers: Collection[str] | None,
    client_copy_providers: Collection[str],
) -> PartialPolicies:
    problems: list[PolicyProblem] = []
    policies: dict[str, ChannelPolicy] = {}
    sources: dict[str, Path] = {}
    broken: dict[str, list[PolicyProblem]] = {}
    known = None if known_providers is None else set(known_providers)
    for path in files:
        policy, file_problems = _load(path)
        problems.extend(file_problems)
        if policy is None:
            broken.setdefault(_declared_channel(path), []).extend(file_problems)
            continue
        before = len(problems)
        if known is not None and policy.provider not in known:
            listed = ", ".join(sorted(known)) or "none configured"
            problems.append(
                PolicyProblem(
                    path, "provider", f"unknown provider {policy.provider!r} (known: {listed})"
                )
            )
        if policy.on_unknown == "retry" and policy.provider in client_copy_providers:
            problems.append(
                PolicyProblem(
                    path,
                    "on_unknown",
                    f'"retry" is refused: provider {policy.provider!r} has sent_copy = "client"'
                    " (the daemon files the sent copy after the send, so a search miss"
                    " proves nothing); use search-then-review or review",
                )
            )
        if policy.channel in policies:
            first = sources[policy.channel]
            problems.append(
                PolicyProblem(
                    path, "channel", f"channel {policy.channel!r} is also declared by {first}"
                )
            )
        if len(problems) > before:
            broken.setdefault(policy.channel, []).extend(problems[before:])
            continue
        policies[policy.channel] = policy
        sources[policy.channel] = path
    for channel in broken:
        # A channel declared by a sound file and a broken one is broken.
        policies.pop(channel, None)
        sources.pop(channel, None)
    return PartialPolicies(PolicySet(policies, sources), broken, problems)


def load_policy_dir(
    directory: Path,
    *,
    known_providers: Collection[str] | None = None,
    client_copy_providers: Collection[str] = (),
) -> PolicySet:
    """Load every ``*.toml`` file of ``directory`` (other files are ignored); a folder
    with none is refused, not an empty set.

    All-or-nothing: any problem in any file raises PolicyLoadError with all problems of all
    files, including channels declared by two files and, when ``known_providers`` is given,
    providers that the configuration does not define, and ``on_unknown = "retry"`` on a
    provider in ``client_copy_providers`` (it files its own sent copy after the send, so a
    crash in between leaves none, and a search miss proves nothing: docs/providers.md "Providers").
    """
    files = _listed(Path(directory))
    if not files:
        raise PolicyLoadError([_no_policy(Path(directory))])
    partial = _scan(files, known_providers, client_copy_providers)
    if partial.problems:
        raise PolicyLoadError(partial.problems)
    return partial.policies

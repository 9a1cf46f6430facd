"""The engine that moves send jobs forward: a tick hands due jobs to its workers.

Public: :class:`Engine` (``hand_out``, ``tick``, ``stop``, ``close``), :class:`TickReport`
and :class:`PolicyHolder`. The steps live in their own modules: ``dispatch`` (one job from
its claim to its saved outcome), ``recover`` (attempts past their deadline), ``unknown``
(what an outcome that cannot be known leads to, for both), ``search``
(sweep unknown outcomes, verify resent jobs, tidy drafts), around one ``runner``;
``sends`` (the send workers and the steps they run: a queue per scope, taken in turn),
``circuit`` (an outage waited out), ``commit`` (group commit), ``leases`` (a claim
renewed while its call runs), ``drafts`` (the draft step of a provider that sends through
drafts), ``bounces`` (delivery reports found for confirmed jobs), ``owners`` (one daemon
at a time works for each quota scope, and the scopes this engine works for); ``readback``
holds the Message-ID read-back. A job's message is rendered by
``ledger/message.py``, which the intake shares. ``docs/architecture.md`` follows
one job through them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from daemon.engine.policy_holder import PolicyHolder
from daemon.engine.report import TickReport

if TYPE_CHECKING:
    from daemon.engine.tick import Engine

__all__ = ["Engine", "PolicyHolder", "TickReport"]


def __getattr__(name: str) -> object:
    # The engine itself (its workers, steps and their imports) loads for whoever asks for
    # `Engine`: a module that imports one of the package's modules (the API server's
    # circuit view and PolicyHolder) loads that module, not the whole engine.
    if name == "Engine":
        from daemon.engine.tick import Engine

        return Engine
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

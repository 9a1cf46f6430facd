"""The engine that moves send jobs forward: a tick hands due jobs to its workers.

Public: :class:`Engine` (``hand_out``, ``tick``, ``stop``, ``close``), :class:`TickReport`
and :class:`PolicyHolder`. The steps live in their own modules: ``dispatch`` (one job from
its claim to its saved outcome), ``recover`` (attempts past their deadline), ``search``
(sweep unknown outcomes, verify resent jobs, tidy drafts), around one ``runner``;
``sends`` (the send workers and the steps they run: a queue per scope, taken in turn),
``circuit`` (an outage waited out), ``commit`` (group commit), ``leases`` (a claim
renewed while its call runs), ``drafts`` (the draft step of a provider that sends through
drafts), ``bounces`` (delivery reports found for confirmed jobs), ``owners`` (one daemon
at a time works for each quota scope, and the scopes this engine works for); ``readback``
holds the Message-ID read-back. A job's message is rendered by
``daemon/providers/message.py``, which the intake shares. ``docs/architecture.md`` follows
one job through them.
"""

from daemon.engine.policy_holder import PolicyHolder
from daemon.engine.report import TickReport
from daemon.engine.tick import Engine

__all__ = ["Engine", "PolicyHolder", "TickReport"]

"""The engine that moves send jobs forward, one tick at a time.

Public: :class:`Engine` (``tick``, ``stop``, ``close``), :class:`TickReport`,
:class:`PolicyHolder` and :func:`render`. The steps live in their own modules: ``dispatch``
(claim, call, record the outcome), ``recover`` (attempts past their deadline), ``search``
(sweep unknown outcomes, verify resent jobs), around one ``runner``; ``health`` holds the
Message-ID read-back. ``docs/architecture.md`` follows one job through them.
"""

from daemon.engine.dispatch import render
from daemon.engine.policy_holder import PolicyHolder
from daemon.engine.report import TickReport
from daemon.engine.tick import Engine

__all__ = ["Engine", "PolicyHolder", "TickReport", "render"]

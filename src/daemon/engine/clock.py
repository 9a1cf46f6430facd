"""Time is injected: the engine never reads the wall clock itself, so tests drive it."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

Clock = Callable[[], datetime]

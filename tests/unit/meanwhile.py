"""A race met at one exact point, every run, without sleeps: a test's wrapper of a store
gets its answer, runs what another thread of the daemon does at that moment (`Meanwhile`,
once), then hands the answer back."""

from __future__ import annotations

from collections.abc import Callable


class Meanwhile:
    """The hook to run at the point, the first time it is reached only."""

    def __init__(self, hook: Callable[[], object] | None = None) -> None:
        self.hook = hook

    def __call__(self) -> None:
        hook, self.hook = self.hook, None
        if hook is not None:
            hook()

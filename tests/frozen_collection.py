"""What a test process holds once it has collected is kept out of every later collection
of the garbage collector (docs/development.md "Development").

Each xdist worker imports every test module and builds every test item (5,562) before it
runs one: about 750,000 objects that live to the end of the session. Collected with the
collector on, the growing heap set off full collections that walked them again and again:
40% of the collection's CPU (7.2-7.8 s of user time, 4.3-4.5 s without). The collector is
off while the modules are imported and the items built, and afterwards what is still
reachable is frozen (`gc.freeze`): every later collection, a test's own `gc.collect()`
included, walks only what the tests made. Garbage is collected first and never frozen, and
nothing is unfrozen: no finalizer is moved to some later test's collection.
"""

from __future__ import annotations

import gc
from collections.abc import Generator

import pytest


@pytest.hookimpl(wrapper=True)
def pytest_collection(session: pytest.Session) -> Generator[None, object, object]:
    enabled = gc.isenabled()
    gc.disable()
    try:
        return (yield)
    finally:
        gc.collect()
        gc.freeze()
        if enabled:
            gc.enable()

"""`--dist loadgroup` with pytest 9.2: the `xdist_group` marks kept in force.

pytest-xdist (3.8) tells its scheduler a test's group by appending ``@GROUP`` to the test's
node id in each worker, by writing `item._nodeid`. pytest 9.2 keeps node ids in a
structured `item._id` and no longer reads `_nodeid`, so the suffix never appears and every
grouped test is scheduled on its own: a module's servers (Postfix and Dovecot, the daemon
matrix's run) started once per worker that got any of its tests, silently
(pytest-dev/pytest-xdist#1386). This hook, in each worker after xdist's own, appends the
suffix where xdist's did not take; where it did (an older pytest, a fixed xdist) it does
nothing.
"""

from __future__ import annotations

import pytest


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not getattr(config.option, "loadgroup", False):
        return  # not an xdist worker under --dist loadgroup
    try:
        from _pytest.nodeid import coerce_node_id
    except ImportError:  # a pytest before structured node ids: xdist's suffix works there
        return
    for item in items:
        names = sorted(
            {
                str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
                for mark in item.iter_markers("xdist_group")
            }
        )
        if not names:
            continue
        suffix = "@" + "_".join(names)
        if not item.nodeid.endswith(suffix):
            item._id = coerce_node_id(item.nodeid + suffix)

"""The fork server's children are told apart by pid, and Linux gives a pid out again once
its process is reaped (tests/e2e/daemon_kit.py `ChildExits`): a child that got an earlier
child's pid waits for its own exit, and its exit is taken like any other."""

from __future__ import annotations

import pytest
from tests.e2e.daemon_kit import ChildExits


@pytest.mark.parametrize("waited", [True, False], ids=["earlier one waited for", "not"])
def test_a_child_given_an_earlier_child_s_pid_waits_for_its_own_exit(waited: bool) -> None:
    exits = ChildExits()
    exits.started(4242)
    exits.ended(4242, 0, 1.0)
    if waited:
        assert exits.wait(4242, timeout=0) == (0, 1.0)
    exits.started(4242)  # the kernel gave the pid to a later child
    with pytest.raises(TimeoutError):
        exits.wait(4242, timeout=0.01)  # it runs: not the earlier child's exit 0
    exits.ended(4242, 4, 2.0)
    assert exits.wait(4242, timeout=0) == (4, 2.0)


def test_an_exit_told_before_anyone_waits_is_kept_for_the_wait() -> None:
    exits = ChildExits()
    exits.started(7)
    exits.ended(7, 3, 5.0)
    assert exits.wait(7, timeout=0) == (3, 5.0)
    assert exits.wait(7, timeout=0) == (3, 5.0)  # asked again (a kill, then its wait)

"""The unit tier's hooks: no test ends with a thread it started still running
(tests/thread_guard.py)."""

from tests.thread_guard import (  # noqa: F401  (hooks)
    pytest_configure,
    pytest_fixture_post_finalizer,
    pytest_fixture_setup,
    pytest_runtest_setup,
    pytest_runtest_teardown,
)

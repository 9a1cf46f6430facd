"""`daemon/engine/process_mark.py`: a live process is never judged gone."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap

from tests.conftest import skip_unless_ci

#: In a pid namespace of its own whose /proc is still its parent's (`unshare --pid
#: --fork` without `--mount-proc`): a predecessor that lives (pid 2 there) and the new
#: process of its name (pid 1) judging its mark.
_IN_NAMESPACE = textwrap.dedent(
    """
    import subprocess, sys
    from daemon.engine.process_mark import gone, read_mark
    code = ("import time; from daemon.engine.process_mark import this_process; "
            "m = this_process(); print(m and m.text(), flush=True); time.sleep(60)")
    old = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        line = old.stdout.readline().strip()
        mark = read_mark(line)
        print("no mark" if mark is None else f"gone={gone(mark)} pid={mark.pid}")
    finally:
        old.kill()
    """
)


def test_a_live_predecessor_in_a_namespace_whose_proc_is_another_s_is_not_gone() -> None:
    """A pid names a process in the namespace of the process that asks (`kill`), but
    `/proc/PID` in the namespace /proc was mounted for: a daemon run in a pid namespace
    of its own without its own /proc read another process's start time for its live
    predecessor's pid (the host's pid 2 here) and took it for gone, its scopes and
    claims at once. Such a process now writes no mark, and judges none gone."""
    unshare = shutil.which("unshare")
    if unshare is None:
        skip_unless_ci("no unshare")
    probe = subprocess.run([unshare, "--pid", "--fork", "true"], capture_output=True)
    if probe.returncode != 0:
        skip_unless_ci("no pid namespace here (unshare needs privileges)")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [unshare, "--pid", "--fork", sys.executable, "-c", _IN_NAMESPACE],
        capture_output=True, text=True, env=env, timeout=60, check=True,
    )  # fmt: skip
    assert done.stdout.strip() in ("no mark", "gone=False pid=2"), done.stdout

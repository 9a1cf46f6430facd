"""Which process wrote a daemon name's heartbeat, and whether it is provably gone
(docs/configuration.md "Daemon names", docs/performance.md "Several daemons").

On PostgreSQL a new process of a name waits for the calls of the process that held the
name before (`ScopeOwners.wait_for_predecessor`): a database restart ends the name's lock
while that process lives. Most restarts after a kill -9 are on the same host (systemd
restarting the unit), where the kernel can say the old process is gone. The heartbeat
carries a mark of the process that wrote it:

- the kernel's boot id (`/proc/sys/kernel/random/boot_id`) and the pid namespace
  (`/proc/self/ns/pid`): a pid means the same process only within one boot and one
  namespace (two containers on one host share the boot id, not their pids);
- the pid and the process's start time (field 22 of `/proc/self/stat`, clock ticks since
  boot), so that a pid reused by a later process is not taken for it;
- the host name, for the log.

`gone` is true only when all of that is this process's boot and namespace and no process
has that pid and start time: a pid the kernel does not know (`kill(pid, 0)` answers
ESRCH, whatever `/proc`'s `hidepid`), or one whose start time is another. Anything else
(another host or container, a mark that cannot be read, a live process, a process whose
`/proc` entry this one may not read) is not proof, and the wait is kept. A process whose
`/proc` was mounted for another pid namespace than its own (`unshare --pid` without
`--mount-proc`: `/proc/PID` is then another process than `kill(PID)`'s) has no mark: it
writes none and judges none gone.
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass
from functools import cache
from typing import Any

BOOT_ID = "/proc/sys/kernel/random/boot_id"


@dataclass(frozen=True)
class ProcessMark:
    host: str
    boot: str
    pidns: str
    pid: int
    start: int

    def text(self) -> str:
        return json.dumps(
            {"host": self.host, "boot": self.boot, "pidns": self.pidns, "pid": self.pid,
             "start": self.start},
            sort_keys=True,
        )  # fmt: skip

    def describe(self) -> str:
        return f"pid {self.pid} on {self.host}"


def read_mark(text: str) -> ProcessMark | None:
    """The mark written as `text`, or None when it is not one (a row from another
    release, a value written by hand)."""
    try:
        data: Any = json.loads(text)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    host, boot, pidns = data.get("host"), data.get("boot"), data.get("pidns")
    pid, start = data.get("pid"), data.get("start")
    if not (isinstance(host, str) and isinstance(boot, str) and isinstance(pidns, str)):
        return None
    # bool is an int to Python; and a pid of 0 or below names process groups to kill().
    if type(pid) is not int or type(start) is not int or pid <= 0 or start < 0:
        return None
    if not (host and boot and pidns):
        return None
    return ProcessMark(host, boot, pidns, pid, start)


def _start_time(pid: int | str) -> int | None:
    """The process's start time (clock ticks since boot), None when unreadable."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as stat:
            line = stat.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: the fields after its
    # closing parenthesis start at field 3; the start time is field 22.
    fields = line.rpartition(")")[2].split()
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


@cache
def this_process() -> ProcessMark | None:
    """This process's mark, None where the kernel does not say it (not Linux)."""
    try:
        with open(BOOT_ID, encoding="ascii") as boot_file:
            boot = boot_file.read().strip()
        pidns = os.readlink("/proc/self/ns/pid")
        # /proc names pids as the namespace it was mounted for sees them, kill() as this
        # process's own does: a pid namespace without its own /proc (`unshare --pid`
        # without `--mount-proc`) would read another process's start time for a pid.
        seen_as = os.readlink("/proc/self")
    except OSError:
        return None
    if seen_as != str(os.getpid()):
        return None
    start = _start_time("self")
    if not boot or start is None:
        return None
    return ProcessMark(socket.gethostname() or "?", boot, pidns, os.getpid(), start)


def gone(mark: ProcessMark) -> bool:
    """Whether the process `mark` names is provably no longer running (see the module)."""
    me = this_process()
    if me is None or (mark.boot, mark.pidns) != (me.boot, me.pidns):
        return False  # another host, boot or container: its pids are not ours to ask
    if (mark.pid, mark.start) == (me.pid, me.start):
        return False
    if not _known(mark.pid):
        return True
    start = _start_time(mark.pid)
    if start is None:
        # Gone since the signal, or hidden from this user (`hidepid`): asked again.
        return not _known(mark.pid)
    return start != mark.start


def _known(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        pass  # EPERM: a process has that pid (another user's)
    return True


__all__ = ["ProcessMark", "gone", "read_mark", "this_process"]

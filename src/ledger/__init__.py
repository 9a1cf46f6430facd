"""The domain: send jobs as event-sourced aggregates. No network I/O here."""

from __future__ import annotations

import os


def sources_seen(folder: str) -> tuple[tuple[str, int, int, int, int], ...]:
    """Each Python source of `folder` as the file system has it now (name, size, inode,
    modification and change times): cheap, and any replacement or rewrite of a file
    changes its change time. () when the folder cannot be read."""
    try:
        with os.scandir(folder) as entries:
            found = []
            for entry in entries:
                if entry.name.endswith(".py"):
                    stat = entry.stat()
                    found.append(
                        (entry.name, stat.st_size, stat.st_ino, stat.st_mtime_ns, stat.st_ctime_ns)
                    )
    except OSError:
        return ()
    return tuple(sorted(found))


#: The package's sources as they were when this process first imported any of it: the
#: writer's fingerprint (`ledger/message.py: writer_fingerprint`) names the sources only
#: while they are still these, so a process whose sources were replaced under it (an
#: upgrade in place) never names code it does not run.
SOURCES_AT_IMPORT = sources_seen(os.path.dirname(__file__))

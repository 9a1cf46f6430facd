"""A SQLite store's folder on a disk that is not mounted (docs/operations.md "A store on a
disk of its own").

A mount point the system mounts at boot (a data disk, NFS, iSCSI, a LUKS volume) is an
empty folder of the disk beneath until its file system is mounted on it. A store opened
there before the mount, or after it failed, is a new, empty one that knows no job: a key
the daemon already sent is sent again when it is submitted again, and once the disk is
mounted the two stores' histories disagree. So a folder the system is told to mount
(`/etc/fstab`, a mount unit of `/etc/systemd/system`) with nothing mounted on it is
refused before anything is made or read there; a mount point the system is not told of
(a mount made by hand or by a script) is not known here: the unit's `RequiresMountsFor=`
names the store's folder for systemd to wait on.

The table is a seam (`MountTable`): tests hand `SystemMounts` files of their own.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ledger.stores.causes import StoreUnavailable


@dataclass(frozen=True)
class MountPoint:
    path: Path
    #: Where the system is told to mount it: "/etc/fstab" or a mount unit's file.
    named_in: str
    #: A bind mount: the folder of another mount, often of the same file system.
    bind: bool = False


class MountTable(Protocol):
    """The mount points the system is told to mount, and whether one is mounted now."""

    def mount_points(self) -> Iterator[MountPoint]: ...

    def mounted(self, point: MountPoint) -> bool | None:
        """True or False; None when this process cannot tell (the open says why)."""
        ...


_OCTAL = re.compile(r"\\([0-7]{3})")


def _unescaped(word: str) -> str:
    # fstab(5) and proc(5) write a space in a path as \040 (a tab \011, a backslash \134).
    return _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), word)


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:  # not there (a container), not readable: it names no mount point
        return ""


@dataclass(frozen=True)
class SystemMounts:
    """This host's table: `fstab` and the `units` folder's `*.mount` files (the operator's;
    the vendor's, under /usr/lib, mount the system's own folders, /tmp among them, when
    enabled), and `mountinfo` for a bind mount, which `st_dev` cannot tell."""

    fstab: Path = Path("/etc/fstab")
    units: Path = Path("/etc/systemd/system")
    mountinfo: Path = Path("/proc/self/mountinfo")

    def mount_points(self) -> Iterator[MountPoint]:
        for line in _read(self.fstab).splitlines():
            fields = line.split()
            if len(fields) < 2 or fields[0].startswith("#"):
                continue
            kind = fields[2] if len(fields) > 2 else ""
            options = fields[3].split(",") if len(fields) > 3 else []
            where = _unescaped(fields[1])
            if where.startswith("/") and kind != "swap":
                yield MountPoint(_normal(where), str(self.fstab), _binds(options))
        try:
            units = sorted(self.units.glob("*.mount"))
        except OSError:
            units = []
        for unit in units:
            said = dict(_unit_settings(_read(unit)))
            where = said.get("Where", "")
            if where.startswith("/"):
                options = said.get("Options", "").split(",")
                yield MountPoint(_normal(where), str(unit), _binds(options))

    def mounted(self, point: MountPoint) -> bool | None:
        own = _own_file_system(point.path)
        if own is not False or not point.bind:
            return own
        # A bind mount of a folder of the same file system has its device: only the
        # kernel's list of this process's mounts tells it.
        listed = self._listed()
        return None if listed is None else point.path in listed

    def _listed(self) -> set[Path] | None:
        text = _read(self.mountinfo)
        if not text:
            return None
        # proc(5): the fifth field is the mount point.
        return {
            _normal(_unescaped(line.split()[4]))
            for line in text.splitlines()
            if line.count(" ") >= 4
        }


def _normal(path: str) -> Path:
    return Path(os.path.normpath(path))


def _binds(options: list[str]) -> bool:
    return "bind" in options or "rbind" in options


def _unit_settings(text: str) -> Iterator[tuple[str, str]]:
    for line in text.splitlines():
        name, equals, value = line.strip().partition("=")
        if equals and name.strip() in ("Where", "Options"):
            yield name.strip(), value.strip()


def _own_file_system(folder: Path) -> bool | None:
    """Whether a file system is mounted on `folder`: its device is not its parent's (as
    `os.path.ismount`, which says False for a folder it may not look into, too)."""
    try:
        here = os.stat(folder)
        above = os.stat(folder.parent)
    except (FileNotFoundError, NotADirectoryError):
        return False  # no folder: nothing is mounted on it
    except OSError:
        return None  # a mode keeps this user out: the open names it
    return here.st_dev != above.st_dev or here.st_ino == above.st_ino


def unmounted_point(folder: Path, table: MountTable) -> MountPoint | None:
    """The mount point `folder` is on with nothing mounted on it, or None. The nearest
    one named decides: a disk mounted inside a folder of one that is not holds the store
    all the same. `folder` is followed through its symbolic links first: a link to a
    folder of the disk is the disk's."""
    real = Path(os.path.realpath(folder))
    named = {point.path: point for point in table.mount_points()}
    for at in [real, *real.parents]:
        point = named.get(at)
        if point is not None and at != Path("/"):
            return point if table.mounted(point) is False else None
    return None


class StoreNotMounted(StoreUnavailable):
    """A SQLite store whose folder is on a mount point with nothing mounted on it: exit 1
    (the unit starts `run` again), HTTP 503, nothing made or read there."""

    def __init__(self, where: str, point: MountPoint) -> None:
        Exception.__init__(
            self,
            f"store {where}: not mounted: {point.path} is a mount point ({point.named_in}) "
            "with no file system mounted on it, and a store there would not be the "
            "disk's: mount it, then start again",
        )
        self.point = point


def refuse_unmounted(where: str, path: Path, table: MountTable | None) -> None:
    """StoreNotMounted, naming the store `where`, when the store file `path`'s folder is
    on a mount point with nothing mounted on it (`unmounted_point`), as `table` tells it
    or, None, this host. The file's own link is followed too: a store path linked to a
    file on the disk has that file made at the link's target (`sqlite.create_private`)."""
    real = Path(os.path.realpath(path))
    point = unmounted_point(real.parent, table or SystemMounts())
    if point is not None:
        raise StoreNotMounted(where, point)


__all__ = [
    "MountPoint",
    "MountTable",
    "StoreNotMounted",
    "SystemMounts",
    "refuse_unmounted",
    "unmounted_point",
]

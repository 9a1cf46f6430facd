"""A SQLite store whose folder is a mount point with no disk mounted on it is refused
before anything is made or read there (docs/operations.md "A store on a disk of its
own"). A temp folder stands in for the mount point: the table is `SystemMounts` reading
an fstab, a units folder and a mountinfo of the test's own."""

from __future__ import annotations

from pathlib import Path

import pytest

from daemon.cli.init_command import installation, unit_text
from daemon.config.config_file import ConfigError
from daemon.from_settings import settings_for, store_spec
from ledger.application import Ledger
from ledger.stores import store_exists
from ledger.stores.mount_points import StoreNotMounted, SystemMounts, unmounted_point
from ledger.stores.url import SqliteStore, StoreUrlError

SHIPPED = Path(__file__).resolve().parents[2] / "packaging" / "sendledger.service"


def _table(tmp_path: Path, fstab: str = "", mountinfo: str = "") -> SystemMounts:
    (tmp_path / "fstab").write_text(fstab, encoding="utf-8")
    (tmp_path / "units").mkdir(exist_ok=True)
    (tmp_path / "mountinfo").write_text(mountinfo, encoding="utf-8")
    return SystemMounts(tmp_path / "fstab", tmp_path / "units", tmp_path / "mountinfo")


def _everything_under(folder: Path) -> list[Path]:
    return sorted(folder.rglob("*"))


def _open(spec: SqliteStore) -> None:
    Ledger(spec).close()


def test_a_store_on_an_fstab_mount_point_with_no_disk_mounted_is_refused_and_nothing_made(
    tmp_path: Path,
) -> None:
    point = tmp_path / "mnt" / "data"
    point.mkdir(parents=True)  # the empty folder of the root disk, the mount not done
    table = _table(tmp_path, f"# the data disk\nUUID=1234 {point} ext4 defaults,nofail 0 2\n")
    spec = SqliteStore(point / "sendledger" / "ledger.sqlite", mounts=table)
    with pytest.raises(StoreNotMounted) as refused:
        _open(spec)
    said = str(refused.value)
    assert said.startswith(f"store sqlite:{spec.path}: not mounted: {point} is a mount point ")
    assert f"({tmp_path / 'fstab'})" in said and "\n" not in said
    assert _everything_under(point) == []  # no folder, no file: no new, empty store
    # A command that only reads says the same, not "no store at PATH" (`submit` creates it).
    with pytest.raises(StoreNotMounted):
        store_exists(spec)


def test_a_store_an_earlier_start_made_beneath_the_mount_point_is_refused_too(
    tmp_path: Path,
) -> None:
    """The store a release without this check made on the root disk, the mount having
    failed then too: it is not the disk's, and it is left as it was."""
    point = tmp_path / "data"
    beneath = SqliteStore(point / "ledger.sqlite", check_mounts=False)
    _open(beneath)
    made = {p: p.stat().st_mtime_ns for p in _everything_under(point)}
    spec = SqliteStore(point / "ledger.sqlite", mounts=_table(tmp_path, f"/dev/sdb1 {point} xfs\n"))
    with pytest.raises(StoreNotMounted):
        _open(spec)
    assert {p: p.stat().st_mtime_ns for p in _everything_under(point)} == made


def test_a_mount_point_not_there_at_all_is_not_made(tmp_path: Path) -> None:
    point = tmp_path / "srv" / "mail"
    spec = SqliteStore(point / "ledger.sqlite", mounts=_table(tmp_path, f"nfs:/x {point} nfs\n"))
    with pytest.raises(StoreNotMounted):
        _open(spec)
    assert not (tmp_path / "srv").exists()


def test_a_mount_unit_s_where_is_a_mount_point_and_a_masked_unit_names_none(
    tmp_path: Path,
) -> None:
    point = tmp_path / "a b"
    point.mkdir()
    table = _table(tmp_path)
    unit = tmp_path / "units" / "srv-data.mount"
    unit.write_text(f"[Mount]\nWhat=/dev/sdc1\nWhere={point}\nType=ext4\n", encoding="utf-8")
    (tmp_path / "units" / "masked.mount").write_text("", encoding="utf-8")
    found = unmounted_point(point, table)
    assert found is not None and found.path == point and found.named_in == str(unit)
    # fstab writes a space in a path as \040.
    escaped = str(point).replace(" ", "\\040")
    (tmp_path / "fstab_only").mkdir()
    table = _table(tmp_path / "fstab_only", f"/dev/sdc1 {escaped} ext4 defaults 0 2\n")
    found = unmounted_point(point / "sendledger", table)
    assert found is not None and found.path == point


def test_a_mounted_point_and_a_folder_named_nowhere_open_as_before(tmp_path: Path) -> None:
    # /proc is mounted wherever the tests run: its device is not its parent's.
    assert unmounted_point(Path("/proc/self"), _table(tmp_path, "proc /proc proc\n")) is None
    spec = SqliteStore(tmp_path / "plain" / "ledger.sqlite", mounts=_table(tmp_path, ""))
    _open(spec)
    assert store_exists(spec)


def test_a_bind_mount_of_the_same_disk_is_told_mounted_by_the_kernel_s_list(
    tmp_path: Path,
) -> None:
    """Its folder has its parent's device: `st_dev` cannot tell it, /proc/self/mountinfo
    does. The nearest mount point named decides: the bind mount inside /srv, not /srv."""
    outer = tmp_path / "srv"
    point = outer / "ledger"
    point.mkdir(parents=True)
    fstab = f"/dev/sdb1 {outer} ext4\n/data/ledger {point} none bind\n"
    info = f"36 35 8:1 /data/ledger {point} rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
    spec = SqliteStore(point / "ledger.sqlite", mounts=_table(tmp_path, fstab, info))
    _open(spec)
    assert store_exists(spec)
    unlisted = SqliteStore(point / "ledger.sqlite", mounts=_table(tmp_path, fstab, "1 2 3 / /\n"))
    with pytest.raises(StoreNotMounted):
        _open(unlisted)


def test_a_store_folder_linked_into_the_mount_point_is_the_mount_point_s(tmp_path: Path) -> None:
    point = tmp_path / "mnt" / "data"
    (point / "sendledger").mkdir(parents=True)
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "data").symlink_to(point / "sendledger")
    table = _table(tmp_path, f"LABEL=data {point} ext4\n")
    with pytest.raises(StoreNotMounted) as refused:
        _open(SqliteStore(tmp_path / "site" / "data" / "ledger.sqlite", mounts=table))
    assert f"{point} is a mount point" in str(refused.value)
    assert _everything_under(point) == [point / "sendledger"]


def test_a_store_file_linked_to_a_file_on_the_mount_point_is_the_mount_point_s(
    tmp_path: Path,
) -> None:
    """A store path that is a link to a file not there yet has the file made at the
    link's target: here, on the folder beneath the disk."""
    point = tmp_path / "mnt" / "data"
    point.mkdir(parents=True)
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "ledger.sqlite").symlink_to(point / "ledger.sqlite")
    table = _table(tmp_path, f"LABEL=data {point} ext4\n")
    with pytest.raises(StoreNotMounted):
        _open(SqliteStore(tmp_path / "site" / "ledger.sqlite", mounts=table))
    assert _everything_under(point) == []


def test_check_mounts_false_opens_the_folder_beneath_and_is_refused_for_postgresql(
    tmp_path: Path,
) -> None:
    config = tmp_path / "sendledger.toml"
    config.write_text('[store]\nurl = "sqlite:///ledger.sqlite"\ncheck_mounts = false\n')
    spec = store_spec(settings_for(str(config)))
    assert isinstance(spec, SqliteStore) and not spec.check_mounts
    table = _table(tmp_path, f"/dev/sdb1 {tmp_path} ext4\n")
    with pytest.raises(StoreNotMounted):
        _open(SqliteStore(spec.path, mounts=table))
    _open(SqliteStore(spec.path, check_mounts=False, mounts=table))
    assert store_exists(SqliteStore(spec.path, check_mounts=False, mounts=table))
    config.write_text('[store]\nurl = "postgresql://u@h/db"\ncheck_mounts = false\n')
    with pytest.raises(StoreUrlError, match=r"^store\.check_mounts: only a sqlite://"):
        store_spec(settings_for(str(config)))
    config.write_text('[store]\nurl = "sqlite:///ledger.sqlite"\ncheck_mounts = "sometimes"\n')
    with pytest.raises(ConfigError, match=r"store\.check_mounts"):
        settings_for(str(config))


def _unit_key(text: str, key: str) -> str:
    """`key`'s value in the [Unit] section (systemd.unit(5))."""
    head = text[text.index("[Unit]") : text.index("[Service]")]
    lines = [line for line in head.splitlines() if line.startswith(f"{key}=")]
    assert len(lines) == 1, head
    return lines[0].partition("=")[2]


def test_the_units_wait_for_the_mounts_of_the_config_and_the_store() -> None:
    """systemd starts the daemon once the disks of these folders are mounted (a mount of
    /etc/fstab or a mount unit), not on the empty folders beneath them."""
    assert _unit_key(SHIPPED.read_text(encoding="utf-8"), "RequiresMountsFor").split() == [
        "/etc/sendledger",
        "/var/lib/sendledger",
    ]
    assert _unit_key(unit_text(installation(Path("/srv/mail"))), "RequiresMountsFor") == (
        "/srv/mail"
    )
    # One path of a space-separated list, quoted as ReadWritePaths= is; % is a specifier.
    spaced = unit_text(installation(Path("/srv/my mail%1")))
    assert _unit_key(spaced, "RequiresMountsFor") == '"/srv/my mail%%1"'

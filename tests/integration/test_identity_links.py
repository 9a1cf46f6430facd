"""The daemon-name lock is the SQLite store file's, not its path's (docs/configuration.md "Stored
mail: file modes, encryption, daemon names"): a second holder of the same `daemon.name` that reaches
the file through a symlink or a hard link is refused like one on the same path, in another process
too, and the lock lives through SQLite's own opening and closing of the file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from tests.integration.test_ledger_store import SENDER, content
from tests.integration.test_store_hardening import refused_while_held_free_once_killed

from ledger.application import IdentityTaken, Ledger


def links(tmp_path: Path) -> dict[str, Path]:
    """The store, a symlink to it and a hard link to it, each in a folder of its own."""
    store = tmp_path / "data" / "ledger.sqlite"
    store.parent.mkdir()
    Ledger(f"sqlite:///{store}").close()
    (tmp_path / "sym").mkdir()
    (tmp_path / "hard").mkdir()
    symlink = tmp_path / "sym" / "store.sqlite"
    symlink.symlink_to(store)
    hardlink = tmp_path / "hard" / "other-name.sqlite"
    os.link(store, hardlink)
    return {"path": store, "symlink": symlink, "hardlink": hardlink}


@pytest.mark.parametrize("first", ["path", "symlink", "hardlink"])
@pytest.mark.parametrize("second", ["path", "symlink", "hardlink"])
def test_every_path_to_the_file_meets_one_lock_per_name(
    tmp_path: Path, first: str, second: str
) -> None:
    paths = links(tmp_path)
    with (
        Ledger(f"sqlite:///{paths[first]}") as one,
        Ledger(f"sqlite:///{paths[second]}") as two,
    ):
        held = one.hold_identity("host-a")
        # SQLite opens and closes the file under the lock; a POSIX record lock would be
        # dropped by that, this one is not.
        one.submit(content("while-held"), SENDER)
        Ledger(f"sqlite:///{paths[first]}").close()
        with pytest.raises(IdentityTaken, match=r"daemon\.name 'host-a'"):
            two.hold_identity("host-a")
        other = two.hold_identity("host-b")  # another name is another daemon
        held.release()
        two.hold_identity("host-a").release()
        other.release()


def test_a_daemon_through_a_symlink_and_one_through_a_hard_link_are_one_name(
    tmp_path: Path,
) -> None:
    paths = links(tmp_path)
    refused_while_held_free_once_killed(
        f"sqlite:///{paths['symlink']}", f"sqlite:///{paths['hardlink']}"
    )

"""Running a command held to file modes, as a service user is: as root, without the two
capabilities that ignore them (`setpriv`, CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH), so
that root is held to the owner's bits of its own files as any user is to theirs."""

from __future__ import annotations

import os
import shutil

from tests.conftest import skip_unless_ci


def held_to_file_modes() -> list[str]:
    """What runs a command held to file modes: nothing for a user other than root; as
    root without setpriv (util-linux), the test is skipped, and fails under CI=true,
    where nothing may skip."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        skip_unless_ci("running as root without setpriv (util-linux): file modes stop nothing")
    return [setpriv, "--bounding-set=-dac_override,-dac_read_search", "--inh-caps=-all", "--"]

"""`sendledger submit` beside a running daemon (processes): a policy file added and not
reloaded is refused naming the channel (exit 2), where before it was accepted and the
daemon put the job in review at once ("no policy for the channel"); after
`systemctl reload` (SIGHUP) it is taken and sent (docs/cli.md "Submit and the running
daemons' policies")."""

from __future__ import annotations

import json
import signal
from pathlib import Path

from tests.e2e.daemon_kit import RETRY_POLICY, Rig, job


def test_a_channel_added_but_not_reloaded_is_refused_until_the_reload(tmp_path: Path) -> None:
    with Rig(tmp_path) as rig:
        daemon = rig.start_daemon()
        rig.wait_for(lambda: "sendledger running" in daemon.stderr_text(), "the daemon")
        rig.write_policy("alerts", {**RETRY_POLICY, "from": "Alerts <alerts@shop.example>"})
        refused = rig.cli(
            "submit", "-", stdin=json.dumps(job("added", channel="alerts")), check=False
        )
        assert refused.returncode == 2, refused.stderr
        assert len(refused.stderr.splitlines()) == 1, refused.stderr
        assert "'alerts'" in refused.stderr and "systemctl reload sendledger" in refused.stderr
        daemon.signal(signal.SIGHUP)
        rig.wait_for(
            lambda: "policies reloaded: alerts, receipts" in daemon.stderr_text(), "the reload"
        )
        rig.submit([job("added", channel="alerts")])
        rig.wait_state("added", "confirmed")
        assert daemon.terminate() == 0, daemon.tail()
        assert rig.copies("added") == 1


def test_a_daemon_killed_has_loaded_nothing_at_once(tmp_path: Path) -> None:
    """kill -9 leaves the daemon's row, its heartbeat fresh for up to 60 s; its name's
    lock goes with the process, and the row with it: a channel added since it loaded is
    taken at once, as with no daemon running. Before, refused for up to 60 s."""
    with Rig(tmp_path) as rig:
        daemon = rig.start_daemon()
        rig.wait_for(lambda: "sendledger running" in daemon.stderr_text(), "the daemon")
        rig.write_policy("alerts", {**RETRY_POLICY, "from": "Alerts <alerts@shop.example>"})
        daemon.kill9()
        taken = rig.cli("submit", "-", stdin=json.dumps(job("added", channel="alerts")))
        assert taken.returncode == 0 and taken.stderr == "", taken.stderr

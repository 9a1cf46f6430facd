"""A retention purge met by a person's check at one exact point (tests/unit/meanwhile.py;
docs/configuration.md "Retention"): the purge commits while the check's search is out at
the provider. The check still answers what the mailbox holds, and nothing is appended
after Purged: the check read the job before the purge, and what it would record (its
query, the copies' subjects) would put back into the trail what the purge took out."""

from __future__ import annotations

from contextlib import closing, nullcontext
from typing import Any

from tests.unit.engine_rig import EngineRig, policy
from tests.unit.meanwhile import Meanwhile
from tests.unit.test_retention import all_text, rich_job, submit

from daemon.service_layer.services import ChannelPolicies, Services


def test_a_purge_committed_while_a_check_searched_is_the_trail_s_last_word() -> None:
    with closing(EngineRig(policy("receipts", on_unknown="retry"))) as rig:
        submit(rig, rich_job("inv-r"))
        rig.tick()
        search = rig.provider.search

        def purge() -> None:
            rig.ledger.purge("inv-r", by="ops", rule="r")

        purged = Meanwhile(purge)

        def searched_then_purged(*args: Any, **kwargs: Any) -> Any:
            answer = search(*args, **kwargs)
            purged()
            return answer

        rig.provider.search = searched_then_purged  # type: ignore[method-assign]
        door = Services(
            rig.ledger,
            lambda: ChannelPolicies(rig.policies),
            providers=lambda name: nullcontext(rig.provider),
        )
        answer = door.check("inv-r", by="alice")
        assert purged.hook is None, "the purge did not run while the check searched"
        assert answer.count == 1 and not answer.recorded
        assert rig.events("inv-r")[-1] == "Purged"
        assert "Invoice 7731" not in all_text(rig, "inv-r")
        assert rig.job("inv-r").purged

"""Provider text the ledger records as it came (an outcome's reason, a copy's headers, a
failed call's reason) holds nothing a store cannot keep."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from tests.unit.engine_rig import EngineRig, policy

from daemon.doubles.fake_provider import Scripted
from daemon.providers.outcomes import ProviderError, SearchHit, SendKind, SendOutcome
from ledger.vocabulary import JobState


def test_a_refusal_whose_words_no_store_can_keep_is_recorded_not_lost() -> None:
    """A provider's error text with a lone surrogate (a JSON body's "\\ud800") or a NUL:
    the outcome's save failed ('surrogates not allowed'), so the refusal was never
    recorded and the claim was recovered later as an Unknown, searched and judged."""
    rig = EngineRig(policy("receipts"))
    try:
        rig.submit("receipts", "k1")
        rig.provider.script(Scripted.rejected(transient=False, reason="550 \ud800 bad\x00"))
        rig.tick()
        job = rig.job("k1")
        assert job.state is JobState.REVIEW and job.reason == "rejected"
        assert rig.events("k1") == ["Requested", "Attempted", "Rejected", "Escalated"]
    finally:
        rig.close()


# (st.text() never draws a lone surrogate: joined from characters, it does.)
@given(
    st.lists(st.one_of(st.characters(), st.sampled_from(["\ud800", "\udfff", "\x00"]))).map("".join)
)
def test_every_provider_text_is_valid_utf8_without_nul(text: str) -> None:
    values = [
        SendOutcome(SendKind.REJECTED, text).reason,
        ProviderError(text).reason,
        *vars(SearchHit("p", text, date=text, to=text, subject=text)).values(),
    ]
    for value in values:
        if isinstance(value, str):
            value.encode("utf-8")
            assert "\x00" not in value

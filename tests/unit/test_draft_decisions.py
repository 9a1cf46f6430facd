"""The policy's decisions for drafts mode (docs/policies.md "Channel policies", `pending_draft`): a
draft is asked at once after an unknown outcome on every channel; a pending draft is sent
again or reviewed as `pending_draft` says, within `max_attempts`, irreversible or not."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from ledger.decision_types import RetryAt, Review, SearchAt
from ledger.vocabulary import EscalationReason
from policies.decisions import after_draft_pending, after_unknown_draft
from policies.model import ChannelPolicy

NOW = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)


def policy(**overrides: Any) -> ChannelPolicy:
    fields: dict[str, Any] = {
        "channel": "payouts",
        "provider": "support",
        "from": "Support <support@example.com>",
        "message_id_domain": "mail.example.com",
        **overrides,
    }
    return ChannelPolicy.model_validate(fields)


@pytest.mark.parametrize("on_unknown", ["retry", "search-then-review", "review"])
def test_an_unknown_draft_is_asked_at_once_on_every_channel(on_unknown: str) -> None:
    decision = after_unknown_draft(policy(on_unknown=on_unknown, search_after="1h"), now=NOW)
    assert isinstance(decision, SearchAt) and decision.at == NOW


@settings(deadline=None)
@given(
    irreversible=st.booleans(),
    on_unknown=st.sampled_from(["search-then-review", "review"]),
    max_attempts=st.integers(1, 5),
    attempts_made=st.integers(0, 6),
)
def test_a_pending_draft_is_sent_again_within_max_attempts(
    irreversible: bool, on_unknown: str, max_attempts: int, attempts_made: int
) -> None:
    chosen = policy(irreversible=irreversible, on_unknown=on_unknown, max_attempts=max_attempts)
    decision = after_draft_pending(chosen, attempts_made=attempts_made, now=NOW)
    if attempts_made >= max_attempts:
        assert isinstance(decision, Review) and decision.reason is EscalationReason.MAX_ATTEMPTS
    else:
        assert isinstance(decision, RetryAt) and decision.at == NOW


def test_pending_draft_review_leaves_it_to_a_human() -> None:
    decision = after_draft_pending(policy(pending_draft="review"), attempts_made=0, now=NOW)
    assert isinstance(decision, Review) and decision.reason is EscalationReason.UNKNOWN_OUTCOME


def test_the_default_keeps_every_existing_fingerprint() -> None:
    assert policy().fingerprint == policy(pending_draft="send").fingerprint
    assert policy(pending_draft="review").fingerprint != policy().fingerprint
    assert "pending_draft" not in policy().normalized()


def test_a_bad_pending_draft_is_refused_naming_the_field() -> None:
    with pytest.raises(ValidationError, match="pending_draft"):
        policy(pending_draft="resend")

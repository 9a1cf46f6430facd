"""The demo's words: a reason shortened for the live table is cut between words, never
inside one (`daemon.tools.demo.clip_words`)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from daemon.tools.demo import clip_words

WORDS = st.lists(st.text("abcdefghij:,.é", min_size=1, max_size=12), max_size=12).map(" ".join)


@given(WORDS, st.integers(min_value=8, max_value=80))
def test_a_clipped_reason_ends_at_a_word_boundary(text: str, width: int) -> None:
    clipped = clip_words(text, width)
    if clipped == text:
        return
    assert clipped.endswith("…")
    kept = clipped[:-1]
    assert text.startswith(kept)
    # Longer than the width only when the first word alone is.
    assert len(clipped) <= width or " " not in kept.strip(), (text, clipped)
    # What follows the kept part in the original starts between words: after any trailing
    # punctuation that was trimmed, a space (or nothing).
    rest = text[len(kept) :]
    assert rest.lstrip(",;:")[:1] in ("", " "), (text, clipped)


def test_the_reason_that_was_cut_mid_word() -> None:
    reason = "POST sent to 127.0.0.1:35073, then connection closed without a response"
    assert clip_words(reason, 58) == "POST sent to 127.0.0.1:35073, then connection closed…"
    assert clip_words(reason, 200) == reason

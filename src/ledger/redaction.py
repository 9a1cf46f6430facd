"""Redaction: what a purge does to a settled job's events (the argument for doing it this
way is in docs/architecture.md, "Retention").

A purge keeps the job's trail (key, channel, Message-ID, content hash, every event with
its time and who decided what) and makes its content unreadable: the Requested event's
recipients, subject, bodies, attachments and extra headers are emptied, and wherever the
job's addresses, names, subject, file names or header values were quoted in another
event's text (a provider's rejection naming a recipient, an operator's note) they are
replaced by `REDACTED`, in any spelling that reads the same, encoded or cut short. The
store rewrites the job's stored events with these redacted copies in the transaction
that records the Purged event (`Ledger.purge`), so a job is purged whole or not at all.

Pure functions of domain events: no I/O.
"""

from __future__ import annotations

import base64
import binascii
import copy
import html
import json
import re
import unicodedata
from bisect import bisect_right
from collections.abc import Iterable, Iterator, Sequence
from itertools import accumulate
from typing import Any, NamedTuple, TypeVar

from ledger.addresses import AddressError, parse_mailbox
from ledger.content import JobContent
from ledger.header_encoding import ENCODED_WORD
from ledger.vocabulary import ConfirmedVia, EscalationReason, JobState, Resolution

#: What a purged text reads where the job's content was quoted.
REDACTED = "[purged]"
#: What the job index's reason reads on an encrypted store where it quoted the job's
#: content (`ledger.application.Ledger.index_row`): the events keep it whole.
ENCRYPTED = "[encrypted]"

#: Event fields that are the trail: never scrubbed, even if a customer's address happens
#: to be quoted in them (a key is kept whole: keys should not carry personal data).
TRAIL_FIELDS = frozenset(
    {
        "originator_id",
        "originator_version",
        "originator_topic",
        "timestamp",
        "key",
        "channel",
        "message_id",
        "content_hash",
        "from_addr",
        "policy",
        "fingerprint",
        "provider",
        "daemon",
        "submitted_by",
        "proved_by",
        "by",
        "rule",
        "send_at",
        "query",
        "provider_message_ids",
    }
)

#: The words events record as codes (a decision, how a job was confirmed, why it went to
#: review, what a check was for, a bounce's action): never scrubbed, even when a subject
#: or a header value is, or begins with, the same word. A Resolved event whose "abandon"
#: was scrubbed would replay to review, and its job could never be purged.
CODE_VALUES = frozenset(
    {
        *JobState,
        *EscalationReason,
        *Resolution,
        *ConfirmedVia,
        "check",
        "triage",
        "failed",
        "delayed",
    }
)

#: Texts shorter than this are not searched for in other fields (a subject "Hi" would
#: blank every "Hi" in a provider's error text and hide nothing).
MIN_QUOTED_LENGTH = 4

#: Longest text also looked for in its other spellings (`_spellings`): what re-spells a
#: text (a provider, a report) keeps at most 300 characters of it, and each spelling
#: lengthens the pattern compiled per purged job (50 extra headers of 2,000 characters
#: in four spellings took seconds).
MAX_SPELLED = 300

E = TypeVar("E")


def quoted_texts(content: JobContent) -> list[str]:
    """What of `content` another event's text could quote: every address as written and
    as a bare addr-spec (an internationalized domain also in its Unicode form), display
    names, the subject, the attachments' file names and the extra headers' values (a
    content filter names the file it blocked, a receiver quotes an `X-` header), each in
    every spelling that reads the same (`_spellings`). Longest first, so that a full
    "Name <a@b>" is replaced before its parts."""
    texts: set[str] = set()
    addresses = [*content.to, *content.cc, *content.bcc]
    if content.reply_to:
        addresses.append(content.reply_to)
    for written in addresses:
        texts.add(written)
        try:
            mailbox = parse_mailbox(written)
        except AddressError:
            continue
        texts.add(mailbox.addr_spec)
        if unicode_domain := _u_label_domain(mailbox.domain):
            # The job keeps the wire's A-labels (`ledger.addresses`); a person (a note) or an
            # RFC 6533 report writes the domain as it reads, `bücher.example`.
            texts.add(f"{mailbox.local}@{unicode_domain}")
        if mailbox.display_name:
            texts.add(mailbox.display_name)
    texts.add(content.subject)
    texts.update(attachment.filename for attachment in content.attachments)
    texts.update(value for _name, value in content.headers)
    spelled = {
        spelling
        for text in texts
        for spelling in (_spellings(text) if len(text) <= MAX_SPELLED else (text,))
    }
    return sorted((t for t in spelled if len(t) >= MIN_QUOTED_LENGTH), key=len, reverse=True)


def _spellings(text: str) -> set[str]:
    """`text` and its spellings that read the same: the job keeps it as typed, but a
    provider, a report or a person may write it composed or decomposed (NFC, NFD, NFKC)
    or upper-cased with full case folding ("Straße" as "STRASSE", which the pattern's
    simple case-insensitivity does not match). ASCII has no other spelling."""
    if text.isascii():
        return {text}
    forms = {text} | {unicodedata.normalize(form, text) for form in ("NFC", "NFD", "NFKC")}
    # The pattern ignores simple case: a folding that only lower-cases adds nothing (and
    # every alternative costs the pattern's compilation, once per purged job).
    return forms | {f.casefold() for f in forms if f.casefold() != f.lower()}


def _u_label_domain(domain: str) -> str | None:
    """An internationalized domain (A-labels, `xn--`) as people write it, or None."""
    if not any(label.lower().startswith("xn--") for label in domain.split(".")):
        return None
    import idna

    try:
        return str(idna.decode(domain))
    except (idna.IDNAError, UnicodeError):
        return None


# Between two words of a quote: whitespace, or a line break or tab written escaped, as
# `ledger.display.printable` keeps a receiver's answer ("\x0d\x0a") and JSON echoes it;
# a JSON echo kept through `printable` has its backslash doubled ("\\r\\n").
_GAP = r"(?:\s|\\\\?[rnt]|\\x0[9aAdD]|\\\\?u000[9aAdD])+"


def scrubber(texts: Iterable[str]) -> re.Pattern[str] | None:
    """One case-insensitive pattern for `texts` of at most MAX_SPELLED characters (None:
    nothing to look for; longer ones `_scrub` looks for as typed, case aside: compiled,
    50 extra headers of 2,000 characters took most of a second per job). Any run of
    whitespace between two words matches any other: a long subject leaves folded (a CRLF
    before a space), and a quote of it may keep the break, escape it, turn it into
    spaces or collapse them."""
    alternatives = [
        _GAP.join(map(re.escape, t.split())) for t in texts if t.strip() and len(t) <= MAX_SPELLED
    ]
    return re.compile("|".join(alternatives), re.IGNORECASE) if alternatives else None


def scrub_text(text: str, pattern: re.Pattern[str] | None, texts: Sequence[str] = ()) -> str:
    """`text` (kept beside the events: a webhook's last error) with what `pattern` finds
    replaced, and a quote of one of `texts` cut short at its end, as in an event's text."""
    result: str = _scrub(text, pattern, texts)
    return result


def redact_events(
    events: Sequence[E], content: JobContent, texts: Sequence[str] | None = None
) -> list[E]:
    """The job's events as a purge leaves them (`redact_event`), its texts (`quoted_texts`
    unless given) looked for with one pattern."""
    texts = quoted_texts(content) if texts is None else texts
    pattern = scrubber(texts)
    return [redact_event(event, content, pattern, texts) for event in events]


def redact_event(
    event: E, content: JobContent, pattern: re.Pattern[str] | None, texts: Sequence[str] = ()
) -> E:
    """A copy of one of the job's events as a purge leaves it: the Requested event with its
    content emptied (`JobContent.redacted`), and in every event what `pattern` finds (the
    job's quoted texts, `scrubber`) replaced in each field that is not part of the trail,
    and so is a quote of one of `texts` that a text ends with, cut short (`_cut_quote`).
    The original is not changed."""
    state: dict[str, Any] = {}
    for name, value in vars(event).items():
        if name not in TRAIL_FIELDS and (pattern is not None or texts):
            state[name] = _scrub(value, pattern, texts)
    if "content_hash" in vars(event):  # the Requested event: the content itself
        state.update(content.redacted().stored())
    redacted = copy.copy(event)
    # Events are frozen dataclasses; the copy is ours to fill before anyone sees it.
    vars(redacted).update(state)
    return redacted


def _scrub(value: Any, pattern: re.Pattern[str] | None, texts: Sequence[str]) -> Any:
    if isinstance(value, str):
        if value in CODE_VALUES:
            return value
        scrubbed = value if pattern is None else pattern.sub(REDACTED, value)
        if pattern is not None:
            # What a reader decodes (a header's encoded words, a parameter's RFC 2231 form,
            # a JSON string's escapes, an HTML page's character references, a URL's
            # percent escapes and its `+` for a space) is looked into as it reads, a quote
            # cut short in it too; each only where its marks are, so a plain text costs
            # six searches of a few characters. A URL is read twice: with `+` as a
            # space (a query string) and as itself (an address `zoe+tag@`).
            if "=?" in scrubbed:
                scrubbed = _scrub_decoded(scrubbed, pattern, texts, _encoded_runs(scrubbed))
            if "*=" in scrubbed or "*0=" in scrubbed:
                scrubbed = _scrub_decoded(scrubbed, pattern, texts, _parameter_runs(scrubbed))
            if "\\" in scrubbed:
                scrubbed = _scrub_decoded(scrubbed, pattern, texts, _json_runs(scrubbed))
            if "&" in scrubbed:
                scrubbed = _scrub_decoded(scrubbed, pattern, texts, _entity_runs(scrubbed))
            if "%" in scrubbed:
                scrubbed = _scrub_decoded(scrubbed, pattern, texts, _percent_runs(scrubbed))
            if "+" in scrubbed:
                scrubbed = _scrub_decoded(
                    scrubbed, pattern, texts, _percent_runs(scrubbed, plus=True)
                )
        return _cut_inside(_cut_quote(_long_quotes(scrubbed, texts), texts), texts)
    if isinstance(value, list):
        return [_scrub(item, pattern, texts) for item in value]
    if isinstance(value, dict):
        return {key: _scrub(item, pattern, texts) for key, item in value.items()}
    return value


def _long_quotes(value: str, texts: Sequence[str]) -> str:
    """`value` with each whole quote of one of `texts` longer than MAX_SPELLED (left out
    of the pattern) replaced, found as typed, case aside."""
    for text in texts:
        if len(text) <= MAX_SPELLED or len(value) < len(text):
            continue
        lowered, wanted = value.lower(), text.lower()
        if len(lowered) != len(value) or len(wanted) != len(text):
            lowered, wanted = value, text  # lower case changed a length: as typed
        at = lowered.find(wanted)
        while at != -1:
            value = value[:at] + REDACTED + value[at + len(text) :]
            lowered = lowered[:at] + REDACTED + lowered[at + len(text) :]
            at = lowered.find(wanted, at + len(REDACTED))
    return value


def _cut_quote(value: str, texts: Sequence[str]) -> str:
    """`value` with its end replaced by `REDACTED` where it is the start of one of `texts`
    (`_end_cut`)."""
    cut = _end_cut(value, texts)
    return value if cut == len(value) else value[:cut] + REDACTED


def _end_cut(value: str, texts: Sequence[str]) -> int:
    """Where `value`'s end starts to be the start of one of `texts` (at least
    MIN_QUOTED_LENGTH characters; `len(value)`: nowhere): provider texts are kept cut (an
    SMTP reply at 300 characters, a receiver's answer at 200 bytes), and a cut inside a
    quoted address or subject leaves its first characters, which still name the person.
    A whole quote is the pattern's; a value that is nothing but the start of one is left
    (a code, a word: a cut leaves what came before the quote). A few searches of the
    value's last characters per text."""
    lowered = value.lower()
    cut = len(value)
    for text in texts:
        wanted = text.lower()
        if len(wanted) != len(text) or len(wanted) <= MIN_QUOTED_LENGTH:
            continue  # a text whose lower case is longer is also looked for case-folded
        head = wanted[:MIN_QUOTED_LENGTH]
        at = lowered.find(head, max(1, len(lowered) - len(wanted) + 1))
        while at != -1 and at < cut:
            if wanted.startswith(lowered[at:]):
                cut = at
                break
            at = lowered.find(head, at + 1)
    return cut


#: What closes a quote in a provider's text: a quote cut short before it still ends there.
_CLOSERS = frozenset("\"'\u2019\u201d\u00bb>)]}")
#: The marks an address's words are joined by: an address cut before one goes on.
_ADDRESS_MARKS = frozenset(".-_+@%")


def _cut_inside(value: str, texts: Sequence[str]) -> str:
    """`value` with each start of one of `texts` cut short inside it (`_inside_cuts`)
    replaced by `REDACTED`."""
    cuts = _inside_cuts(value, texts)
    if not cuts:
        return value
    out: list[str] = []
    last = 0
    for start, end in cuts:
        if end <= last:
            continue  # inside a cut taken already
        out.extend((value[last : max(start, last)], REDACTED))
        last = end
    out.append(value[last:])
    return "".join(out)


def _inside_cuts(value: str, texts: Sequence[str]) -> list[tuple[int, int]]:
    """Where (start, end, in order) each start of one of `texts` (at least
    MIN_QUOTED_LENGTH characters), from a word's start, is cut short inside the value
    and stops there as a cut does (`_a_cut`): a provider cuts a long subject in the
    middle of its message, `subject 'Rechnung 77…' exceeds ...`. A few searches of the
    value per text."""
    lowered = value.lower()
    folded = len(lowered) == len(value)
    if not folded:
        lowered = value  # lower case changed a length: as typed
    cuts: list[tuple[int, int]] = []
    for text in texts:
        wanted = text.lower() if folded else text
        if len(wanted) != len(text) or len(wanted) <= MIN_QUOTED_LENGTH:
            continue  # a text whose lower case is longer is also looked for case-folded
        head = wanted[:MIN_QUOTED_LENGTH]
        at = lowered.find(head)
        while at != -1:
            following = at + 1
            if at == 0 or not (wanted[0].isalnum() and lowered[at - 1].isalnum()):
                length = _quoted_length(lowered, at, wanted)
                for back in (1, 2):
                    # The text goes on with a dot (`a0@example.net`): the first dots of
                    # an ellipsis after the cut read as the text's own.
                    if value.startswith("...", at + length - back) and length - back >= (
                        MIN_QUOTED_LENGTH
                    ):
                        length -= back
                        break
                end = at + length
                if length < len(wanted) and end < len(value) and _a_cut(value, end, wanted, length):
                    cuts.append((at, end))
                # The next quote starts after this one: one inside it would be the text
                # quoting itself ("<<<<..." in a note of "<<<<...": each place, one by one,
                # compared most of the text again).
                following = end
            at = lowered.find(head, following)
    return sorted(cuts)


def _quoted_length(value: str, at: int, text: str) -> int:
    """How many of `text`'s first characters `value` holds from `at` (at least
    MIN_QUOTED_LENGTH, which the caller found there): by halves, each a comparison in C
    (one character at a time, "<<<<..." in a note of 10,000 took seconds per text)."""
    low, high = MIN_QUOTED_LENGTH, min(len(text), len(value) - at)
    while low < high:
        middle = (low + high + 1) // 2
        if value.startswith(text[:middle], at):
            low = middle
        else:
            high = middle - 1
    return low


def _a_cut(value: str, at: int, text: str, length: int) -> bool:
    """Whether `value`, quoting the first `length` characters of `text` up to `at`, stops
    quoting it there as a cut does: an ellipsis, a closing quote or bracket, or any mark
    or space right inside a word of the text ("Your message ..." keeps its "Your "
    beside a subject "Your order"); for an address, also any mark or space after a mark
    of it (`zoe.quartz refused`, `zoe.quartz@ refused`: a local part names the person
    even where the cut fell between its words)."""
    following = value[at]
    if following == "…" or value.startswith("...", at) or following in _CLOSERS:
        return True
    if following.isalnum():
        return False
    inside_a_word = text[length - 1].isalnum() and text[length].isalnum()
    return inside_a_word or (
        following not in _ADDRESS_MARKS
        and "@" in text
        and not any(c.isspace() for c in text)
        and not text[:length].isalnum()
    )


# A run of RFC 2047 encoded words separated by whitespace (a folded header unfolds to one):
# a reader joins them into one text, so they are looked into as one.
_WORD = ENCODED_WORD
_ENCODED_RUN = re.compile(rf"{_WORD.pattern}(?:\s+{_WORD.pattern})*")


class _Piece(NamedTuple):
    start: int  # where it is in the value
    end: int
    text: str  # what a reader sees there
    encoded: bool  # a run of encoded words (else plain text, as it is)


class _Run(NamedTuple):
    start: int  # where it is in the value
    end: int
    text: str  # what a reader decodes it to


def _encoded_runs(value: str) -> Iterator[_Run]:
    """Each run of RFC 2047 encoded words that decodes (a provider's error or a report
    quotes a subject or a name as it left: `=?utf-8?b?...?=`, split anywhere, either
    form, or only its non-ASCII words encoded, "=?utf-8?q?Zo=C3=AB?= Quartz"); one that
    does not is shown as it is, by a reader and by us."""
    for run in _ENCODED_RUN.finditer(value):
        decoded = _decode_run(run.group())
        if decoded is not None:
            yield _Run(run.start(), run.end(), decoded)


def _scrub_decoded(
    value: str, pattern: re.Pattern[str], texts: Sequence[str], runs: Iterable[_Run]
) -> str:
    """`value` with every run (in order, apart) whose decoded text is part of what
    `pattern` finds, or of a quote of one of `texts` cut short (`_end_cut`,
    `_inside_cuts`), replaced by `REDACTED`. Both look at the text as a reader sees it; a
    match that touches a run takes the whole run, a match in plain text only its own
    characters."""
    pieces: list[_Piece] = []
    last = 0
    for run in runs:
        if run.start > last:
            pieces.append(_Piece(last, run.start, value[last : run.start], False))
        pieces.append(_Piece(run.start, run.end, run.text, True))
        last = run.end
    if not pieces:
        return value
    pieces.append(_Piece(last, len(value), value[last:], False))
    seen = "".join(piece.text for piece in pieces)
    # Where each piece starts in `seen`, to find a match's pieces by bisection.
    starts = list(accumulate((len(piece.text) for piece in pieces[:-1]), initial=0))
    spans = [(found.start(), found.end()) for found in pattern.finditer(seen)]
    spans.extend(_inside_cuts(seen, texts))
    spans.append((_end_cut(seen, texts), len(seen)))
    out: list[str] = []
    last = 0
    for seen_start, seen_end in sorted(spans):
        if seen_end == seen_start:
            continue
        first = bisect_right(starts, seen_start) - 1
        final = bisect_right(starts, seen_end - 1) - 1
        head, tail = pieces[first], pieces[final]
        start = head.start if head.encoded else head.start + seen_start - starts[first]
        end = tail.end if tail.encoded else tail.start + seen_end - starts[final]
        if start < last:  # begins in the run a previous match took: that one covers it
            last = max(last, end)
            continue
        out.extend((value[last:start], REDACTED))
        last = end
    out.append(value[last:])
    return "".join(out)


# One section of a MIME parameter in RFC 2231 form: `name*=charset'lang'%xx...` (one
# extended value), or `name*N*=` / `name*N=` (a continuation; the first extended one
# carries the charset), its value a token or a quoted string.
_SECTION = re.compile(
    r"""(?P<name>[A-Za-z][\w.-]*)\*(?:(?P<number>\d{1,3})(?P<extended>\*)?)?="""
    r"""(?P<value>"(?:[^"\\]|\\.)*"|[^\s;"]*)"""
)
_BETWEEN_SECTIONS = re.compile(r"\s*;\s*")


def _parameter_runs(value: str) -> Iterator[_Run]:
    """Each parameter in RFC 2231 form, decoded as a mail reader joins it (a content
    filter quotes the Content-Disposition it blocked as it left: `filename*=utf-8''
    %C3%A9t%C3%A9.pdf`, or continuations `filename*0*=utf-8''...; filename*1*=...`), the
    run from its first section to its last."""
    sections = list(_SECTION.finditer(value))
    at = 0
    while at < len(sections):
        first = sections[at]
        group = [first]
        if first.group("number") is not None:
            # Continuations: the same name, numbered on from 0, `;` (and folding) between.
            while at + len(group) < len(sections):
                following, previous = sections[at + len(group)], group[-1]
                if (
                    following.group("name").lower() != first.group("name").lower()
                    or following.group("number") != str(int(previous.group("number")) + 1)
                    or not _BETWEEN_SECTIONS.fullmatch(value, previous.end(), following.start())
                ):
                    break
                group.append(following)
        at += len(group)
        decoded = _decode_sections(group)
        if decoded is not None:
            yield _Run(group[0].start(), group[-1].end(), decoded)


def _decode_sections(sections: Sequence[re.Match[str]]) -> str | None:
    """The text of one parameter's sections (`_SECTION`) as RFC 2231 reads it: the bytes
    of the percent-encoded ones joined (a writer may split a character between two)
    and decoded in the first one's charset; None when that is no text codec."""
    charset = "us-ascii"
    data = b""
    for index, section in enumerate(sections):
        text = section.group("value")
        extended = section.group("number") is None or section.group("extended") is not None
        if text.startswith('"'):
            text = re.sub(r"\\(.)", r"\1", text[1:-1])
            extended = False
        if extended and index == 0 and text.count("'") >= 2:
            charset, _language, text = text.split("'", 2)
        if extended:
            data += _percent_bytes(text)
        else:
            data += text.encode("utf-8", "surrogateescape")
    try:
        return data.decode(charset or "us-ascii", "replace")
    except (LookupError, ValueError):  # no such text codec; "idna" refuses "replace"
        return None


# A run of JSON string escapes a reader decodes: `\u00e9` (non-ASCII, as most encoders
# write it by default, a pair for a character beyond the BMP), `\"`, `\\`, `\/`; each
# also with its backslash doubled, as `ledger.display.printable` keeps a receiver's
# answer (a webhook's last error): `\\u00e9`.
_JSON_RUN = re.compile(r'(?:\\\\?u[0-9A-Fa-f]{4}|\\\\?["/]|\\\\(?:\\\\)?)+')
_DOUBLED = re.compile(r'\\\\[u"/\\]')


def _json_runs(value: str) -> Iterator[_Run]:
    """Each run of JSON escapes, decoded (a provider or a webhook receiver echoes the
    subject or a name in a JSON error, `"Gr\u00fc\u00dfe"`); a run with a doubled
    backslash before an escape is read with every backslash pair as one."""
    for run in _JSON_RUN.finditer(value):
        escapes = run.group()
        if _DOUBLED.search(escapes):
            escapes = escapes.replace("\\\\", "\\")
        try:
            yield _Run(run.start(), run.end(), json.loads(f'"{escapes}"'))
        except ValueError:
            continue  # no JSON string after all ("\\" alone, undoubled): shown as it is


# One HTML character reference (an HTML error page quotes the recipient or the subject as
# `zoe&#64;example.net`, `Gr&uuml;&szlig;e &amp; co`): a numeric one with or without its
# `;`, as browsers read it, a named one with it. Each stands for its own character, so a
# quote takes only the references it is made of, not the `&quot;` around it.
_REFERENCE = re.compile(r"&(?:#[0-9]{1,7};?|#[xX][0-9A-Fa-f]{1,6};?|[A-Za-z][A-Za-z0-9]{1,31};)")


def _entity_runs(value: str) -> Iterator[_Run]:
    """Each HTML character reference, as a browser shows it (an unknown name is shown as
    it is)."""
    for reference in _REFERENCE.finditer(value):
        yield _Run(reference.start(), reference.end(), html.unescape(reference.group()))


# A run of a URL's percent escapes (`zoe.quartz%40example.net`, `Gr%C3%BC%C3%9Fe`: the
# bytes of one character are escaped together), with the `+` a query string writes for
# a space where `_percent_runs` reads it so.
_PERCENT_RUN = re.compile(r"(?:%[0-9A-Fa-f]{2})+")
_PERCENT_PLUS_RUN = re.compile(r"(?:%[0-9A-Fa-f]{2}|\+)+")


def _percent_runs(value: str, plus: bool = False) -> Iterator[_Run]:
    """Each run of percent escapes decoded as UTF-8 (a provider's URL in a last error:
    `...?rcpt=zoe.quartz%40example.net`); with `plus`, each `+` read as a space too."""
    runs = _PERCENT_PLUS_RUN if plus else _PERCENT_RUN
    for run in runs.finditer(value):
        text = run.group().replace("+", " ") if plus else run.group()
        yield _Run(run.start(), run.end(), _percent_bytes(text).decode("utf-8", "replace"))


def _percent_bytes(text: str) -> bytes:
    """`text`'s bytes with each `%XX` escape read as the byte it stands for."""
    return re.sub(
        rb"%([0-9A-Fa-f]{2})",
        lambda m: bytes([int(m.group(1), 16)]),
        text.encode("utf-8", "surrogateescape"),
    )


def _decode_run(run: str) -> str | None:
    """The text of a run of encoded words as a reader joins it: the bytes of adjacent
    words in one charset joined before decoding (an encoder may split a character between
    two words); None when a word cannot be decoded."""
    parts: list[tuple[str, bytes]] = []
    for word in _WORD.finditer(run):
        charset = word.group(1).split("*", 1)[0].lower()  # RFC 2231 language suffix
        data = _word_bytes(word.group(2), word.group(3))
        if data is None:
            return None
        if parts and parts[-1][0] == charset:
            parts[-1] = (charset, parts[-1][1] + data)
        else:
            parts.append((charset, data))
    try:
        return "".join(data.decode(charset, "replace") for charset, data in parts)
    except (LookupError, ValueError):  # no such text codec; "idna" refuses "replace"
        return None


def _word_bytes(form: str, text: str) -> bytes | None:
    try:
        if form in "bB":
            return base64.b64decode(text + "=" * (-len(text) % 4), validate=False)
        return re.sub(
            rb"=([0-9A-Fa-f]{2})",
            lambda m: bytes([int(m.group(1), 16)]),
            text.replace("_", " ").encode("ascii"),
        )
    except (ValueError, binascii.Error, UnicodeError):
        return None


__all__ = [
    "CODE_VALUES",
    "ENCRYPTED",
    "MIN_QUOTED_LENGTH",
    "REDACTED",
    "TRAIL_FIELDS",
    "quoted_texts",
    "redact_event",
    "redact_events",
    "scrub_text",
    "scrubber",
]

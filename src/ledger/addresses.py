"""The one strict address validator, used for every address field (to, cc, reply_to) and
for a policy's ``from``: what a caller types either becomes exactly one mailbox that the
message can carry unchanged, or it is refused with a reason. Nothing is dropped or
repaired (a space inside a domain once sent mail to another recipient).

Accepted: ``local@domain`` or ``Display Name <local@domain>`` (the display name may be
quoted, and may be any Unicode except the characters ``ledger/characters.py`` refuses).
The local part is an RFC 5322 dot-atom in ASCII; the domain is a host name (letters,
digits, hyphens, at least two labels, no label starting or ending with a hyphen, not all
digits at the end). An internationalized domain is converted to its IDNA A-label form
(``bücher.de`` -> ``xn--bcher-kva.de``), so the wire carries plain ASCII. Refused: domain
literals (``[1.2.3.4]``), quoted or non-ASCII local parts, and any display name that would
need guessing (unquoted specials such as ``,`` or ``@``). A refusal names its cause where
a sender is likely to meet it: several addresses in one string, a comment, a group, an
invisible character at an edge or anywhere in the addr-spec, ``=?`` (an encoded word,
which RFC 2047 forbids in an addr-spec and some readers decode all the same), a local
part starting with ``-`` (Postfix refuses it at RCPT, ``allow_min_user``).
See docs/cli.md, "Message fields and validation".
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ledger.characters import invisible, unsafe_character
from ledger.exceptions import Refusal, SendledgerError

if TYPE_CHECKING:
    from email.headerregistry import Address

# The standard library's header parser and idna are imported by the functions that parse
# and render: a command that only shows stored jobs (`status`) needs neither, and they are
# a good part of its start-up (docs/cli.md "Many keys, one process").

__all__ = [
    "AddressError",
    "Mailbox",
    "mailbox_key",
    "parse_mailbox",
    "unquote",
]

MAX_LOCAL = 64
MAX_DOMAIN = 253
MAX_ADDRESS = 254

_ATEXT = r"[A-Za-z0-9!#$%&'*+/=?^_`{|}~-]+"
_LOCAL = re.compile(rf"^{_ATEXT}(?:\.{_ATEXT})*\Z")
_LABEL = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\Z")
# RFC 5322 specials: in an unquoted display name each would change how the header parses
# ("." is the exception: "J. Smith" is common, and it is quoted when rendered).
_SPECIALS = set('()<>[]:;@\\,"')
_SPACES = re.compile(" {2,}")

#: The marks that mixed-direction text needs (allowed in display names, even at an end).
_DIRECTION_MARKS = frozenset("\u200e\u200f")


class AddressError(SendledgerError, ValueError):
    """Why a value is not one acceptable mailbox (one line, without the field name)."""

    kind = Refusal.BAD_INPUT


@dataclass(frozen=True)
class Mailbox:
    display_name: str
    local: str
    domain: str  # ASCII: an internationalized domain is stored in its A-label form

    @property
    def addr_spec(self) -> str:
        return f"{self.local}@{self.domain}"

    @property
    def address(self) -> Address:
        from email.headerregistry import Address

        return Address(display_name=self.display_name, addr_spec=self.addr_spec)

    def __str__(self) -> str:
        """Canonical text: what the job stores and the message's header carries."""
        return str(self.address)


def parse_mailbox(value: object) -> Mailbox:
    """Exactly one mailbox, strictly; raises AddressError with a one-line reason."""
    if not isinstance(value, str):
        raise AddressError("must be a non-empty email address")
    return _parse_text(value)


@functools.lru_cache(maxsize=65536)
def mailbox_key(value: str) -> str:
    """The mailbox a From sends as, the way a per-mailbox quota is keyed: its address,
    lower case ("" for text that is no one mailbox). A pure function of the From, so the
    job index keeps it beside the job (docs/performance.md "Several daemons")."""
    try:
        # As the providers spell the mailbox they act as (`address`), lower case.
        return parse_mailbox(value).address.addr_spec.lower()
    except AddressError:
        return ""


# A job's addresses are parsed at intake, by the writer and by the proof of its bytes
# (`ledger/wire_check.py`), and again at every dispatch; the stdlib round trip below cost
# about a third of the daemon's CPU per job (docs/performance.md "Performance and scaling").
# The result is a pure function of the text and a frozen Mailbox, so it is shared; a refusal
# is not cached (lru_cache keeps no exceptions) and is worked out again each time.
@functools.lru_cache(maxsize=4096)
def _parse_text(value: str) -> Mailbox:
    if not value.strip():
        raise AddressError("must be a non-empty email address")
    if "\r" in value or "\n" in value:
        raise AddressError("must not contain CR or LF")
    bad = unsafe_character(value)
    if bad:
        raise AddressError(f"must not contain {bad}: {value!r}")
    text = value.strip(" ")
    _refuse_invisible_edges(text, value, "the address")
    _refuse_other_shapes(text, value)
    if text.endswith(">"):
        start = text.rfind("<")
        if start < 0:
            raise AddressError(f"not a valid email address: {value!r}")
        display = _display_name(text[:start].strip(" "), value)
        spec = text[start + 1 : -1]
    else:
        display, spec = "", text
    local, domain = _addr_spec(spec, value)
    mailbox = Mailbox(display, local, domain)
    _check_round_trip(mailbox, value)
    return mailbox


def _refuse_invisible_edges(text: str, value: str, what: str) -> None:
    # A reader shows nothing there: the same visible address could be two different jobs,
    # and a domain would lose the character to IDNA's mapping (U+200B is mapped to nothing).
    for char, where in ((text[:1], "starts"), (text[-1:], "ends")):
        if char and invisible(char) and char not in _DIRECTION_MARKS:
            raise AddressError(
                f"{what} {where} with an invisible character (U+{ord(char):04X}): {value!r}"
            )


def _top_level(text: str) -> str:
    """`text` with every quoted string's content blanked: what is left is its syntax."""
    out: list[str] = []
    quoted = escaped = False
    for char in text:
        if escaped:
            escaped = False
            out.append("_")
        elif quoted:
            if char == "\\":
                escaped = True
            elif char == '"':
                quoted = False
            out.append(char if char == '"' else "_")
        else:
            quoted = char == '"'
            out.append(char)
    return "".join(out)


def _refuse_other_shapes(text: str, value: str) -> None:
    # The RFC 5322 forms other than one mailbox, each named: a sender who typed one should
    # learn what to do instead, not read "not a valid email address".
    syntax = _top_level(text)
    if "(" in syntax or ")" in syntax:
        raise AddressError(f"comments (in parentheses) are not accepted: {value!r}")
    outside = syntax[: syntax.rfind("<")] if syntax.endswith(">") else syntax
    if syntax.endswith(";") and ":" in outside:
        raise AddressError(
            f"a group (name: addresses;) is not accepted: give its addresses one per entry: "
            f"{value!r}"
        )
    pieces = re.split(r"[,;\s]", syntax)
    if len(pieces) > 1 and sum("@" in piece for piece in pieces) > 1:
        raise AddressError(
            f"one address per entry: give a list of addresses, not several in one string: {value!r}"
        )


def unquote(raw: str) -> str | None:
    """The content of `raw` when it is exactly one RFC 5322 quoted string (its escapes
    undone), or None. The one reading of a quoted display name: at intake here, and in
    the proof of the rendered message (`ledger/wire_check.py`)."""
    if len(raw) < 2 or raw[0] != '"' or raw[-1] != '"':
        return None
    name: list[str] = []
    escaped = False
    for char in raw[1:-1]:
        if escaped:
            name.append(char)
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == '"':
            return None
        else:
            name.append(char)
    return None if escaped else "".join(name)


def _display_name(raw: str, value: str) -> str:
    if "=?" in raw:
        # A reader (the validator's own round trip among them) would decode it.
        raise AddressError("a display name must not contain '=?' (an encoded word)")
    if raw.startswith('"'):
        inner = unquote(raw)
        if inner is None:
            raise AddressError(f"not one quoted display name (a quote inside it?): {value!r}")
        # Runs of spaces are one space, quoted or not (readers collapse them either way).
        name = _SPACES.sub(" ", inner.strip())
        _refuse_invisible_edges(name, value, "the display name")
        return name
    special = next((c for c in raw if c in _SPECIALS), None)
    if special is not None:
        raise AddressError(
            f"the display name contains {special!r}: put it in double quotes: {value!r}"
        )
    # Runs of spaces in an unquoted phrase carry no meaning (RFC 5322 folding). Only
    # U+0020's: another space (U+3000, U+2003) is a character of the name, and a name
    # stored unquoted (`A\u3000B <b@example.com>`, from a quoted one) must read back as it.
    name = _SPACES.sub(" ", raw.strip())
    _refuse_invisible_edges(name, value, "the display name")
    return name


def _addr_spec(spec: str, value: str) -> tuple[str, str]:
    if "=?" in spec:
        # RFC 2047 allows no encoded word in an addr-spec, yet some readers decode one
        # there and read another address (`a=?utf-8?q?b?=@example.com` as `ab@...`).
        raise AddressError(f"an address must not contain '=?' (an encoded word): {value!r}")
    hidden = next((char for char in spec if invisible(char) or _ignored_by_idna(char)), None)
    if hidden is not None:
        raise AddressError(
            f"the address holds an invisible character (U+{ord(hidden):04X}): {value!r}"
        )
    local, at, domain = spec.rpartition("@")
    if not at or not local or not domain:
        raise AddressError(f"not a valid email address: {value!r}")
    if local.startswith("-"):
        # Postfix answers 501 (its allow_min_user is off by default): refused here, not
        # left for the server to refuse at send time.
        raise AddressError(f"the part before @ must not start with '-': {value!r}")
    if not local.isascii():
        raise AddressError(f"the part before @ must be ASCII: {value!r}")
    if len(local) > MAX_LOCAL or not _LOCAL.match(local):
        raise AddressError(f"not a valid email address (the part before @): {value!r}")
    ascii_domain = _ascii_domain(domain, value)
    if len(local) + 1 + len(ascii_domain) > MAX_ADDRESS:
        raise AddressError(f"longer than {MAX_ADDRESS} characters: {value!r}")
    return local, ascii_domain


def _ignored_by_idna(char: str) -> bool:
    # UTS 46 maps these to nothing (variation selectors, U+00AD, ...): the domain sent
    # would lose a character the sender typed.
    if char.isascii():
        return False
    import idna

    try:
        return idna.uts46_remap(char, std3_rules=True, transitional=False) == ""
    except (idna.IDNAError, UnicodeError):
        return False


def _ascii_domain(domain: str, value: str) -> str:
    if domain.startswith("["):
        raise AddressError(f"domain literals are not accepted: {value!r}")
    if not domain.isascii() or any(label.lower().startswith("xn--") for label in domain.split(".")):
        import idna

        try:
            # UTS 46 mapping (case, width) then IDNA 2008: what browsers and MTAs do.
            domain = idna.encode(domain, uts46=True).decode("ascii")
        except (idna.IDNAError, UnicodeError) as exc:
            raise AddressError(f"not a valid internationalized domain ({exc}): {value!r}") from None
    labels = domain.split(".")
    if (
        len(domain) > MAX_DOMAIN
        or len(labels) < 2
        or not all(_LABEL.match(label) for label in labels)
        or labels[-1].isdigit()
    ):
        raise AddressError(f"not a valid domain {domain!r}: {value!r}")
    return domain


def _check_round_trip(mailbox: Mailbox, value: str) -> None:
    # What we will write must parse back, with the standard library's strict header
    # parser, to exactly this one mailbox: nothing may be lost or added on the way.
    from email.policy import default as email_policy

    try:
        rendered = str(mailbox)
        header = email_policy.header_factory("to", rendered)
        addresses = header.addresses
    except Exception as exc:  # the stdlib parser can raise IndexError and friends
        raise AddressError(f"not a valid email address: {value!r}") from exc
    if (
        len(addresses) != 1
        or addresses[0].addr_spec != mailbox.addr_spec
        or addresses[0].display_name != mailbox.display_name
    ):
        raise AddressError(f"not a valid email address: {value!r}")

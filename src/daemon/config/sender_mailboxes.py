"""A channel whose `from` is not the one mailbox its provider acts as (docs/policies.md
"A channel's from and its provider's user").

`sendledger init` writes one address as the provider's `user` and as the policies' `from`;
the config marks `user` as the line to edit, and a `user` corrected there alone left every
channel sending as the address `init` was given (`support@example.com` without
`--mailbox`): Gmail sends such a message as `user` unless the address is one of that
mailbox's send-as addresses, Graph refuses it unless the mailbox may send as it. Either may
be meant (a send-as alias), so it is said, not refused: by `policy check` and at the
daemon's start.
"""

from __future__ import annotations

from collections.abc import Mapping

from daemon.config.settings import GmailProviderSettings, GraphProviderSettings, Settings
from ledger.addresses import mailbox_key
from policies.model import ChannelPolicy

#: What the provider does with a From that is not its mailbox's own address.
_WHAT_FOLLOWS = {
    "gmail": "Gmail sends as that mailbox unless {addr} is one of its send-as addresses",
    "graph": "Graph refuses the send unless that mailbox may send as {addr}",
}


def other_senders(settings: Settings, policies: Mapping[str, ChannelPolicy]) -> list[str]:
    """One line per channel whose `from` is not its provider's fixed `user` (a provider
    acting for each job's From, `"{from}"`, or for the credentials' own account, `"me"`,
    has none)."""
    lines = []
    for channel, policy in sorted(policies.items()):
        config = settings.providers.get(policy.provider)
        if not isinstance(config, GmailProviderSettings | GraphProviderSettings):
            continue
        mailbox, addr = mailbox_key(config.user), mailbox_key(policy.from_)
        if not mailbox or not addr or mailbox == addr:
            continue
        follows = _WHAT_FOLLOWS[config.kind].format(addr=addr)
        lines.append(
            f"channel {channel!r}: from {addr} is not providers.{policy.provider}.user "
            f"({mailbox}), the mailbox it sends from: {follows}; correct the one that is wrong"
        )
    return lines


__all__ = ["other_senders"]

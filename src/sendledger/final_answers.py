"""An HTTP answer read past every interim `1xx` before it (docs/providers.md "A server that
answers before the body is read").

http.client reads past `100 Continue` only. Any other interim answer (`102 Processing`,
`103 Early Hints`), which a client must take unasked (RFC 9110 15.2) and which a server,
a proxy or anyone on a clear-text hop may send, was the answer: a Gmail send classified
from a `103` (Unknown, searched) or a webhook delivery failed by one (sent again), and
the final answer left on a kept connection, read as the answer to the next request on it
(another job's send Confirmed with this one's message id). `FinalAnswer` reads every
interim answer as http.client reads a `100`: its headers skipped, within the answer's
own bounds (its reader's deadline and bytes, `daemon/providers/early_answers.py`; a
webhook's timer, `daemon/webhooks/delivery.py`), and `INTERIM_BOUND` of them at most.

A `101 Switching Protocols` is no interim answer: what follows it is another protocol,
and none of these requests asks for one. It ends the exchange as an answer that cannot be
read does: an `http.client.HTTPException`, as past the bound (this package's own errors
are the client's, `client.ClientError`). The standard library only: the daemon's HTTP
transport, its webhooks and the Python client share it, as they share `connecting.py`.
"""

from __future__ import annotations

import http.client
from typing import Any

#: Interim answers read before the final one, at most: a server sends one `100 Continue`
#: and perhaps a `103` or two; one sending more is not answering.
INTERIM_BOUND = 32


class FinalAnswer(http.client.HTTPResponse):
    """An http.client response that is the request's final answer (see the module
    docstring): a connection's `response_class`."""

    def __init__(self, sock: Any, *args: Any, **kwargs: Any) -> None:
        super().__init__(sock, *args, **kwargs)
        self._interim = 0

    def _read_status(self) -> tuple[str, int, str]:
        version, status, reason = super()._read_status()  # type: ignore[misc]
        if status == http.client.SWITCHING_PROTOCOLS:
            raise http.client.HTTPException(
                f"{status} {reason.strip()}, a switch of protocols no request asked for"
            )
        if 100 <= status < 200:
            self._interim += 1
            if self._interim > INTERIM_BOUND:
                raise http.client.HTTPException(
                    f"more than {INTERIM_BOUND} interim answers before the final one"
                )
            # Read on as after a 100: http.client's own loop skips the headers, with its
            # own bounds on their lines and number.
            return version, http.client.CONTINUE, reason
        return version, status, reason


__all__ = ["INTERIM_BOUND", "FinalAnswer"]

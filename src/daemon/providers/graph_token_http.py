"""msal's HTTP client for Graph's tenant discovery and token requests: `SingleShotHttp`
(`transport.py`), so that a token fetch ends within the provider's `timeout` whatever the
identity platform trickles (docs/providers.md "A server that never ends its answer").

msal's own client is a requests session, whose timeout bounds each read alone: a token
endpoint writing a byte now and then under it held the send that needed the token for as
long as it went on. A token request made once changes nothing but the token; what msal
would have repeated (one retry on a failed connection) is a transient TokenError here, and
the send is tried again later. A connection per request: tokens are asked for about once
an hour, and one transport shared by every worker's thread would need a lock that queues
them a `timeout` each.

A redirect is not followed (requests followed it): the discovery document names where
the client's secret or signed assertion is posted, and a token request re-posted it, so
following one would let whoever answers at `authority` send the credential to another
host the settings never named. A 3xx is a transient TokenError naming `authority` and
where it pointed, in one line, for the operator to set `authority` there.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

from daemon.providers.graph_classify import TokenError
from daemon.providers.transport import SingleShotHttp
from ledger.display import printable

_FORM = "application/x-www-form-urlencoded"


@dataclass
class TokenAnswer:
    """An answer as msal reads one (`msal.oauth2cli.http.Response`)."""

    status_code: int
    text: str
    headers: dict[str, str] = field(default_factory=dict)

    def raise_for_status(self) -> None:
        if self.status_code >= 400:
            raise TokenError(f"HTTP {self.status_code}", transient=self.status_code >= 500)


class TokenHttp:
    """msal's `http_client`: GET and POST through a fresh `SingleShotHttp` each, trusting
    `ca_certs` (None: httplib2's bundle)."""

    def __init__(self, *, timeout: float, ca_certs: str | None = None) -> None:
        self.timeout = timeout
        self.ca_certs = ca_certs

    def get(
        self,
        url: str,
        params: dict[str, str] | None = None,
        headers: dict[str, Any] | None = None,
        **_: Any,
    ) -> TokenAnswer:
        return self._request("GET", url, params, None, headers)

    def post(
        self,
        url: str,
        params: dict[str, str] | None = None,
        data: dict[str, Any] | str | None = None,
        headers: dict[str, Any] | None = None,
        **_: Any,
    ) -> TokenAnswer:
        return self._request("POST", url, params, data, headers)

    def close(self) -> None:
        """Nothing is kept between requests."""

    def _request(
        self,
        method: str,
        url: str,
        params: dict[str, str] | None,
        data: dict[str, Any] | str | None,
        headers: dict[str, Any] | None,
    ) -> TokenAnswer:
        if params:
            url += ("&" if "?" in url else "?") + urlencode(params)
        # As requests sends them: a header whose value is None is left out, a dict body
        # is a form.
        sent = {name: str(value) for name, value in (headers or {}).items() if value is not None}
        body = urlencode(data) if isinstance(data, dict) else data
        if isinstance(data, dict) and not any(name.lower() == "content-type" for name in sent):
            sent["Content-Type"] = _FORM
        http = SingleShotHttp(timeout=self.timeout, reuse=False, ca_certs=self.ca_certs)
        try:
            response, content = http.request(url, method, body=body, headers=sent)
        finally:
            http.close()
        status = int(response.status)
        if 300 <= status < 400:
            raise _redirect_refused(url, status, response.get("location", ""))
        return TokenAnswer(
            status,
            content.decode("utf-8", "replace"),
            {str(name).lower(): str(value) for name, value in response.items()},
        )


def _redirect_refused(url: str, status: int, location: str) -> TokenError:
    # The URL without its query (the token request's has none; discovery's none secret).
    asked = url.partition("?")[0]
    to = printable(location)[:200] if location else "nowhere named"
    return TokenError(
        f"authority: {asked} answered HTTP {status} to {to}: redirects are not followed;"
        " set authority to where it points",
        transient=True,
    )


__all__ = ["TokenAnswer", "TokenHttp"]

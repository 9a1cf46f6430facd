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
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

from daemon.providers.graph_classify import TokenError
from daemon.providers.transport import SingleShotHttp

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
        return TokenAnswer(
            int(response.status),
            content.decode("utf-8", "replace"),
            {str(name).lower(): str(value) for name, value in response.items()},
        )


__all__ = ["TokenAnswer", "TokenHttp"]

"""The review page's icon: `/favicon.svg`, and `/favicon.ico` (which browsers ask for on
their own) redirected to it, so neither is a 404 in the server's log or the browser's
console. An envelope with a check mark, drawn inline: no file to package, nothing fetched
from elsewhere."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.responses import RedirectResponse, Response

ICON = """\
<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 32 32">
<rect x="2" y="7" width="28" height="19" rx="3" fill="#1d2330"/>
<path d="M3 9l13 9 13-9" fill="none" stroke="#ffffff" stroke-width="2"/>
<circle cx="25" cy="23" r="6.5" fill="#2e7d32" stroke="#ffffff" stroke-width="1.5"/>
<path d="M22 23l2.2 2.2 4-4.4" fill="none" stroke="#ffffff" stroke-width="2"/>
</svg>
"""
PATH = "/favicon.svg"


def install(app: FastAPI) -> None:
    @app.get(PATH, include_in_schema=False)
    def favicon_svg() -> Response:
        # A day in the browser's cache: the icon changes with a release at most.
        headers = {"Cache-Control": "public, max-age=86400", "X-Content-Type-Options": "nosniff"}
        return Response(ICON, media_type="image/svg+xml", headers=headers)

    @app.get("/favicon.ico", include_in_schema=False)
    def favicon_ico() -> RedirectResponse:
        return RedirectResponse(PATH, status_code=308)


__all__ = ["ICON", "PATH", "install"]

"""`/ui/`: the review page (README "Review page").

Server-rendered HTML, no JavaScript. Signing in with an API token sets an HttpOnly,
SameSite=Strict session cookie; an `Authorization: Bearer` header works too (scripts,
proxies). Every form carries a CSRF token derived from the session. A visitor without
either sees the sign-in form and nothing of any job.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote

from fastapi import APIRouter, Depends, Form, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from jinja2 import Environment, FileSystemLoader, select_autoescape

from daemon.api.auth import SESSION_COOKIE, SESSION_SECONDS, bearer
from daemon.api.context import ApiContext, context_of
from daemon.api.errors import ApiError
from daemon.api.review import resolve
from daemon.commands import event_record, job_status, review_rows
from ledger.application import UnknownJob
from ledger.vocabulary import JobState, Resolution

router = APIRouter(prefix="/ui", include_in_schema=False)
Ctx = Annotated[ApiContext, Depends(context_of)]
_templates = Environment(
    loader=FileSystemLoader(Path(__file__).with_name("templates")),
    autoescape=select_autoescape(default=True),
)


class Visitor:
    """Who is looking, and how: by session cookie (forms need its CSRF token) or header."""

    def __init__(self, name: str | None, session: str | None) -> None:
        self.name = name
        self.session = session


def visitor(request: Request) -> Visitor:
    ctx = context_of(request)
    by_header = ctx.tokens.who(bearer(request.headers.get("authorization")))
    if by_header is not None:
        return Visitor(by_header, None)
    session = request.cookies.get(SESSION_COOKIE)
    return Visitor(ctx.sessions.who(session), session)


Seen = Annotated[Visitor, Depends(visitor)]


def _page(template: str, code: int = 200, **values: Any) -> HTMLResponse:
    html = _templates.get_template(template).render(**values)
    headers = {
        "Cache-Control": "no-store",
        "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; "
        "form-action 'self'; frame-ancestors 'none'",
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
    }
    return HTMLResponse(html, status_code=code, headers=headers)


def _sign_in(message: str = "", code: int = 401) -> HTMLResponse:
    return _page("signin.html", code, message=message)


def _csrf(ctx: ApiContext, seen: Visitor) -> str:
    return ctx.sessions.csrf_token(seen.session) if seen.session else ""


@router.get("/")
def queue(ctx: Ctx, seen: Seen) -> Response:
    if seen.name is None:
        return _sign_in(code=200)
    rows = review_rows(ctx.ledger)
    for row in rows:
        row["href"] = "/ui/jobs/" + quote(row["key"], safe="")
    return _page("queue.html", rows=rows, who=seen.name, csrf=_csrf(ctx, seen))


@router.post("/sign-in")
def sign_in(ctx: Ctx, token: Annotated[str, Form()] = "") -> Response:
    name = ctx.tokens.who(token.strip())
    if name is None:
        return _sign_in("That token is not valid.")
    response = RedirectResponse("/ui/", status_code=303)
    response.set_cookie(
        SESSION_COOKIE,
        ctx.sessions.open(name),
        max_age=SESSION_SECONDS,
        path="/ui",
        httponly=True,
        samesite="strict",
    )
    return response


@router.post("/sign-out")
def sign_out(ctx: Ctx, seen: Seen, csrf: Annotated[str, Form()] = "") -> Response:
    if seen.session and ctx.sessions.csrf_ok(seen.session, csrf):
        ctx.sessions.close(seen.session)
    response = RedirectResponse("/ui/", status_code=303)
    response.delete_cookie(SESSION_COOKIE, path="/ui")
    return response


@router.get("/jobs/{key:path}")
def job_page(key: str, ctx: Ctx, seen: Seen, done: str = "") -> Response:
    if seen.name is None:
        return _sign_in()
    try:
        job = ctx.ledger.get_job(key)
        events = [event_record(e) for e in ctx.ledger.history(key)]
    except UnknownJob:
        return _page("message.html", 404, title="No such job", message=f"No job {key!r}.")
    return _page(
        "job.html",
        status=job_status(job),
        events=events,
        in_review=job.state is JobState.REVIEW,
        resolutions=[r.value for r in Resolution],
        action="/ui/jobs/" + quote(key, safe="") + "/resolve",
        done=done,
        who=seen.name,
        csrf=_csrf(ctx, seen),
    )


@router.post("/jobs/{key:path}/resolve")
async def resolve_form(
    key: str,
    ctx: Ctx,
    seen: Seen,
    decision: Annotated[str, Form(alias="as")] = "",
    note: Annotated[str, Form()] = "",
    csrf: Annotated[str, Form()] = "",
) -> Response:
    if seen.name is None:
        return _sign_in()
    # A header-signed caller is not a browser carrying an ambient cookie: no CSRF risk.
    if seen.session is not None and not ctx.sessions.csrf_ok(seen.session, csrf):
        return _page("message.html", 403, title="Refused", message="The form has expired.")
    if decision not in {r.value for r in Resolution}:
        return _page(
            "message.html", 422, title="Refused", message="Choose sent, resend or abandon."
        )
    try:
        await run_in_threadpool(resolve, ctx.ledger, key, Resolution(decision), note, seen.name)
    except ApiError as exc:
        return _page("message.html", exc.status, title="Not resolved", message=exc.message)
    return RedirectResponse(
        "/ui/jobs/" + quote(key, safe="") + "?done=" + quote(decision), status_code=303
    )

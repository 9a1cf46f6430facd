"""`/ui/`: the review page (docs/review.md "Review page").

Server-rendered HTML, no JavaScript. Signing in with an API token sets an HttpOnly,
SameSite=Strict session cookie (Secure over HTTPS or with an https `[api] public_url`);
an `Authorization: Bearer` header works too (scripts, proxies). Every form carries a CSRF
token derived from the session, the sign-in form one derived from its own cookie, and
failed sign-ins are limited per client address (429; `daemon/api/signin_limit.py`). A
visitor without either sees the sign-in form and nothing of any job.

Every page reads and acts through the service layer (`daemon/service_layer/services.py`), as the CLI
and the API do. Text that is a caller's (keys, subjects, notes) is HTML-escaped by Jinja
(autoescape) and, before that, made printable (`ledger.display.printable`: control and
bidi characters shown as escapes), for every value a template prints.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Coroutine
from datetime import datetime, timedelta
from math import ceil
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote, urlencode, urlsplit

from fastapi import APIRouter, Depends, Form, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.routing import APIRoute
from jinja2 import Environment, FileSystemLoader, select_autoescape
from markupsafe import Markup
from starlette.types import Message, Receive

from daemon.api.auth import SESSION_COOKIE, SESSION_SECONDS, bearer
from daemon.api.context import ApiContext, Ctx, context_of
from daemon.api.errors import status_of
from daemon.api.form_text import in_form, percent_escaped, urlencoded
from daemon.api.overview import NARROW, hourly_chart
from daemon.api.paths import key_segment
from daemon.api.roles import PAGE_ROLE, forbidden
from daemon.api.signin_limit import client_of
from daemon.engine.held_sends import held_scope
from daemon.service_layer.problems import ServiceError
from daemon.service_layer.read_models import timeline_details
from daemon.service_layer.services import (
    REASONS,
    SORTS,
    CheckAnswer,
    TriageItem,
    resolve_as_a_person,
)
from ledger.display import command_line, printable
from ledger.vocabulary import OPEN_STATES, Resolution


class FormsInUtf8(APIRoute):
    """A page's route whose form holds a field that is not UTF-8 text is answered 422,
    the page's line naming the field, before the route runs: nothing is written. The form
    parser read such bytes as U+FFFD (multipart: as Latin-1), and a note or a reason
    nobody typed went into the trail (`daemon/api/form_text.py`). An urlencoded body's raw
    UTF-8 bytes (`curl -d 'note=café'`) reach the route escaped, read as UTF-8."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()
        fields = {field.alias for field in self.dependant.body_params}

        async def strict(request: Request) -> Response:
            if request.method == "POST":
                # The body is whole already (`daemon/api/limits.py`), and kept for the route.
                body = await request.body()
                kind = request.headers.get("content-type", "")
                found = in_form(kind, body)
                if found is not None:
                    # Answered before the sign-in and the CSRF check, to any browser: a
                    # name of the form's own only, not a sentence another site's form
                    # gave a field as its name.
                    if found.field in fields:
                        return _refused(found.field, found.reason)
                    return _refused("form", f"{found.reason} (a field the form does not have)")
                escaped = percent_escaped(body) if urlencoded(kind) else body
                if escaped != body:
                    request = Request(request.scope, _replay(escaped, request.receive))
            return await handler(request)

        return strict


def _replay(body: bytes, then: Receive) -> Receive:
    """The request's `receive`, its body replaced by `body` (then the request's own)."""
    told: list[bool] = []

    async def receive() -> Message:
        if not told:
            told.append(True)
            return {"type": "http.request", "body": body, "more_body": False}
        return await then()

    return receive


router = APIRouter(prefix="/ui", include_in_schema=False, route_class=FormsInUtf8)


def _finalize(value: Any) -> Any:
    # Every printed value: a caller's text shows its control characters as escapes.
    # (Markup is the templates' own HTML, a macro's output: already made of such values.)
    if isinstance(value, str) and not isinstance(value, Markup):
        return printable(value)
    return value


_templates = Environment(
    loader=FileSystemLoader(Path(__file__).with_name("templates")),
    autoescape=select_autoescape(default=True, default_for_string=True),
    finalize=_finalize,
)


#: Before sign-in: a random value in a cookie, whose CSRF token the sign-in form carries
#: (double submit), so another site cannot sign a browser in with its own token.
SIGN_IN_COOKIE = "sendledger_sign_in"


class Visitor:
    """Who is looking, and how: by session cookie (forms need its CSRF token) or header."""

    def __init__(self, name: str | None, session: str | None, request: Request) -> None:
        self.name = name
        self.session = session
        self.request = request


def visitor(request: Request) -> Visitor:
    ctx = context_of(request)
    by_header = ctx.tokens.identity(bearer(request.headers.get("authorization")))
    if by_header is not None:
        if not by_header.may(PAGE_ROLE):
            raise forbidden(by_header, PAGE_ROLE)
        return Visitor(by_header.name, None, request)
    # A session was opened only for a token with the page's role (`sign_in`).
    session = request.cookies.get(SESSION_COOKIE)
    return Visitor(ctx.sessions.who(session), session, request)


def secure_cookies(ctx: ApiContext, request: Request) -> bool:
    """Cookies are `Secure` when the request came over HTTPS (uvicorn reads a trusted
    proxy's X-Forwarded-Proto) or `[api] public_url` is an https one."""
    return request.url.scheme == "https" or ctx.public_url.startswith("https://")


def _set_cookie(
    ctx: ApiContext, request: Request, response: Response, name: str, value: str, age: int
) -> None:
    response.set_cookie(
        name,
        value,
        max_age=age,
        path="/ui",
        httponly=True,
        samesite="strict",
        secure=secure_cookies(ctx, request),
    )


Seen = Annotated[Visitor, Depends(visitor)]


def page_status(exc: ServiceError) -> int:
    """A refusal's status on the page: the API's (daemon/api/errors.py), for every kind."""
    return status_of(exc) or 500


def _page(template: str, code: int = 200, **values: Any) -> HTMLResponse:
    html = _templates.get_template(template).render(**values)
    headers = {
        "Cache-Control": "no-store",
        "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; "
        "img-src 'self' data:; form-action 'self'; frame-ancestors 'none'",
        "X-Content-Type-Options": "nosniff",
        "Referrer-Policy": "no-referrer",
    }
    return HTMLResponse(html, status_code=code, headers=headers)


def _refused(field: str, reason: str) -> HTMLResponse:
    """A form refused, nothing done: 422 and one line naming the field, as the API's
    `{"field", "reason"}` does (docs/http-api.md "Errors and statuses")."""
    return _page("message.html", 422, title="Refused", message=f"{field}: {reason}")


def _sign_in(ctx: ApiContext, seen: Visitor, message: str = "", code: int = 401) -> HTMLResponse:
    """The sign-in form, with a CSRF value in its cookie (kept when the browser has one,
    so two open forms both work) and that value's token in the form."""
    nonce = seen.request.cookies.get(SIGN_IN_COOKIE) or secrets.token_urlsafe(32)
    page = _page("signin.html", code, message=message, csrf=ctx.sessions.csrf_token(nonce))
    _set_cookie(ctx, seen.request, page, SIGN_IN_COOKIE, nonce, SESSION_SECONDS)
    return page


def _csrf_ok(ctx: ApiContext, value: str | None, token: str) -> bool:
    # A form field may hold any text; compare_digest takes only ASCII str (else TypeError).
    return token.isascii() and ctx.sessions.csrf_ok(value, token)


def _csrf(ctx: ApiContext, seen: Visitor) -> str:
    return ctx.sessions.csrf_token(seen.session) if seen.session else ""


def _signer(ctx: ApiContext, seen: Visitor, csrf: str) -> str | Response:
    """Who sends the form, or the answer to a form that must not be acted on."""
    if seen.name is None:
        return _sign_in(ctx, seen)
    # A header-signed caller has no CSRF token: a script's header is not ambient, but one
    # a proxy adds to every request is, so a form another site posted is refused.
    if seen.session is None and _from_another_site(ctx, seen.request):
        return _page(
            "message.html", 403, title="Refused", message="The form came from another site."
        )
    if seen.session is not None and not _csrf_ok(ctx, seen.session, csrf):
        return _page("message.html", 403, title="Refused", message="The form has expired.")
    return seen.name


def _from_another_site(ctx: ApiContext, request: Request) -> bool:
    """Whether a browser says this request comes from a page of another site: its
    `Sec-Fetch-Site`, else its `Origin` (`null` included) against the request's Host and
    `[api] public_url`. A script sends neither."""
    fetch_site = request.headers.get("sec-fetch-site")
    if fetch_site is not None:
        return fetch_site.lower() not in ("same-origin", "none")
    origin = request.headers.get("origin")
    if origin is None:
        return False
    ours = {request.headers.get("host", "").lower()}
    if ctx.public_url:
        ours.add(urlsplit(ctx.public_url).netloc.lower())
    return urlsplit(origin.strip()).netloc.lower() not in ours


async def _job_action(
    ctx: ApiContext, seen: Visitor, key: str, csrf: str, act: Callable[[str], object], done: str
) -> Response:
    """A decision from a job's page: done, back to the page (303); refused, the page with
    the refusal's sentence."""
    who = _signer(ctx, seen, csrf)
    if isinstance(who, Response):
        return who
    try:
        await run_in_threadpool(act, who)
    except ServiceError as exc:
        return _job_page(ctx, seen, key, problem=exc.message, code=page_status(exc))
    return RedirectResponse(job_href(key) + "?done=" + quote(done), status_code=303)


#: What `?done=` may say after a form (the page's own redirects).
NOTICES = frozenset({*(f"resolved as {r.value}" for r in Resolution), "cancelled"})


def job_href(key: str) -> str:
    return "/ui/jobs/" + key_segment(key)


def age(seconds: float) -> str:
    """A short age for a queue row: "40 s", "12 min", "3 h", "2 d"."""
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{int(seconds)} s"
    if seconds < 3600:
        return f"{int(seconds // 60)} min"
    if seconds < 86400:
        return f"{int(seconds // 3600)} h"
    return f"{int(seconds // 86400)} d"


def _common(ctx: ApiContext, seen: Visitor, **values: Any) -> dict[str, Any]:
    return {"who": seen.name, "csrf": _csrf(ctx, seen), **values}


@router.get("/")
def queue(
    ctx: Ctx,
    seen: Seen,
    channel: str = "",
    reason: str = "",
    sort: str = "since",
    page: int = 1,
) -> Response:
    if seen.name is None:
        return _sign_in(ctx, seen, code=200)
    # An unknown sort (a hand-edited link) is the default one, not an error page.
    sort = sort if sort in SORTS else "since"
    found = ctx.services.review_queue(
        channel=channel or None, reason=reason or None, sort=sort, page=page
    )
    now = ctx.ledger.clock().timestamp()
    rows = []
    for row in found.rows:
        since = row_time(row.get("since"))
        rows.append({**row, "href": job_href(row["key"]),
                     "age": age(now - since) if since is not None else "-"})  # fmt: skip

    def link(**change: Any) -> str:
        query = {"channel": channel, "reason": reason, "sort": sort, "page": page, **change}
        return "/ui/?" + urlencode({k: v for k, v in query.items() if v not in ("", None)})

    return _page(
        "queue.html",
        **_common(ctx, seen),
        rows=rows,
        found=found,
        channel=channel,
        reason=reason,
        sort=sort,
        sorts={name: link(sort=name, page=1) for name in SORTS},
        previous=link(page=found.page - 1) if found.page > 1 else "",
        next=link(page=found.page + 1) if found.page < found.pages else "",
    )


def row_time(iso: object) -> float | None:
    if not isinstance(iso, str):
        return None
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


@router.get("/search")
def search(ctx: Ctx, seen: Seen, q: str = "") -> Response:
    if seen.name is None:
        return _sign_in(ctx, seen)
    rows = ctx.services.find_jobs(q) if q.strip() else []
    for row in rows:
        row["href"] = job_href(row["key"])
    return _page("search.html", **_common(ctx, seen), q=q, rows=rows)


@router.post("/sign-in")
def sign_in(
    ctx: Ctx,
    seen: Seen,
    token: Annotated[str, Form()] = "",
    csrf: Annotated[str, Form()] = "",
) -> Response:
    # Per client address (behind a proxy: the proxy's, unless uvicorn is told to trust
    # its X-Forwarded-For): docs/review.md "Review page".
    address = client_of(seen.request.client.host if seen.request.client else "-")
    # Asked and counted at once: guesses sent together are limited as one after another.
    wait = ctx.signin_limit.begin(address)
    if wait:
        page = _page("message.html", 429, title="Too many attempts",
                     message=f"Too many failed sign-ins: try again in {ceil(wait)} s.")  # fmt: skip
        page.headers["Retry-After"] = str(ceil(wait))
        return page
    failed = False
    try:
        if not _csrf_ok(ctx, seen.request.cookies.get(SIGN_IN_COOKIE), csrf):
            return _sign_in(ctx, seen, "The sign-in form had expired: sign in again.", 403)
        identity = ctx.tokens.identity(token.strip())
        failed = identity is None
    finally:
        ctx.signin_limit.end(address, failed=failed)
    if identity is None:
        return _sign_in(ctx, seen, "That token is not valid.")
    if not identity.may(PAGE_ROLE):
        msg = f"That token lacks the {PAGE_ROLE.value} role the page needs."
        return _sign_in(ctx, seen, msg, 403)
    name = identity.name
    # The browser's previous session ends: its cookie is replaced, but a copy of it would
    # otherwise stay valid for its 8 hours (as after a sign-out).
    ctx.sessions.close(seen.request.cookies.get(SESSION_COOKIE))
    response = RedirectResponse("/ui/", status_code=303)
    _set_cookie(ctx, seen.request, response, SESSION_COOKIE, ctx.sessions.open(name),
                SESSION_SECONDS)  # fmt: skip
    response.delete_cookie(SIGN_IN_COOKIE, path="/ui")
    return response


@router.post("/sign-out")
def sign_out(ctx: Ctx, seen: Seen, csrf: Annotated[str, Form()] = "") -> Response:
    # Ended on the server whenever the cookie came, whatever the CSRF token (the form's
    # field stays): only deleting the cookie left the session valid for any copy of it.
    # The cookie is SameSite=Strict, so another site's form does not carry it; and
    # signing a browser out is all such a form could do.
    del csrf
    ctx.sessions.close(seen.session)
    response = RedirectResponse("/ui/", status_code=303)
    response.delete_cookie(SESSION_COOKIE, path="/ui")
    return response


def _job_page(
    ctx: ApiContext,
    seen: Visitor,
    key: str,
    *,
    done: str = "",
    check: CheckAnswer | None = None,
    problem: str = "",
    code: int = 200,
) -> Response:
    try:
        view = ctx.services.job_view(key)
    except ServiceError as exc:
        return _page("message.html", page_status(exc), title="No such job",
                     message=exc.message)  # fmt: skip
    href = job_href(key)
    timeline = [{**record, "details": timeline_details(record)} for record in view.history]
    return _page(
        "job.html",
        code,
        **_common(ctx, seen),
        view=view,
        status=view.status,
        timeline=timeline,
        guidance=view.guidance,
        resend_withheld=bool(view.decisions) and Resolution.RESEND not in view.decisions,
        href=href,
        done=done,
        check=check,
        problem=problem,
        check_command=command_line("sendledger", "review", "check", key),
    )


@router.get("/jobs/{key:key}")
def job_page(key: str, ctx: Ctx, seen: Seen, done: str = "") -> Response:
    if seen.name is None:
        return _sign_in(ctx, seen)
    # Only the page's own notices: a crafted link cannot make the page say anything else.
    return _job_page(ctx, seen, key, done=done if done in NOTICES else "")


@router.post("/jobs/{key:key}/check")
async def check_form(key: str, ctx: Ctx, seen: Seen, csrf: Annotated[str, Form()] = "") -> Response:
    who = _signer(ctx, seen, csrf)
    if isinstance(who, Response):
        return who
    try:
        answer = await run_in_threadpool(lambda: ctx.services.check(key, by=who))
    except ServiceError as exc:
        return _job_page(ctx, seen, key, problem=exc.message, code=page_status(exc))
    return _job_page(ctx, seen, key, check=answer)


@router.post("/jobs/{key:key}/resolve")
async def resolve_form(
    key: str,
    ctx: Ctx,
    seen: Seen,
    decision: Annotated[str, Form(alias="as")] = "",
    note: Annotated[str, Form()] = "",
    csrf: Annotated[str, Form()] = "",
    version: Annotated[str, Form()] = "",
) -> Response:
    if decision not in {r.value for r in Resolution}:
        return _refused("as", "choose sent, resend or abandon")
    seen_version = _form_version(version)
    if isinstance(seen_version, Response):
        return seen_version
    return await _job_action(
        ctx,
        seen,
        key,
        csrf,
        lambda by: resolve_as_a_person(
            ctx.services,
            key,
            Resolution(decision),
            note=note,
            by=by,
            expected_version=seen_version,
        ),
        f"resolved as {decision}",
    )


def _form_version(text: str) -> int | Response | None:
    """The job's version the page showed when the person decided (a decision holds for
    that version only: docs/review.md "Two people, one job")."""
    if not text:
        return None
    if not text.isascii() or not text.isdigit() or len(text) > 18 or int(text) < 1:
        return _refused("version", "the form is damaged: not a version the page gave")
    return int(text)


@router.post("/jobs/{key:key}/cancel")
async def cancel_form(
    key: str,
    ctx: Ctx,
    seen: Seen,
    note: Annotated[str, Form()] = "",
    csrf: Annotated[str, Form()] = "",
    version: Annotated[str, Form()] = "",
) -> Response:
    seen_version = _form_version(version)
    if isinstance(seen_version, Response):
        return seen_version
    return await _job_action(
        ctx,
        seen,
        key,
        csrf,
        lambda by: ctx.services.cancel(key, note=note, by=by, expected_version=seen_version),
        "cancelled",
    )


@router.get("/triage")
def triage_page(ctx: Ctx, seen: Seen) -> Response:
    if seen.name is None:
        return _sign_in(ctx, seen)
    queue = ctx.services.review_queue(per_page=1)
    return _page("triage.html", **_common(ctx, seen), queue=queue, items=None, channel="",
                 reason="", dry_run=True)  # fmt: skip


@router.post("/triage")
async def triage_form(
    ctx: Ctx,
    seen: Seen,
    channel: Annotated[str, Form()] = "",
    reason: Annotated[str, Form()] = "",
    mode: Annotated[str, Form()] = "dry-run",
    csrf: Annotated[str, Form()] = "",
) -> Response:
    by = _signer(ctx, seen, csrf)
    if isinstance(by, Response):
        return by
    # No channel holds a NUL (PostgreSQL refuses it); a reason is one of a closed set.
    if "\x00" in channel:
        return _refused("channel", "no channel holds a NUL character")
    if reason and reason not in REASONS:
        return _refused("reason", f"no such reason (one of {', '.join(REASONS)})")
    dry_run = mode != "resolve"
    items: list[TriageItem] = await run_in_threadpool(
        lambda: ctx.services.triage(
            by=by, channel=channel or None, reason=reason or None, dry_run=dry_run
        )
    )
    queue = ctx.services.review_queue(per_page=1)
    return _page("triage.html", **_common(ctx, seen), queue=queue, channel=channel,
                 reason=reason, dry_run=dry_run,
                 items=[{**i.as_dict(), "href": job_href(i.key)} for i in items])  # fmt: skip


@router.get("/overview")
def overview(ctx: Ctx, seen: Seen) -> Response:
    if seen.name is None:
        return _sign_in(ctx, seen)
    now = ctx.ledger.clock()
    counts = ctx.ledger.open_counts()
    chart = hourly_chart(ctx.ledger, until=now, hours=24)
    # The daemon's own circuits; `sendledger api` has none to show (no engine there).
    circuits = ctx.health.circuits
    held = None if circuits is None else [(c.scope, held_scope(c, now)) for c in circuits()]
    return _page(
        "overview.html",
        **_common(ctx, seen),
        counts=[(str(state), counts.get(str(state), 0)) for state in OPEN_STATES],
        chart=chart,
        narrow=chart.resized(NARROW, 6),
        since=now - timedelta(hours=24),
        held=held,
    )


__all__: list[str] = ["age", "job_href", "router"]

"""Least privilege (docs/http-api.md "Roles"): the token file's `name:token:ROLES` lines, what is
refused at load, the one route -> role table, and, for every route of the OpenAPI
document and every set of roles, 403 `{"error"}` without the route's role, before
anything of the request is read or written."""

from __future__ import annotations

import functools
import itertools
from collections.abc import Iterator
from contextlib import nullcontext
from pathlib import Path
from urllib.parse import quote

import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.unit.engine_rig import EngineRig, policy
from tests.unit.test_api_fails_cleanly import _sign_in_form

from daemon.api import jobs, review
from daemon.api.app import create_app
from daemon.api.auth import ALL_ROLES, Identity, Role, TokenBook, TokenFileError
from daemon.api.context import ApiContext
from daemon.api.health import HealthSources
from daemon.api.metrics import Metrics, Sources
from daemon.api.roles import PAGE_ROLE, ROUTE_ROLES, GuardedRoute, role_for
from daemon.service_layer.services import ChannelPolicies

#: Every set of the three narrow roles (admin is every right, tested apart).
NARROW = [Role.SUBMIT, Role.READ, Role.REVIEW]
ROLE_SETS = [
    frozenset(c) for n in range(len(NARROW) + 1) for c in itertools.combinations(NARROW, n)
] + [frozenset({Role.ADMIN}), frozenset({Role.ADMIN, Role.READ})]


def token_of(roles: frozenset[Role]) -> str:
    return "tok-" + ("-".join(sorted(roles)) or "none").ljust(20, "x")


def book_file(tmp_path: Path, text: str) -> TokenBook:
    path = tmp_path / "tokens"
    path.write_text(text, encoding="utf-8")
    return TokenBook.from_file(path)


# -- the token file ---------------------------------------------------------------------


def test_lines_with_and_without_roles(tmp_path: Path) -> None:
    book = book_file(
        tmp_path,
        "# bare, named, named with roles\n"
        "0123456789abcdef-bare\n"
        "shop:0123456789abcdef-shop\n"
        "n8n:0123456789abcdef-n8n: submit , read\n"
        "ops:0123456789abcdef-ops:admin\n",
    )
    assert book.identity("0123456789abcdef-bare") == Identity("token-2", ALL_ROLES)
    assert book.identity("0123456789abcdef-shop") == Identity("shop", ALL_ROLES)
    n8n = book.identity("0123456789abcdef-n8n")
    assert n8n == Identity("n8n", frozenset({Role.SUBMIT, Role.READ}))
    assert n8n.may(Role.READ) and not n8n.may(Role.REVIEW) and not n8n.may(Role.ADMIN)
    ops = book.identity("0123456789abcdef-ops")
    assert ops is not None and all(ops.may(role) for role in Role)
    assert book.who("0123456789abcdef-n8n") == "n8n"
    assert book.identity("0123456789abcdef-nope") is None


@pytest.mark.parametrize(
    ("line", "says"),
    [
        ("n8n:0123456789abcdef:submit,write", "not 'write'"),
        ("n8n:0123456789abcdef:", "roles are a comma list"),
        ("n8n:0123456789abcdef:submit:read", "may not contain ':'"),
        ("n8n:0123456789abcdéf-accent", "printable ASCII"),
        ("n8n:0123456789abcdef\x7f", "printable ASCII"),
        ("n8n:short", "at least 16"),
        (":0123456789abcdef", "an empty name"),
    ],
)
def test_a_bad_line_is_refused_naming_it(tmp_path: Path, line: str, says: str) -> None:
    with pytest.raises(TokenFileError) as info:
        book_file(tmp_path, f"ok:0123456789abcdef-ok\n{line}\n")
    assert f"{tmp_path / 'tokens'}:2: " in str(info.value) and says in str(info.value)
    assert "0123456789abcdef" not in str(info.value)  # never the token itself


def test_the_same_token_twice_is_refused_naming_both_lines(tmp_path: Path) -> None:
    with pytest.raises(TokenFileError) as info:
        book_file(tmp_path, "a:0123456789abcdef-1\nb:0123456789abcdef-2\n\nc:0123456789abcdef-1\n")
    assert "lines 1 and 4 hold the same token" in str(info.value)
    assert "0123456789abcdef" not in str(info.value)


# -- the table --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def rig() -> Iterator[EngineRig]:
    rig = EngineRig(policy("legal", on_unknown="review"))
    yield rig
    rig.close()


@pytest.fixture(scope="module")
def client(rig: EngineRig) -> Iterator[TestClient]:
    tokens: dict[str, str | Identity] = {
        token_of(roles): Identity("r-" + "-".join(sorted(roles)), roles) for roles in ROLE_SETS
    }
    ctx = ApiContext(
        ledger=rig.ledger,
        policies=lambda: rig.policies,
        tokens=TokenBook(tokens),
        max_body=1_000_000,
        health=HealthSources(rig.ledger, lambda: rig.policies, lambda: None, ["fake"]),
        metrics=Metrics(Sources(rig.ledger, {"fake": rig.provider})),
        intake_policies=lambda: ChannelPolicies(rig.policies),
        providers=lambda name: nullcontext(rig.provider),
    )
    with TestClient(create_app(ctx)) as client:
        job = {"channel": "legal", "key": "known", "to": "c@example.net", "subject": "S",
               "body": "b"}  # fmt: skip
        admin = {"Authorization": f"Bearer {token_of(frozenset({Role.ADMIN}))}"}
        assert client.post("/v1/jobs", json=job, headers=admin).status_code == 201
        yield client


@functools.cache
def operations(client: TestClient) -> list[tuple[str, str]]:
    """The documented operations, read once per client (every example of a property test
    shares its client)."""
    doc = client.get("/v1/openapi.json").json()
    return sorted(
        (method.upper(), path)
        for path, item in doc["paths"].items()
        for method in item
        if path.startswith("/v1/")
    )


def test_the_table_names_every_route_and_no_other(client: TestClient) -> None:
    routes = {
        (method, route.path_format)
        for route in [*jobs.router.routes, *review.router.routes]
        if isinstance(route, GuardedRoute)
        for method in route.methods or ()
    }
    assert routes == set(ROUTE_ROLES)
    assert set(operations(client)) == set(ROUTE_ROLES)
    assert role_for("HEAD", "/v1/jobs/{key}") is Role.READ
    assert role_for("DELETE", "/v1/jobs/{key}") is Role.ADMIN  # unknown: closed


KEYS = st.one_of(st.just("known"), st.text(st.characters(codec="utf-8"), min_size=1, max_size=30))
BODIES = st.one_of(
    st.just(b""),
    st.just(b'{"as": "sent", "note": "x"}'),
    st.just(
        b'{"channel": "legal", "key": "new", "to": "a@b.example", "subject": "s", "body": "b"}'
    ),
    st.binary(max_size=200),
)


@settings(
    deadline=None, max_examples=300, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    index=st.integers(min_value=0),
    roles=st.sampled_from(ROLE_SETS),
    key=KEYS,
    body=BODIES,
    query=st.dictionaries(
        st.sampled_from(["state", "limit", "cursor", "channel"]), st.text(max_size=8)
    ),
)
def test_without_the_route_role_every_request_is_403_and_nothing_else(
    client: TestClient,
    rig: EngineRig,
    index: int,
    roles: frozenset[Role],
    key: str,
    body: bytes,
    query: dict[str, str],
) -> None:
    ops = operations(client)
    method, path = ops[index % len(ops)]
    needed = ROUTE_ROLES[(method, path)]
    url = path.replace("{key}", quote(key, safe=""))
    before = rig.ledger.counts()
    answer = client.request(
        method,
        url,
        content=body if method == "POST" else None,
        params=query,
        headers={"Authorization": f"Bearer {token_of(roles)}", "Content-Type": "application/json"},
    )
    anonymous = client.request(
        method,
        url,
        content=body if method == "POST" else None,
        params=query,
        headers={"Content-Type": "application/json"},
    )
    if anonymous.status_code != 401:
        # No route took the URL (a key with a newline): the answer is the same with any
        # token or none, so it tells nothing.
        assert (answer.status_code, answer.content) == (anonymous.status_code, anonymous.content)
        return
    if Identity("x", roles).may(needed):
        assert answer.status_code not in (401, 403), (method, url, answer.text)
        return
    assert answer.status_code == 403, (method, url, roles, answer.text)
    assert list(answer.json()) == ["error"]
    assert needed.value in answer.json()["error"]
    # Says nothing of the job asked for: the same words for another key. (Not "the key is
    # not in them": a generated key may be a piece of those words, "revi" of "review".)
    other = client.request(
        method,
        path.replace("{key}", "another-key"),
        content=body if method == "POST" else None,
        params=query,
        headers={"Authorization": f"Bearer {token_of(roles)}", "Content-Type": "application/json"},
    )
    assert other.json() == answer.json()
    assert rig.ledger.counts() == before  # nothing written


def test_the_page_needs_the_review_role(client: TestClient) -> None:
    reader = token_of(frozenset({Role.READ, Role.SUBMIT}))
    form = {"token": reader, "csrf": _sign_in_form(client)}
    refused = client.post("/ui/sign-in", data=form, follow_redirects=False)
    assert refused.status_code == 403 and "review role" in refused.text
    assert "sendledger_session" not in refused.headers.get("set-cookie", "")
    for page in ("/ui/", "/ui/jobs/known", "/ui/overview", "/ui/triage"):
        answer = client.get(page, headers={"Authorization": f"Bearer {reader}"})
        assert answer.status_code == 403, page
        assert "known" not in answer.text
    reviewer = token_of(frozenset({Role.REVIEW}))
    form = {"token": reviewer, "csrf": _sign_in_form(client)}
    signed = client.post("/ui/sign-in", data=form, follow_redirects=False)
    assert signed.status_code == 303
    assert client.get("/ui/jobs/known").status_code == 200
    client.cookies.clear()


def test_the_readme_table_is_the_table() -> None:
    page = Path(__file__).parents[2] / "docs" / "http-api.md"
    section = page.read_text(encoding="utf-8").split("### Roles", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        cells = [cell.strip().strip("`") for cell in line.strip("|").split("|")]
        if len(cells) == 2 and cells[0].split(" ")[0] in ("GET", "POST"):
            method, path = cells[0].split(" ", 1)
            rows[(method, path)] = Role(cells[1])
    assert rows == ROUTE_ROLES
    assert "| `/ui/` (every page and form) | review |" in section
    assert PAGE_ROLE is Role.REVIEW

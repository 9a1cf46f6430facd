"""docs/review.md against the code it describes, both ways where the page holds a list
(docs/development.md "Writing the docs"): the review reasons against `EscalationReason`, the
actions table against the parser, the API's routes and the page's templates, the `Checked`
event's fields, triage's note and actions, and the page's figures (page size, search scan,
sign-in limit, session length, chart series) against the constants that make them."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from tests.unit import docs_page
from tests.unit.docs_page import table
from tests.unit.engine_rig import EngineRig, claimed_by
from tests.unit.test_services import LEGAL, OTHER, in_review, services

from daemon.api import jobs, overview, review, signin_limit
from daemon.api.auth import SESSION_SECONDS
from daemon.cli import build_parser
from daemon.service_layer.doors import lent_providers
from daemon.service_layer.read_models import CONTENT_PAGE
from daemon.service_layer.services import SORTS, TRIAGE_NOTE, Services
from ledger.job import SendJob
from ledger.vocabulary import EscalationReason, JobState, Resolution

REPO = Path(__file__).resolve().parents[2]
PAGE = (REPO / "docs" / "review.md").read_text(encoding="utf-8")
TEMPLATES = REPO / "src" / "daemon" / "api" / "templates"


def section(heading: str) -> str:
    return docs_page.section(REPO / "docs" / "review.md", heading, until=6)


def flat(heading: str) -> str:
    """The section's text with every run of white space one space (lines reflow)."""
    return " ".join(section(heading).split())


@pytest.fixture
def rig() -> Iterator[EngineRig]:
    rig = EngineRig(LEGAL, OTHER)
    yield rig
    rig.close()


def test_the_reasons_are_escalation_reasons() -> None:
    text = section("## Review: check, resend, triage, cancel")
    written = [row[0].strip("`") for row in table(text)]
    assert written == [reason.value for reason in EscalationReason]


def test_the_reasons_meaning_and_next_step_are_what_the_page_says() -> None:
    from daemon.service_layer.guidance import MEANING, NEXT

    text = section("## Review: check, resend, triage, cancel")
    rows = {row[0].strip("`"): (row[1], row[2]) for row in table(text)}
    assert rows == {reason.value: (MEANING[reason], NEXT[reason]) for reason in EscalationReason}


def test_the_actions_table_names_commands_routes_and_buttons_that_exist() -> None:
    text = section("## Review: check, resend, triage, cancel").split("| Action |", 1)[1]
    rows = table("| Action |" + text)
    assert [row[0] for row in rows] == ["check", "resolve", "triage", "cancel"]
    routes = {
        (method, route.path.replace("{key:key}", "{key}"))
        for router in (review.router, jobs.router)
        for route in router.routes
        for method in getattr(route, "methods", ())
    }
    parser = build_parser()
    templates = "".join(p.read_text(encoding="utf-8") for p in TEMPLATES.glob("*.html"))
    for _action, cli, http, page in rows:
        argv = re.sub(r"\[[^]]*\]", "", cli.strip("`")).split()[1:]
        argv = [{"KEY": "k", "sent|resend|abandon": "sent"}.get(w, w) for w in argv]
        assert parser.parse_args(argv).func is not None, cli
        method, path = http.strip("`").split()
        assert (method, path) in routes, http
        for label in re.findall(r'"([^"]+)"', page):
            assert f">{label}</button>" in templates, label


def test_the_checked_event_holds_the_fields_named() -> None:
    text = section("### Check")
    named = re.search(r"`Checked` event \(([^)]+)\)", text)
    assert named is not None
    fields = [f.name for f in dataclasses.fields(SendJob.Checked)]
    assert re.findall(r"`(\w+)`", named.group(1)) == [
        f for f in fields if not f.startswith("originator") and f != "timestamp"
    ]


def test_a_check_while_a_send_is_in_flight_is_shown_not_recorded(rig: EngineRig) -> None:
    rig.submit("legal", "k1")
    rig.ledger.save_job(claimed_by(rig.ledger, "k1", "rig"))
    assert rig.job("k1").state is JobState.ATTEMPTED
    answer = services(rig).check("k1", by="bob")
    assert not answer.recorded and answer.as_dict()["recorded"] is False
    assert "Checked" not in rig.events("k1")
    assert '(`"recorded": false`)' in flat("### Check")


def test_the_triage_note_and_actions_are_the_services(rig: EngineRig) -> None:
    text = section("### Triage")
    assert f'the note "{TRIAGE_NOTE}"' in text
    written = re.search(r"\(`action`: ([^)]+)\)", text)
    assert written is not None
    in_review(rig, "one", copies=1)
    in_review(rig, "none", copies=0)
    s = services(rig)
    seen = {item.action for item in s.triage(by="ops", dry_run=True)}
    seen |= {item.action for item in s.triage(by="ops")}
    rig.provider.fail_searches(1)
    seen |= {item.action for item in s.triage(by="ops")}
    assert sorted(re.findall(r"`([\w-]+)`", written.group(1))) == sorted(seen)


def test_the_page_figures_are_the_codes() -> None:
    text = flat("## Review page")
    per_page = Services.review_queue.__kwdefaults__["per_page"]
    scan = Services.find_jobs.__kwdefaults__["scan"]
    assert f"; {per_page} a page." in text
    assert f"among the {scan} most recently" in text
    # "age" is the page's word for the time since the job entered review.
    shown = {"since": "age", "key": "key", "reason": "reason", "channel": "channel"}
    assert "sort by age, key, reason or channel;" in text
    assert {shown[s.lstrip("-")] for s in SORTS} == {"age", "key", "reason", "channel"}
    assert [(name, event) for name, event, _colour in overview.SERIES] == [
        ("sends", "Confirmed"),
        ("unknowns", "Unknown"),
        ("duplicates", "Duplicate"),
        ("reviews", "Escalated"),
    ]
    assert "chart of sends (confirmations), unknowns, duplicates and reviews (escalations)" in text
    costs = flat("### What a list costs")
    assert f"content (To, Subject) of {CONTENT_PAGE} jobs a query" in costs


def test_the_sign_in_figures_are_the_codes() -> None:
    text = flat("### Sign-in")
    minutes = int(signin_limit.WINDOW // 60)
    assert f"cookie for {SESSION_SECONDS // 3600} hours" in text
    assert f"after {signin_limit.FAILURES} failed attempts within {minutes} minutes" in text
    assert f"until the oldest failure is {minutes} minutes old" in text


def test_the_daemon_lends_its_own_provider_and_builds_none(rig: EngineRig) -> None:
    """A door in the daemon searches with the engine's provider, the one its quota and
    circuit belong to, and leaves it open; a name it has no live provider for is built."""
    built: list[str] = []

    @contextmanager
    def build(name: str) -> Iterator[Any]:
        built.append(name)
        yield rig.provider

    source = lent_providers({"fake": rig.provider, "idle": None}, build)
    with source("fake") as provider:
        assert provider is rig.provider
    assert built == []
    with source("idle"):
        pass
    assert built == ["idle"]
    assert "the daemon's API lends its own (shared quota)" in flat(
        "## Review: check, resend, triage, cancel"
    )


def test_resolved_as_sent_keeps_the_ids_the_job_had_and_triage_its_copy(rig: EngineRig) -> None:
    in_review(rig, "human", copies=1)
    in_review(rig, "triaged", copies=1)
    s = services(rig)
    [seen] = s.check("human", by="bob").copies
    job = s.resolve("human", Resolution.SENT, note="copy seen", by="bob")
    assert job.state is JobState.CONFIRMED and job.provider_message_ids == []
    assert [e for e in s.history("human") if e["type"] == "Checked"][-1][
        "provider_message_ids"
    ] == [seen.provider_id]
    [item] = s.triage(by="ops")
    assert item.action == "resolved-sent"
    assert rig.job("triaged").provider_message_ids == item.copies
    assert "only triage, whose own search found the copy, keeps that copy's id" in flat(
        "### Resolve"
    )


def test_the_roles_named_are_the_route_table() -> None:
    from daemon.api.roles import PAGE_ROLE, ROUTE_ROLES

    text = flat("## Review: check, resend, triage, cancel")
    assert "`review` for check, resolve and triage, `submit` for cancel" in text
    assert f"every page of `/ui/` needs `{PAGE_ROLE.value}`" in text
    assert {
        path: role.value
        for (method, path), role in ROUTE_ROLES.items()
        if method == "POST" and ("/review/" in path or path.endswith("/cancel"))
    } == {
        "/v1/review/triage": "review",
        "/v1/review/{key}/check": "review",
        "/v1/review/{key}/resolve": "review",
        "/v1/jobs/{key}/cancel": "submit",
    }


def test_forwarded_headers_are_read_from_a_proxy_on_the_same_host_only() -> None:
    """uvicorn reads X-Forwarded-Proto (and -For) only from loopback: a proxy on the same
    host. Its scheme then makes the cookies Secure (`daemon.api.ui.secure_cookies`)."""
    from fastapi import FastAPI

    from daemon.api.server import ApiServer

    config = ApiServer(FastAPI(), "127.0.0.1", 0).server.config
    assert config.proxy_headers is True
    assert set(str(config.forwarded_allow_ips).split(",")) <= {"127.0.0.1", "::1"}
    assert "(uvicorn reads `X-Forwarded-Proto` from a proxy on the same host)" in flat(
        "### Sign-in"
    )

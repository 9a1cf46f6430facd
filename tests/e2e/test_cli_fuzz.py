"""Fuzz what a user can hand the command line: job JSON, config files, policy files,
SENDLEDGER_* variables and arguments. Whatever arrives, the answer is exit 0, 2, 3 or 4
with a sentence, never a traceback or "unexpected failure" (issue 8).

Each example is a process of its own, forked from one that imported sendledger once
(tests/e2e/fork_server.py: its own environment, stdin, stdout, stderr and exit code, as
the console script would have): thirty interpreter starts cost most of this test's time
and prove nothing the commands' own answers do not."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.e2e.conftest import POLICY, config_text
from tests.e2e.daemon_kit import ForkServer, shared_fork_server

FIELDS = ["channel", "key", "to", "cc", "reply_to", "subject", "body", "html", "bcc"]
NASTY = st.sampled_from(
    ["", " ", "a@exa mple.org", "Bob\x00 <b@example.com>", "\u202e", "x" * 300, "receipts",
     "b@example.com", "Zoë <z@bücher.de>", "\ud800", "a\u2028b", "{", "[]", "-1", "1e999"]
)  # fmt: skip
VALUE = st.one_of(
    NASTY,
    st.text(max_size=20),
    st.integers(),
    st.floats(allow_nan=False),
    st.none(),
    st.booleans(),
    st.lists(NASTY, max_size=3),
)
JOB = st.one_of(
    st.fixed_dictionaries(
        {"channel": st.just("receipts"), "key": st.text(min_size=1, max_size=8),
         "to": NASTY, "subject": VALUE, "body": VALUE},
        optional={f: VALUE for f in ("cc", "reply_to", "html", "bcc")},
    ),
    st.dictionaries(st.sampled_from(FIELDS), VALUE, max_size=6),
    VALUE,
)  # fmt: skip
JOB_TEXT = st.one_of(
    JOB.map(lambda j: json.dumps(j)),
    st.lists(JOB, max_size=3).map(json.dumps),
    st.text(max_size=40),
    st.just("[" * 100_000),
    st.just("1" * 5000),
)
CONFIG_LINES = st.sampled_from(
    ['[daemon]\ntick = "soon"\n', "[store]\nurl = 3\n", '[store]\nurl = "memory://"\n',
     "[[store]]\n", "not toml", '[providers.support]\nmax_recipients = 0\n', "\xff",
     '[daemon]\npolicies_dir = "/nonexistent"\n', '[api]\nlisten = ":x"\n', ""]
)  # fmt: skip
POLICY_LINES = st.sampled_from(
    ['from = "Sup\\u2028port <s@example.com>"\n', 'from = "a@[1.2.3.4]"\n',
     'max_attempts = "x"\n', 'search_after = "-5s"\n', "on_unknown = 3\n", "= broken\n",
     'message_id_domain = "-x.org"\n', ""]
)  # fmt: skip
ENV = st.dictionaries(
    st.sampled_from(["SENDLEDGER_STOR__URL", "SENDLEDGER_DAEMON__TICK", "SENDLEDGER_PROVIDERS",
                     "SENDLEDGER_STORE__URL", "SENDLEDGER_API__MAX_BODY", "SENDLEDGER_X"]),
    st.sampled_from(["", "{", "{}", "1s", "sqlite:///other.sqlite", "x", "[1]", "-1"]),
    max_size=2,
)  # fmt: skip
ARGS = st.sampled_from(
    [["submit", "--json", "-"], ["submit", "-"], ["status", "k"], ["history", "--json", "k"],
     ["review", "list", "--json"], ["review", "resolve", "k", "--as", "sent"],
     ["review", "check", "k"], ["audit", "--since", "99999999d"], ["audit", "--until", "x"],
     ["policy", "check", "--json"], ["admin", "rebuild-index"], ["status"], ["--bogus"],
     ["audit", "--format", "csv", "--config"], ["demo", "--lag", "-1s"]]
)  # fmt: skip


@pytest.fixture
def server() -> ForkServer:
    return shared_fork_server()


def base_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("SENDLEDGER_")}


@settings(
    max_examples=int(os.environ.get("FUZZ_EXAMPLES", "30")),
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    argv=ARGS,
    job_text=JOB_TEXT,
    config_extra=CONFIG_LINES,
    policy_extra=POLICY_LINES,
    env=ENV,
)
def test_the_cli_answers_every_input_with_a_documented_exit_code(
    server: ForkServer,
    tmp_path_factory: Any,
    argv: list[str],
    job_text: str,
    config_extra: str,
    policy_extra: str,
    env: dict[str, str],
) -> None:
    root = tmp_path_factory.mktemp("fuzz")
    (root / "policies").mkdir()
    (root / "policies" / "receipts.toml").write_text(POLICY + policy_extra, encoding="utf-8")
    (root / "sendledger.toml").write_text(
        config_text() + config_extra, encoding="utf-8", errors="surrogateescape"
    )
    stdin = job_text.encode("utf-8", "replace").decode("utf-8")
    config = ["--config", str(root / "sendledger.toml")]
    code, _out, err = server.call([*config, *argv], root, stdin, {**base_env(), **env})
    assert code in (0, 2, 3, 4), (argv, err[-2000:])
    assert "Traceback" not in err, err[-2000:]
    assert "unexpected failure" not in err, err[-2000:]
    if code != 0 and argv[:2] != ["policy", "check"]:
        assert len(err.splitlines()) == 1, err

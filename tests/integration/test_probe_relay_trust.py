"""The probe's relay in front of an https `api_endpoint` behind a private CA trusts it
through SSL_CERT_FILE (docs/providers.md "The probe on a graph provider"): the relay is
built as `sendledger probe` builds it (no CA of its own), and the Graph emulator serves
TLS from a CA only that variable names."""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path

import pytest

from testkit.graph_emulator import GraphEmulator
from testkit.relay import FaultPlan, FaultRelay
from testkit.tls import make_loopback_tls


def status_through(relay: FaultRelay) -> int:
    try:
        with urllib.request.urlopen(relay.url + "/v1.0/users/x/messages", timeout=5) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as refused:
        return int(refused.code)


def test_the_probes_relay_trusts_a_private_ca_through_ssl_cert_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tls = make_loopback_tls(tmp_path)
    with GraphEmulator(tls=tls) as graph:
        monkeypatch.delenv("SSL_CERT_FILE", raising=False)
        with FaultRelay(graph.url, plan=FaultPlan(send=["drop-response"])) as relay:
            assert status_through(relay) == 502  # the relay's "upstream unreachable"
            assert "CERTIFICATE_VERIFY_FAILED" in relay.log[-1]["error"]
        monkeypatch.setenv("SSL_CERT_FILE", str(tls.ca_file))
        with FaultRelay(graph.url, plan=FaultPlan(send=["drop-response"])) as relay:
            assert status_through(relay) == 401  # Graph's own answer: no token given
            assert relay.log[-1]["forwarded"] is True

"""Label values from outside, as Prometheus reads them back out of `/metrics`
(docs/http-api.md "Metrics").

A circuit's scope holds the job's From mailbox when a provider acts as each From
(`user = "{from}"`): an address from outside, which may hold `"`, `\\`, spaces and any
letter in a quoted local part or an internationalized address. Provider and webhook names
come from the config. What the text exposition carries must parse back, with the
reference parser, to exactly the value and nothing more (no second sample, no other
label): a line break or a quote left raw would end the line or the value early.
"""

from __future__ import annotations

from datetime import UTC, datetime

from hypothesis import example, given
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from daemon.api.metrics import Metrics, Sources
from daemon.engine.circuit import OpenCircuit
from ledger.application import Ledger

MOMENT = datetime(2026, 12, 4, tzinfo=UTC)


@given(st.text(max_size=40))
@example('graph/"a\\" } x{y="1"@example.com')
@example("graph/a@example.com\nsendledger_circuit_open 1")
@example("graph/\u00fcser@b\u00fccher.example\r\\n")
def test_a_circuit_scope_is_read_back_as_exactly_its_label(scope: str) -> None:
    circuit = OpenCircuit(scope, MOMENT, 3, MOMENT, False)
    with Ledger("memory://") as ledger:
        metrics = Metrics(Sources(ledger, {}, circuits=lambda: [circuit]))
        text = metrics.render().decode("utf-8")
    read = [
        sample
        for family in text_string_to_metric_families(text)
        if family.name.startswith("sendledger_circuit")
        for sample in family.samples
    ]
    assert [sample.labels for sample in read] == [{"scope": scope}] * 4
    assert [sample.value for sample in read] == [1, MOMENT.timestamp(), 3, 0]

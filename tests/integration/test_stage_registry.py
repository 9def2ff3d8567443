"""The stage registry (``app/controllers/stages.py``): one entry per topic, from which
the topology, the consumers, the DLQ wiring, every partition key and the docs table
derive."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any, ClassVar

import pytest

from app.controllers import stages
from app.controllers.dlq.reconcilers import RequestReconciler
from app.controllers.pipeline import build_consumers, build_reconcilers, build_topology
from app.controllers.stages import STAGES, Stage, by_queue, partition_key
from app.domain import messages as m
from app.queue import DLQ_SUFFIX, Delivery
from tests.e2e.harness import ROOT, serve
from tests.support.races import until

NOOP = "noop"


def test_the_docs_table_is_the_registry() -> None:
    text = (ROOT / "docs" / "pipeline.md").read_text()
    found = re.search(r"<!-- stages.table\(\) -->\n(.*?)\n<!-- /stages.table\(\) -->", text,
                      re.S)
    assert found, "docs/pipeline.md lost its generated stage table"
    assert found[1] == stages.table(), "regenerate it: python -c 'from app.controllers " \
        "import stages; print(stages.table())'"


def test_every_topic_is_declared_once_with_its_dlq_and_consumers() -> None:
    names = stages.topics()
    assert len(names) == len(set(names)) == 16
    topo = build_topology()
    for s in STAGES:
        taps = [t.group for t in stages.TAPS if t.topic == s.topic]
        assert topo.groups(s.topic) == sorted([s.group, *taps])
        assert topo.groups(s.topic + DLQ_SUFFIX) == [s.dlq_group]
        assert topo.spec(s.topic).serial == bool(s.serial)
    assert topo.groups(m.LOG) == sorted([m.GATEWAY_LOG_GROUP, m.NOTIFY_RELAY_GROUP,
                                        m.GITHUB_CHECK_RELAY_GROUP])
    reconcilers = build_reconcilers(_deps())
    assert set(reconcilers) == {t + DLQ_SUFFIX for t in names}
    specs = build_consumers(_deps())
    assert sorted((c.topic, c.group) for c in specs) == sorted(
        [*((s.topic, s.group) for s in STAGES), *((s.topic + DLQ_SUFFIX, s.dlq_group)
                                                  for s in STAGES),
         (m.LOG, m.NOTIFY_RELAY_GROUP), (m.LOG, m.GITHUB_CHECK_RELAY_GROUP)])
    gateway_only = build_consumers(_deps(), orchestrator=False)
    assert sorted((c.topic, c.group) for c in gateway_only) == [
        (m.LOG, m.GATEWAY_LOG_GROUP), (m.LOG + DLQ_SUFFIX, m.GATEWAY_DLQ_GROUP)]
    workers_only = build_consumers(_deps(), gateway=False)
    assert (m.LOG, m.NOTIFY_RELAY_GROUP) in {(c.topic, c.group) for c in workers_only}
    assert (m.LOG, m.GATEWAY_LOG_GROUP) not in {(c.topic, c.group) for c in workers_only}


def test_partition_keys_come_from_the_registry_and_refuse_a_foreign_payload() -> None:
    entity = m.EntityMsg(id="demo/7", queue="demo")
    assert partition_key(m.VALIDATE, entity) == "demo"  # serial per queue
    assert partition_key(m.MERGECHECK, entity) == "demo/7"
    assert partition_key(m.BUILDSIGNAL, m.EntityMsg(id="b-1", queue="demo")) == "b-1"
    assert partition_key(m.BUILD, m.BuildMsg(id="demo/batch/2", queue="demo", path_id="p",
                                             attempt=1)) == "demo/batch/2"
    note = m.NotifyMsg(id="demo/7", queue="demo", endpoint="team", log_id="demo/7/landed",
                       event="landed", status="landed", timestamp_ms=1)
    assert partition_key(m.NOTIFY, note) == "demo/team"  # one endpoint's deliveries
    with pytest.raises(TypeError, match="'build' carries BuildMsg, not EntityMsg"):
        partition_key(m.BUILD, entity)
    with pytest.raises(KeyError, match="no stage 'nope' in the registry"):
        partition_key("nope", entity)


class NoopController:
    """The worked example of docs/pipeline.md: handles every message by doing nothing."""

    seen: ClassVar[list[dict[str, Any]]] = []

    def __init__(self, deps: object) -> None:
        self.deps = deps

    async def process(self, delivery: Delivery) -> None:
        NoopController.seen.append(dict(delivery.payload))


async def test_a_stage_is_one_entry_and_one_controller(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Added by one entry (and the controller above), a stage is declared with its DLQ,
    consumed, and partitioned by its key; removed, it is gone again."""
    noop = Stage(NOOP, m.EntityMsg, by_queue, "queue", NoopController, RequestReconciler)
    NoopController.seen = []
    with monkeypatch.context() as patch:
        patch.setattr(stages, "STAGES", (*STAGES, noop))
        async with serve(f"sqlite+aiosqlite:///{tmp_path / 'sq.db'}", tmp_path) as server:
            rt = server.runtime
            assert rt.broker.topology.groups(NOOP) == [m.ORCHESTRATOR_GROUP]
            assert rt.broker.topology.groups(NOOP + DLQ_SUFFIX) == [m.ORCHESTRATOR_DLQ_GROUP]
            result = await rt.deps.publish(NOOP, m.EntityMsg(id="demo/1", queue="demo"),
                                           message_id="demo/1/noop")
            assert result.created
            await until("the no-op stage handled its message",
                        lambda: _true(NoopController.seen))
            (stored,) = await rt.broker.find_messages(NOOP, "demo/1/noop")
            assert stored.partition_key == "demo"  # the entry's key, typed by no publisher
            assert NoopController.seen == [{"id": "demo/1", "queue": "demo"}]
    assert NOOP not in stages.topics()
    assert NOOP not in build_topology().topics()


async def _true(value: object) -> bool:
    await asyncio.sleep(0)
    return bool(value)


def _deps() -> Any:
    from unittest import mock

    return mock.Mock()

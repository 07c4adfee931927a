"""Spans and metrics of a step map's items and of patch markers (C49, C51, C53).

A step map is one step of kind ``map`` while any of its items runs; each item
that runs is a span of its own under it, current where its body runs (a pool
thread for ``map``, a task for ``amap``), and each committed item a memo hit on
a replay. ``step.patched`` notes which branch a run takes; the marker a run
commits is a step of kind ``patch``. Runs are driven attempt by attempt on the
memory store with the OpenTelemetry SDK's in-memory exporter.
"""

from __future__ import annotations

import asyncio
from typing import Any

from opentelemetry import trace

from flexiq_plugins import DurableConfig, current_job
from flexiq_plugins.testing import DurableRun
from tests.observe.otel_support import Telemetry

tracer = trace.get_tracer("tests")


def _fetch(sku: str) -> str:
    """An item's body: a span of its own (an HTTP call, say), named after the item."""
    with tracer.start_as_current_span(f"fetch {sku}"):
        return f"price of {sku}"


def _by_key(spans: list[Any]) -> dict[str, Any]:
    return {span.attributes["flexiq.step.key"]: span for span in spans}


def test_c51_c53_each_item_of_a_step_map_is_a_span_under_the_maps_and_its_body_nests_under_it(
    telemetry: Telemetry,
) -> None:
    """Three items: a ``map`` span under the attempt, three item spans under it (kind ``run``, committed, their
    bytes), and each item's own span a child of that item's span, though the bodies ran in pool threads."""

    def body() -> list[str]:
        return current_job.step.map("price", _fetch, ["a", "b", "c"], key=lambda sku: sku)

    run = DurableRun(body, run_key="run-map", task_name="shop.prices", config=DurableConfig(keep_succeeded_steps=True))
    assert run.attempt().completed
    sizes = {row.step_key: row.size for row in run.steps}

    (attempt,) = telemetry.named("flexiq.attempt")
    steps = _by_key(telemetry.named("flexiq.step price"))
    assert set(steps) == {"price#0", "price:a", "price:b", "price:c"}
    the_map = steps.pop("price#0")
    assert the_map.attributes["flexiq.step.kind"] == "map"
    assert the_map.attributes["flexiq.step.outcome"] == "committed"
    assert the_map.parent is not None
    assert the_map.parent.span_id == attempt.context.span_id
    for key, item in steps.items():
        assert item.attributes["flexiq.step.kind"] == "run"
        assert item.attributes["flexiq.step.outcome"] == "committed"
        assert item.attributes["flexiq.step.position"] == 0  # the map's place in the sequence
        assert item.attributes["flexiq.step.bytes"] == sizes[key] > 0
        assert item.parent is not None
        assert item.parent.span_id == the_map.context.span_id
        (fetched,) = telemetry.named(f"fetch {key.split(':')[1]}")
        assert fetched.parent is not None
        assert fetched.parent.span_id == item.context.span_id
    task = {"flexiq.task": "shop.prices"}
    assert telemetry.moved("flexiq.steps", **task, **{"flexiq.step.outcome": "committed"}) == 4
    assert telemetry.moved("flexiq.store.commit.duration", **task) >= 1


def test_c51_c53_a_replayed_map_runs_spans_only_for_the_items_not_committed(telemetry: Telemetry) -> None:
    """An item fails on the first attempt (its span ``failed`` with the error, the map's too); the next attempt
    replays the two committed items as memo hits and makes a span for the one item that runs again."""
    calls: dict[str, int] = {}

    def fetch(sku: str) -> str:
        calls[sku] = calls.get(sku, 0) + 1
        if sku == "b" and calls[sku] == 1:
            raise ConnectionError("price service busy")
        return f"price of {sku}"

    def body() -> list[str]:
        return current_job.step.map("price", fetch, ["a", "b", "c"], key=lambda sku: sku)

    run = DurableRun(body, run_key="run-map-replay", task_name="shop.reprice")
    assert run.attempt().failed
    first = _by_key(telemetry.named("flexiq.step price"))
    assert first["price:b"].attributes["flexiq.step.outcome"] == "failed"
    assert first["price:b"].attributes["error.type"] == "ConnectionError"
    assert first["price#0"].attributes["flexiq.step.outcome"] == "failed"
    assert {first[k].attributes["flexiq.step.outcome"] for k in ("price:a", "price:c")} == {"committed"}

    telemetry.start([])
    assert run.attempt().completed
    second = _by_key(telemetry.named("flexiq.step price"))
    assert set(second) == {"price#0", "price:b"}
    assert second["price:b"].attributes["flexiq.step.outcome"] == "committed"
    (attempt,) = telemetry.named("flexiq.attempt")
    assert attempt.attributes["flexiq.steps.replayed"] == 2
    assert calls == {"a": 1, "b": 2, "c": 1}


def test_c51_c53_an_amap_items_body_nests_under_its_own_span(telemetry: Telemetry) -> None:
    """``amap``: each item's span is current in the task its body runs in."""

    async def fetch(sku: str) -> str:
        await asyncio.sleep(0)
        return _fetch(sku)

    def body() -> list[str]:
        async def prices() -> list[str]:
            return await current_job.step.amap("price", fetch, ["a", "b"], key=lambda sku: sku)

        return asyncio.run(prices())

    assert DurableRun(body, run_key="run-amap").attempt().completed
    steps = _by_key(telemetry.named("flexiq.step price"))
    assert set(steps) == {"price#0", "price:a", "price:b"}
    for sku in ("a", "b"):
        item = steps[f"price:{sku}"]
        assert item.parent is not None
        assert item.parent.span_id == steps["price#0"].context.span_id
        (fetched,) = telemetry.named(f"fetch {sku}")
        assert fetched.parent is not None
        assert fetched.parent.span_id == item.context.span_id


def test_c49_c53_a_patch_marker_is_a_step_and_each_branch_is_noted(telemetry: Telemetry) -> None:
    """A new run commits the marker ``patch:audit-v2``: a step span of kind ``patch``, and a ``flexiq.patch``
    event (new branch); a run recorded before the patch notes the old branch and makes no patch span."""
    deployed = {"patch": False}

    def body() -> str:
        step = current_job.step
        step.run("charge", lambda: "ch-1")
        if deployed["patch"] and step.patched("audit-v2"):
            step.run("audit", lambda: "audited")
        step.sleep("1m")
        return step.run("ship", lambda: "shipped")

    old = DurableRun(body, run_key="run-before-patch")
    assert old.attempt().sleeping
    deployed["patch"] = True
    telemetry.start([])
    old.clock.advance("1m")
    assert old.attempt().completed
    assert telemetry.named("flexiq.step patch") == []
    (old_attempt,) = telemetry.named("flexiq.attempt")
    (noted,) = [event for event in old_attempt.events if event.name == "flexiq.patch"]
    assert dict(noted.attributes or {}) == {"flexiq.patch.id": "audit-v2", "flexiq.patch.new_branch": False}

    telemetry.start([])
    new = DurableRun(body, run_key="run-after-patch")
    assert new.attempt().sleeping
    (marker,) = telemetry.named("flexiq.step patch")
    assert marker.attributes["flexiq.step.kind"] == "patch"
    assert marker.attributes["flexiq.step.key"] == "patch:audit-v2"
    assert marker.attributes["flexiq.step.outcome"] == "committed"
    (new_attempt,) = telemetry.named("flexiq.attempt")
    (noted,) = [event for event in new_attempt.events if event.name == "flexiq.patch"]
    assert noted.attributes is not None
    assert noted.attributes["flexiq.patch.new_branch"] is True
    assert "patch:audit-v2" in new.step_keys

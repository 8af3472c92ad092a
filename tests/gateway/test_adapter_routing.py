"""LoRA adapters at the gateway: each adapter of a ModelDeployment is a served name of its own
under the same ownership rules as model names, routed to that ModelDeployment's pods, to a
replica that has it in a slot when one has room (load first), listed with its parent; and a
replica's slots read from the server's own /metrics."""

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from kvpilot_common.errors import ModelNotFoundError
from kvpilot_gateway.adapters import narrow
from kvpilot_gateway.catalog import Catalog
from kvpilot_gateway.load import Load, parse_load
from kvpilot_server.api.adapter_metrics import collect_loaded
from kvpilot_server.engine.runtime.llm_engine import EngineStats
from kvpilot_server.engine.runtime.sequence import Priority
from tests.gateway.objects import md


def _with_adapters(obj: dict, *names: str) -> dict:
    obj["spec"]["adapters"] = [{"name": n, "source": f"pvc://c/{n}"} for n in names]
    return obj


def test_an_adapter_is_a_name_of_its_model_and_listed_with_its_parent():
    catalog = Catalog()
    catalog.set_model(_with_adapters(md("team-a", "llama", served="llama-3"), "sql", "tone"))
    found = catalog.resolve("sql")
    assert (found.key, found.adapter, found.served, found.parent) == (
        ("team-a", "llama"),
        "sql",
        "sql",
        "llama-3",
    )
    assert catalog.resolve("team-a/tone").adapter == "tone"
    assert catalog.resolve("llama-3").adapter is None
    listed = [(name, m.parent) for name, m in catalog.listed()]
    assert listed == [("llama-3", None), ("sql", "llama-3"), ("tone", "llama-3")]
    catalog.set_model(md("team-a", "llama", served="llama-3"))  # the adapter removed
    with pytest.raises(ModelNotFoundError):
        catalog.resolve("sql")


def test_a_tenant_cannot_take_another_tenants_model_name_with_an_adapter():
    catalog = Catalog()
    catalog.set_model(md("team-a", "chat", created="2026-11-01T00:00:00Z"))
    later = md("team-b", "other", created="2026-11-02T00:00:00Z")
    catalog.set_model(_with_adapters(later, "chat"))
    assert catalog.resolve("chat").namespace == "team-a" and catalog.resolve("chat").adapter is None
    assert catalog.resolve("team-b/chat").adapter == "chat"  # still reachable, qualified


def _scraped(resident: tuple[str, ...], slots: int = 2) -> Load:
    return Load(0.0, 0.0, 0.0, frozenset(resident), slots)


def test_a_replica_with_the_adapter_in_a_slot_else_one_with_a_free_slot_else_all():
    endpoints = ["a", "b", "c"]
    scraped = {"a": _scraped(("x", "y")), "b": _scraped(("sql", "y")), "c": _scraped(("z",))}
    idle = dict.fromkeys(endpoints, 0.0)
    assert narrow(endpoints, "sql", scraped, idle, 2) == ["b"]
    assert narrow(endpoints, "new", scraped, idle, 2) == ["c"]  # a free slot: nothing evicted
    full = {**scraped, "c": _scraped(("z", "w"))}
    assert narrow(endpoints, "new", full, idle, 2) == endpoints
    # Load before affinity: the replica holding it is past the bound.
    busy = {"a": 0.0, "b": 5.0, "c": 0.0}
    assert narrow(endpoints, "sql", scraped, busy, 3) == ["c"]


def test_slots_and_resident_adapters_are_read_from_the_servers_own_series():
    none = {p: 0 for p in Priority}
    stats = EngineStats(none, none, 0.0, 0, 0, 0, adapters=("a", "b"), adapters_resident=("b",))

    class Loaded:
        def collect(self):
            return collect_loaded("m", stats, 3)

    registry = CollectorRegistry()
    registry.register(Loaded())
    load = parse_load(generate_latest(registry).decode())
    assert load.adapters == frozenset({"b"}) and load.slots == 3

"""The gateway's catalog: which model a request names, and which pods take its requests."""

import asyncio

import pytest

from kvpilot_common.errors import ModelNotFoundError
from kvpilot_gateway.catalog import Catalog, endpoint_of
from tests.gateway.objects import md, pod


def test_a_model_is_found_by_its_served_name_or_namespace_qualified():
    catalog = Catalog()
    catalog.set_model(md("team-a", "llama", served="llama-3"))
    catalog.set_model(md("team-a", "phi"))
    assert catalog.resolve("llama-3").name == "llama"
    assert catalog.resolve("team-a/llama-3").name == "llama"
    assert catalog.resolve("phi").served == "phi"  # no servedModelName: the object's name
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        catalog.resolve("llama")  # the object's name is not what clients send
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        catalog.resolve("team-b/llama-3")


def test_the_same_name_in_two_namespaces_goes_to_the_older_and_both_stay_reachable():
    catalog = Catalog()
    catalog.set_model(md("team-b", "chat", created="2026-11-01T00:00:00Z"))
    catalog.set_model(md("team-a", "chat", created="2026-11-02T00:00:00Z"))
    assert catalog.resolve("chat").namespace == "team-b"
    assert catalog.resolve("team-a/chat").namespace == "team-a"
    assert catalog.resolve("team-b/chat").namespace == "team-b"
    assert [name for name, _ in catalog.listed()] == ["team-a/chat", "chat"]


def test_only_ready_pods_with_an_ip_that_are_not_going_take_requests():
    catalog = Catalog()
    catalog.set_model(md("ns", "chat"))
    catalog.set_pod(pod("ns", "a", "chat", ip="10.0.0.1"))
    catalog.set_pod(pod("ns", "b", "chat", ip="10.0.0.2", ready=False))
    catalog.set_pod(pod("ns", "c", "chat", ip=None))
    catalog.set_pod(pod("ns", "d", "chat", ip="10.0.0.4", deleting=True))
    catalog.set_pod(pod("ns", "e", "other", ip="10.0.0.5"))
    catalog.set_pod(pod("elsewhere", "f", "chat", ip="10.0.0.6"))
    assert catalog.endpoints(("ns", "chat")) == ["10.0.0.1:8000"]
    catalog.set_pod(pod("ns", "b", "chat", ip="10.0.0.2"))  # became ready
    assert catalog.endpoints(("ns", "chat")) == ["10.0.0.1:8000", "10.0.0.2:8000"]
    catalog.drop_pod("ns", "a")
    assert catalog.endpoints(("ns", "chat")) == ["10.0.0.2:8000"]
    assert endpoint_of(pod("ns", "x", "chat", ready=False)) == ("chat", None)


def test_a_fresh_list_replaces_only_the_namespace_it_covers():
    catalog = Catalog()
    catalog.set_model(md("a", "one"))
    catalog.set_model(md("b", "two"))
    catalog.set_pod(pod("a", "p1", "one"))
    catalog.set_pod(pod("b", "p2", "two", ip="10.0.0.2"))
    catalog.replace("a", mds=[], pods=[])  # namespace a emptied while the watch was down
    assert set(catalog.models) == {("b", "two")}
    assert catalog.endpoints(("a", "one")) == []
    assert catalog.endpoints(("b", "two")) == ["10.0.0.2:8000"]
    catalog.replace(None, mds=[md("c", "three")])
    assert set(catalog.models) == {("c", "three")}


def test_a_waiter_is_woken_by_its_model_becoming_ready():
    async def scenario() -> list[str]:
        catalog = Catalog()
        catalog.set_model(md("ns", "chat", replicas=0))
        changed = catalog.changed(("ns", "chat"))
        other = catalog.changed(("ns", "else"))
        catalog.set_pod(pod("ns", "a", "chat"))
        await asyncio.wait_for(changed.wait(), 1)
        assert not other.is_set()
        return catalog.endpoints(("ns", "chat"))

    assert asyncio.run(scenario()) == ["10.0.0.1:8000"]

"""Who answers to a model name when tenants try to take or block another's (names.py through
the catalog): exact served names with a `/`, namespaces named after organisations, duplicates
at zero, preferred namespaces and reserved names."""

import pytest

from kvpilot_common.errors import ModelNotFoundError
from kvpilot_gateway.catalog import Catalog
from kvpilot_gateway.names import Policy, parse_reservations
from tests.gateway.objects import md

EARLY, LATE = "2026-11-01T00:00:00Z", "2026-11-20T00:00:00Z"


def test_a_served_name_with_a_slash_is_found_until_the_namespace_it_spells_serves_the_rest():
    catalog = Catalog()
    catalog.set_model(md("team-a", "llama", served="meta-llama/Llama-3", created=EARLY))
    assert catalog.resolve("meta-llama/Llama-3").namespace == "team-a"
    assert catalog.resolve("team-a/meta-llama/Llama-3").namespace == "team-a"
    # A namespace is granted by the cluster's RBAC, a served name by nobody: the namespace
    # that the qualified reading names answers, though created later.
    catalog.set_model(md("meta-llama", "llama", served="Llama-3", created=LATE))
    assert catalog.resolve("meta-llama/Llama-3").key == ("meta-llama", "llama")
    assert catalog.resolve("team-a/meta-llama/Llama-3").namespace == "team-a"  # still reachable
    assert [name for name, _ in catalog.listed()] == ["Llama-3", "team-a/meta-llama/Llama-3"]


def test_a_reservation_keeps_an_organisation_named_namespace_from_its_qualified_spelling():
    catalog = Catalog(Policy(reserved=parse_reservations(["meta-llama/*=team-a"])))
    catalog.set_model(md("team-a", "llama", served="meta-llama/Llama-3", created=LATE))
    catalog.set_model(md("meta-llama", "grab", served="Llama-3", created=EARLY))
    assert catalog.resolve("meta-llama/Llama-3").key == ("team-a", "llama")
    assert catalog.resolve("Llama-3").namespace == "meta-llama"  # its own name it keeps
    assert [name for name, _ in catalog.listed()] == ["Llama-3", "meta-llama/Llama-3"]


@pytest.mark.parametrize("order", ["squatter first", "owner first"])
def test_a_served_name_spelling_another_namespace_cannot_take_its_qualified_traffic(order):
    catalog = Catalog()
    squat = md("evil", "squat", served="team-a/chat", created=EARLY)
    owner = md("team-a", "chat", created=LATE)
    for m in (squat, owner) if order == "squatter first" else (owner, squat):
        catalog.set_model(m)
    assert catalog.resolve("team-a/chat").key == ("team-a", "chat")
    assert catalog.resolve("evil/team-a/chat").key == ("evil", "squat")
    # Nor with an adapter of that name: the owner's namespace wins over it too.
    adapter = md("evil", "base", served="base", created=EARLY)
    adapter["spec"]["adapters"] = [{"name": "team-a/chat", "source": "local:///a"}]
    catalog.set_model(adapter)
    found = catalog.resolve("team-a/chat")
    assert (found.key, found.adapter) == (("team-a", "chat"), None)
    # Owner at zero and not waking: its clients learn why (503), the squatter gets nothing.
    catalog.set_model(md("team-a", "chat", replicas=0, autoscaling=False, created=LATE))
    assert catalog.resolve("team-a/chat").key == ("team-a", "chat")


def test_a_qualified_name_never_falls_back_to_another_namespace():
    catalog = Catalog()
    catalog.set_model(md("team-a", "chat"))
    for name in ("team-b/chat", "team-a/other", "/chat", "team-a/"):
        with pytest.raises(ModelNotFoundError, match="does not exist"):
            catalog.resolve(name)


def test_a_duplicate_at_zero_or_created_later_cannot_shadow_or_block_a_name():
    catalog = Catalog()
    catalog.set_model(md("team-a", "chat", created=LATE))
    # Older, but at zero with autoscaling off: it could only ever answer 503.
    catalog.set_model(md("old", "chat", replicas=0, autoscaling=False, created=EARLY))
    assert catalog.resolve("chat").namespace == "team-a"
    # Newer duplicates, at zero (waking) or serving, change nothing.
    catalog.set_model(md("x", "chat", replicas=0, created="2026-11-21T00:00:00Z"))
    catalog.set_model(md("y", "chat", replicas=3, created="2026-11-22T00:00:00Z"))
    assert catalog.resolve("chat").namespace == "team-a"
    assert catalog.resolve("y/chat").namespace == "y"
    # Alone, the model that cannot answer is still found: its client gets why (503), not 404.
    alone = Catalog()
    alone.set_model(md("old", "chat", replicas=0, autoscaling=False))
    assert alone.resolve("chat").namespace == "old"


def test_preferred_namespaces_win_in_their_order():
    catalog = Catalog(Policy(prefer=("prod", "staging")))
    catalog.set_model(md("dev", "chat", created=EARLY))
    catalog.set_model(md("staging", "chat", created=LATE))
    assert catalog.resolve("chat").namespace == "staging"
    catalog.set_model(md("prod", "chat", created=LATE))
    assert catalog.resolve("chat").namespace == "prod"


def test_a_reserved_name_is_served_only_from_its_namespaces():
    policy = Policy(reserved=parse_reservations(["meta-llama/*=team-a,team-b"]))
    catalog = Catalog(policy)
    catalog.set_model(md("evil", "grab", served="meta-llama/Llama-3", created=EARLY))
    with pytest.raises(ModelNotFoundError):
        catalog.resolve("meta-llama/Llama-3")
    assert catalog.listed() == []  # not listed either
    catalog.set_model(md("team-b", "llama", served="meta-llama/Llama-3", created=LATE))
    assert catalog.resolve("meta-llama/Llama-3").namespace == "team-b"
    catalog.set_model(md("evil", "other", served="free-name"))  # unreserved: anyone's
    assert catalog.resolve("free-name").namespace == "evil"


@pytest.mark.parametrize("value", ["meta-llama/*", "=team-a", "x=", "x=,"])
def test_a_malformed_reservation_is_refused(value):
    with pytest.raises(ValueError, match="PATTERN=NAMESPACE"):
        parse_reservations([value])


def test_many_random_names_resolve_quickly_enough_to_list():
    catalog = Catalog()
    for i in range(1500):
        catalog.set_model(md(f"ns-{i % 7}", f"m{i}", served=f"org/model-{i % 500}"))
    listed = catalog.listed()
    assert len(listed) == 1500
    assert len({name for name, _ in listed}) == 1500  # every one reachable by its own name
    for name, model in listed:
        assert catalog.resolve(name) is model

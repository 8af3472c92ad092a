"""peering.py's pure parts: each replica's priority (kopf pauses every peer of an equal one, so
they must differ; the oldest replica must win) and the peering objects it creates where."""

from lightkube import codecs

from kvpilot_operator import peering

SECOND = 1_000_000_000  # nanoseconds


def test_the_older_replica_has_the_higher_priority():
    started = 1_780_000_000 * SECOND
    older, newer = peering.priority(started, 999), peering.priority(started + 1_000, 0)
    assert older > newer  # a microsecond apart, whatever the random digits
    assert peering.priority(started + SECOND) < older


def test_replicas_starting_in_one_microsecond_still_differ():
    started = 1_780_000_000 * SECOND + 123_456
    assert peering.priority(started, 1) != peering.priority(started + 5, 2)
    found = {peering.priority() for _ in range(50)}
    assert all(p < 0 for p in found)  # below kopf's default 0 and --dev's 666: a developer's
    # operator started with `kopf run --dev` pauses the cluster's replicas, as kopf intends


def test_a_kopfpeering_per_watched_namespace_or_one_cluster_peering():
    assert peering.objects("ops", []) == [
        {"apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering", "metadata": {"name": "ops"}}
    ]
    found = peering.objects("ops", ["a", "b"])
    assert [(o["kind"], o["metadata"]["namespace"], o["metadata"]["name"]) for o in found] == [
        ("KopfPeering", "a", "ops"),
        ("KopfPeering", "b", "ops"),
    ]
    for obj in found:  # what ensure_peering() sends: lightkube knows the kind
        assert type(codecs.from_dict(obj)).__name__ == "KopfPeering"

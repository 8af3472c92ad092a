"""status.loadedAdapters is read from what a replica's own /metrics says: the server's series,
rendered by the server's code, parsed by the operator's."""

from prometheus_client import CollectorRegistry, generate_latest

from kvpilot_operator import crd
from kvpilot_operator.replica_adapters import converged, parse
from kvpilot_operator.spec import Spec
from kvpilot_server.api.adapter_metrics import collect_loaded
from kvpilot_server.engine.runtime.llm_engine import EngineStats
from kvpilot_server.engine.runtime.sequence import Priority


class _Loaded:
    def __init__(self, stats: EngineStats) -> None:
        self.stats = stats

    def collect(self):
        return collect_loaded("m", self.stats, 4)


def _text(adapters: tuple[str, ...]) -> str:
    none = {p: 0 for p in Priority}
    stats = EngineStats(none, none, 0.0, 0, 0, 0, adapters=adapters, adapters_running=adapters)
    registry = CollectorRegistry()
    registry.register(_Loaded(stats))
    return generate_latest(registry).decode()


def test_a_replicas_loaded_adapters_are_read_from_its_metrics():
    assert parse(_text(("b", "a"))) == ["a", "b"]
    assert parse(_text(())) == []


def test_converged_once_every_ready_replica_has_every_adapter_of_the_spec():
    body = crd.with_defaults(
        {
            "apiVersion": "kvpilot.dev/v1alpha1",
            "kind": "ModelDeployment",
            "metadata": {"name": "m", "namespace": "n"},
            "spec": {
                "model": {"source": "builtin://smollm2-135m-instruct"},
                "adapters": [{"name": "a", "source": "pvc://c/a"}],
            },
        }
    )
    spec = Spec.from_defaulted(body)
    assert converged(spec, [{"replica": "p1", "adapters": ["a", "x"]}])
    assert not converged(
        spec, [{"replica": "p1", "adapters": ["a"]}, {"replica": "p2", "adapters": []}]
    )

"""ModelDeployments and Pods as the gateway's watches deliver them, for the tests that feed a
Catalog by hand (test_catalog, test_names)."""


def md(
    namespace: str,
    name: str,
    served: str | None = None,
    replicas: int = 1,
    autoscaling: bool = True,
    created: str = "2026-11-01T00:00:00Z",
) -> dict:
    model = {"source": "builtin://smollm2-135m-instruct"}
    if served:
        model["servedModelName"] = served
    return {
        "metadata": {"namespace": namespace, "name": name, "creationTimestamp": created},
        "spec": {"model": model, "replicas": replicas, "autoscaling": {"enabled": autoscaling}},
    }


def pod(
    namespace: str,
    name: str,
    model: str,
    ip: str | None = "10.0.0.1",
    ready: bool = True,
    deleting: bool = False,
) -> dict:
    meta: dict = {
        "namespace": namespace,
        "name": name,
        "labels": {"app.kubernetes.io/instance": model},
    }
    if deleting:
        meta["deletionTimestamp"] = "2026-12-01T00:00:00Z"
    status: dict = {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
    if ip:
        status["podIP"] = ip
    ports = [{"name": "http", "containerPort": 8000}]
    return {"metadata": meta, "spec": {"containers": [{"ports": ports}]}, "status": status}

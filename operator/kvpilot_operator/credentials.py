"""Where the operator's kopf half finds the API server. In a pod: as client-go's
rest.InClusterConfig and lightkube (the operator's other client) find it, at the address
KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT give, with the ServiceAccount's token and CA.
kopf's own in-pod login names https://kubernetes.default.svc instead, which only cluster DNS
resolves: a cluster whose DNS is down, or has none, would leave the operator's watches unable
to connect while its lightkube writes worked. Outside a pod, or where KUBECONFIG is set: the
kubeconfig, as before."""

import dataclasses
from collections.abc import Mapping
from typing import Any

import kopf


def in_cluster_server(env: Mapping[str, str]) -> str | None:
    """https://host:port from the Service environment the kubelet gives every pod, or None
    outside one. An IPv6 cluster's address is bracketed."""
    host, port = env.get("KUBERNETES_SERVICE_HOST"), env.get("KUBERNETES_SERVICE_PORT")
    if not host or not port:
        return None
    return f"https://[{host}]:{port}" if ":" in host else f"https://{host}:{port}"


def connection(
    env: Mapping[str, str], settings: kopf.OperatorSettings, **kwargs: Any
) -> kopf.ConnectionInfo | None:
    """The kubeconfig's when KUBECONFIG names one (an explicit choice wins, as with kubectl),
    else the ServiceAccount's at the in-cluster address, else ~/.kube/config's."""
    server = in_cluster_server(env)
    if server is not None and not env.get("KUBECONFIG"):
        account = kopf.login_with_service_account(settings=settings, **kwargs)
        if account is not None:
            return dataclasses.replace(account, server=server)
    return kopf.login_with_kubeconfig(settings=settings, **kwargs)

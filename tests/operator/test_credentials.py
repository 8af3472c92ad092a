"""The operator's kopf half finds the API server in a pod as client-go does: at the address the
kubelet's Service environment gives (tests/e2e/ runs it in a pod, where cluster DNS is absent)."""

import kopf

from kvpilot_operator.credentials import connection, in_cluster_server


def test_the_in_cluster_address_comes_from_the_service_environment():
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    assert in_cluster_server(env) == "https://10.96.0.1:443"
    env = {"KUBERNETES_SERVICE_HOST": "fd00:10:96::1", "KUBERNETES_SERVICE_PORT": "6443"}
    assert in_cluster_server(env) == "https://[fd00:10:96::1]:6443"
    assert in_cluster_server({}) is None
    assert in_cluster_server({"KUBERNETES_SERVICE_HOST": "10.96.0.1"}) is None


def test_outside_a_pod_the_kubeconfig_is_used(tmp_path, monkeypatch):
    config = tmp_path / "kubeconfig"
    config.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: k, cluster: {server: 'https://127.0.0.1:6443'}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: k, user: u}}]\n"
    )
    monkeypatch.setenv("KUBECONFIG", str(config))
    service = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}
    # KUBECONFIG named: it wins even in a pod; not named and no ServiceAccount token on this
    # machine (not in a pod, whatever the environment says): the kubeconfig again.
    for env in ({**service, "KUBECONFIG": str(config)}, service):
        info = connection(env, settings=kopf.OperatorSettings())
        assert info is not None and info.server == "https://127.0.0.1:6443" and info.token == "t"

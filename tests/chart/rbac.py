"""The chart's RBAC as the API server's authorizer reads it: the grants a component's
ServiceAccount gets from the rendered Roles and bindings, and whether they allow a request.
test_chart_rbac holds the operator's to kvpilot_operator.permissions, test_chart_gateway the
gateway's."""

from dataclasses import dataclass

from kvpilot_testing.helm import component, of_kind, one

CLUSTER = None  # the scope of a cluster-scoped request, or of a request in every namespace
ELSEWHERE = "somebody-else"  # a namespace the operator does not watch


@dataclass(frozen=True)
class Grant:
    api_group: str
    resource: str
    verb: str
    namespace: str | None  # None: cluster-wide (cluster-scoped objects, or every namespace)


def granted(found: list[dict], part: str = "operator") -> set[Grant]:
    """What the bindings give the ServiceAccount of the operator's (or the gateway's) pod.
    Wildcards are kept as "*" (and would fail the exactness checks)."""
    deployment = one(component(found, part), "Deployment")
    account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    release_namespace = deployment["metadata"]["namespace"]
    roles = {
        (r["kind"], r["metadata"].get("namespace"), r["metadata"]["name"]): r["rules"]
        for r in of_kind(found, "Role") + of_kind(found, "ClusterRole")
    }
    grants = set()
    for binding in of_kind(found, "RoleBinding") + of_kind(found, "ClusterRoleBinding"):
        subject = {"kind": "ServiceAccount", "name": account, "namespace": release_namespace}
        if subject not in binding["subjects"]:
            continue
        where = binding["metadata"].get("namespace")  # None for a ClusterRoleBinding
        ref = binding["roleRef"]
        assert ref["apiGroup"] == "rbac.authorization.k8s.io"
        rules = roles[(ref["kind"], where if ref["kind"] == "Role" else None, ref["name"])]
        for rule in rules:
            assert not rule.get("resourceNames") and not rule.get("nonResourceURLs")
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        grants.add(Grant(group, resource, verb, where))
    return grants


def allows(grants: set[Grant], want: Grant) -> bool:
    """Whether `grants` let the ServiceAccount do `want`, as the authorizer decides."""
    for g in grants:
        if g.namespace not in (CLUSTER, want.namespace):
            continue
        if (
            g.api_group in ("*", want.api_group)
            and g.verb in ("*", want.verb)
            and g.resource in ("*", want.resource)
        ):
            return True
    return False

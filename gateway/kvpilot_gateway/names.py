"""Who answers to a model name. Pure: no I/O.

A request's `model` can be read two ways: as a served name (`meta-llama/Llama-3` is a name the
CRD allows, and Hugging Face's names look like it) and, when it holds a `/`, as
`namespace/served name` split at the first `/`. A tenant must not be able to take another's
traffic, nor make it unreachable, by spelling another namespace in a served name or by
deploying a duplicate. So:

1. a name the platform team reserved (`--reserve PATTERN=NAMESPACE,...`) counts only in the
   namespaces it was reserved for; in any other namespace it is not served at all. A pattern
   is matched against the name as the request spells it, so `meta-llama/*` also keeps a
   namespace called `meta-llama` from answering `meta-llama/Llama-3` with its `Llama-3`;
2. the qualified reading wins: when the namespace it names serves the rest, only that
   namespace's models are candidates. A served name costs nothing to choose, a namespace is
   granted by the cluster's RBAC, so the namespace is the stronger claim: a tenant serving
   `alpha/newmodel` from `beta` cannot take `alpha`'s traffic, whichever was created first;
   it stays reachable as `beta/alpha/newmodel`, and as `alpha/newmodel` only until `alpha`
   serves `newmodel`. Without a qualified candidate, every model serving the exact name is;
3. a candidate that can never answer (zero replicas and autoscaling off) drops out, so a
   duplicate left at zero cannot make a name unreachable;
4. candidates in the gateway's preferred namespaces (`--prefer-namespace`, in the order given)
   win over the rest;
5. of what remains, the oldest ModelDeployment keeps the name: one created later, ready or
   not, can neither take it nor make it ambiguous. The others stay reachable as
   `namespace/served name`.
"""

import fnmatch
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol


class Named(Protocol):
    namespace: str
    served: str
    replicas: int
    autoscaling: bool
    created: str  # metadata.creationTimestamp, RFC 3339 UTC: sorts as it reads
    name: str


@dataclass(frozen=True)
class Policy:
    # (pattern, namespaces allowed to serve names matching it), in the order given.
    reserved: tuple[tuple[str, frozenset[str]], ...] = ()
    prefer: tuple[str, ...] = ()

    def allowed(self, model: Named, spelled: str | None = None) -> bool:
        """May this namespace answer to this name, spelled as a request spells it (its served
        name unless told)? Names no reservation matches are open to all."""
        name = model.served if spelled is None else spelled
        owners = [ns for pattern, ns in self.reserved if fnmatch.fnmatchcase(name, pattern)]
        return not owners or any(model.namespace in ns for ns in owners)


def parse_reservations(values: Iterable[str]) -> tuple[tuple[str, frozenset[str]], ...]:
    """`PATTERN=NS1,NS2` each (fnmatch patterns: `meta-llama/*`); ValueError saying why."""
    out = []
    for value in values:
        pattern, sep, namespaces = value.partition("=")
        owners = frozenset(n.strip() for n in namespaces.split(",") if n.strip())
        if not sep or not pattern or not owners:
            raise ValueError(f"--reserve {value!r}: expected PATTERN=NAMESPACE[,NAMESPACE...]")
        out.append((pattern, owners))
    return tuple(out)


def readings(requested: str) -> tuple[str, tuple[str, str] | None]:
    """(as a served name, (namespace, served name) if it can be read as qualified)."""
    namespace, sep, served = requested.partition("/")
    return requested, ((namespace, served) if sep and namespace and served else None)


def candidates(requested: str, models: Iterable[Named], policy: Policy) -> list[Named]:
    """The models that may answer (rules 1 and 2): those of the qualified reading if there are
    any, else those serving the exact name."""
    exact, qualified = readings(requested)
    models = list(models)
    if qualified is not None:
        found = [
            m
            for m in models
            if (m.namespace, m.served) == qualified
            and policy.allowed(m)
            and policy.allowed(m, requested)
        ]
        if found:
            return found
    return [m for m in models if m.served == exact and policy.allowed(m)]


def owner(found: Sequence[Named], prefer: Sequence[str]) -> Named | None:
    """The one candidate that answers (rules 3 to 5); None when there is none. A lone model
    that cannot answer is still its name's owner: its clients learn why (503), not 404."""
    answering = [m for m in found if m.replicas > 0 or m.autoscaling] or list(found)
    if not answering:
        return None
    rank: Mapping[str, int] = {ns: i for i, ns in enumerate(prefer)}
    return min(
        answering,
        key=lambda m: (rank.get(m.namespace, len(rank)), m.created, m.namespace, m.name),
    )

"""Who answers to a model name. Pure: no I/O.

A request's `model` can be read two ways: as a served name (`meta-llama/Llama-3` is a name the
CRD allows, and Hugging Face's names look like it) and, when it holds a `/`, as
`namespace/served name` split at the first `/`. A tenant must not be able to take another's
traffic, nor make it unreachable, by naming a namespace after an organisation or by deploying
a duplicate. So every ModelDeployment either reading names is a candidate, and:

1. a name the platform team reserved (`--reserve PATTERN=NAMESPACE,...`) counts only in the
   namespaces it was reserved for; in any other namespace it is not served at all;
2. a candidate that can never answer (zero replicas and autoscaling off) drops out, so a
   duplicate left at zero cannot make a name unreachable;
3. candidates in the gateway's preferred namespaces (`--prefer-namespace`, in the order given)
   win over the rest;
4. of what remains, the oldest ModelDeployment keeps the name: one created later, ready or
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

    def allowed(self, model: Named) -> bool:
        """May this namespace serve this name? Names no reservation matches are open to all."""
        owners = [ns for pattern, ns in self.reserved if fnmatch.fnmatchcase(model.served, pattern)]
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
    """Every model one of the readings names and the policy lets serve (rule 1)."""
    exact, qualified = readings(requested)
    return [
        m
        for m in models
        if (m.served == exact or (qualified is not None and (m.namespace, m.served) == qualified))
        and policy.allowed(m)
    ]


def owner(found: Sequence[Named], prefer: Sequence[str]) -> Named | None:
    """The one candidate that answers (rules 2 to 4); None when there is none. A lone model
    that cannot answer is still its name's owner: its clients learn why (503), not 404."""
    answering = [m for m in found if m.replicas > 0 or m.autoscaling] or list(found)
    if not answering:
        return None
    rank: Mapping[str, int] = {ns: i for i, ns in enumerate(prefer)}
    return min(
        answering,
        key=lambda m: (rank.get(m.namespace, len(rank)), m.created, m.namespace, m.name),
    )

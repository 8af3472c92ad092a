"""Which replicas a LoRA adapter's request chooses among. Pure: no I/O.

A replica serves an adapter fastest when the adapter already sits in one of its engine's slots:
a replica without it must install it, evicting the one used least recently if no slot is free,
and a request for that one then waits or evicts in turn. So, as the Inference Gateway's LoRA
affinity does: the replicas that have it in a slot, else those with a free slot, else all of
them. A group whose least loaded replica would pass the balancer's load bound is passed over:
load comes before affinity, so one hot adapter cannot pile onto one replica. The balancer then
picks within the group as for any request.
"""

from collections.abc import Mapping, Sequence

from kvpilot_gateway.load import Load


def narrow(
    endpoints: Sequence[str],
    adapter: str,
    scraped: Mapping[str, Load | None],
    load: Mapping[str, float],
    bound: int,
) -> list[str]:
    def has_room(group: list[str]) -> bool:
        return bool(group) and min(load.get(e, 0.0) for e in group) + 1 <= bound

    def known(endpoint: str) -> Load | None:
        return scraped.get(endpoint)

    resident = [e for e in endpoints if (s := known(e)) is not None and adapter in s.adapters]
    if has_room(resident):
        return resident
    free = [e for e in endpoints if (s := known(e)) is not None and len(s.adapters) < s.slots]
    if has_room(free):
        return free
    return list(endpoints)

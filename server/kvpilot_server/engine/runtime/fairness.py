"""Token-fair admission: whose waiting sequence runs next, inside one priority class.

Tenants (API keys) are served by a virtual token counter, the VTC of "Fairness in Serving Large
Language Models" (Sheng et al., OSDI 2024): each tenant's counter grows by the tokens the
engine computes for it (prompt tokens when a sequence is admitted, each output token as it is
sampled, output weighted more since a decode step costs far more per token than prefill), and
divided by the tenant's weight. The next sequence admitted is the oldest of the tenant with the
least counter. A tenant that had nothing waiting is lifted, when a request of its arrives, to
the least counter of those waiting (or, when nobody waits, to the counter of the last tenant
admitted): idle time earns no credit to spend later in a burst, and a newcomer is not starved
by those who have been served for long. The order is work-conserving: whatever one tenant
leaves idle, any other may take.

Admission order alone would still leave a light tenant waiting for a heavy one's running
sequences to end when they fill the engine. So a tenant whose next sequence does not fit takes
a slot back from the tenant running the most sequences (when that one has been served at least
as much): the victim is preempted and recomputed later, mostly from the prefix cache, and a
light tenant starts about as soon as it would on an idle engine.

One tenant (no API keys, or one) is served in arrival order, as before fairness existed.
"""

import itertools
from collections import Counter, deque
from collections.abc import Iterator

from kvpilot_server.engine.runtime.sequence import Priority, Sequence, Tenant

# The paper's weights: an output token (a decode step for it) against a prompt token.
PROMPT_WEIGHT = 1.0
OUTPUT_WEIGHT = 2.0
_PRUNE_EVERY = 256  # arrivals between sweeps of idle tenants' counters


class WaitQueue:
    """The waiting sequences of every class, in one queue per tenant, and the tenants' counters.
    The scheduler owns it; everything here runs on the engine's thread."""

    def __init__(self) -> None:
        self.queues: dict[Priority, dict[str, deque[Sequence]]] = {p: {} for p in Priority}
        self.counters: dict[str, float] = {}
        self.live: dict[str, int] = {}  # each tenant's sequences, waiting or running
        self.last_admitted = 0.0  # the counter of the tenant admitted last
        self._arrivals = itertools.count(1)

    # -- membership -------------------------------------------------------------------------

    def arrive(self, seq: Sequence) -> None:
        """A new sequence, at the back of its tenant's queue."""
        name = seq.tenant.name
        if not self._waits(name):
            self.counters[name] = max(self.counters.get(name, 0.0), self.level())
        self.live[name] = self.live.get(name, 0) + 1
        self.queues[seq.priority].setdefault(name, deque()).append(seq)
        if next(self._arrivals) % _PRUNE_EVERY == 0:
            self._prune()

    def requeue(self, seq: Sequence) -> None:
        """A preempted sequence: first of its tenant's again."""
        self.queues[seq.priority].setdefault(seq.tenant.name, deque()).appendleft(seq)

    def admitted(self, seq: Sequence, computed_prompt_tokens: int) -> None:
        """seq leaves the queue to run; a first admission charges the prompt it computes."""
        self._drop(seq)
        if seq.num_preemptions == 0:
            self.charge(seq.tenant, computed_prompt_tokens * PROMPT_WEIGHT)
        self.last_admitted = self.counters[seq.tenant.name]

    def finished(self, seq: Sequence, waiting: bool) -> None:
        """seq leaves for good (finished or aborted), from the queue when `waiting`."""
        if waiting:
            self._drop(seq)
        name = seq.tenant.name
        if self.live.get(name, 0) > 1:
            self.live[name] -= 1
        else:
            self.live.pop(name, None)

    def charge(self, tenant: Tenant, tokens: float) -> None:
        self.counters[tenant.name] = self.counters.get(tenant.name, 0.0) + tokens / tenant.weight

    def sampled(self, seq: Sequence, tokens: int = 1) -> None:
        self.charge(seq.tenant, OUTPUT_WEIGHT * tokens)

    # -- order ------------------------------------------------------------------------------

    def __contains__(self, seq: Sequence) -> bool:
        return seq in self.queues[seq.priority].get(seq.tenant.name, ())

    def count(self, priority: Priority | None = None) -> int:
        classes = self.queues.values() if priority is None else [self.queues[priority]]
        return sum(len(q) for tenants in classes for q in tenants.values())

    def __iter__(self) -> Iterator[Sequence]:
        for tenants in self.queues.values():
            for queue in tenants.values():
                yield from queue

    def next(
        self, priority: Priority, passed: set[Sequence], running: Counter[str]
    ) -> Sequence | None:
        """The sequence to admit next in `priority`, leaving out those `passed` over in this
        step (they keep their place): the first of the tenant with the least counter; on a tie,
        of the one with fewer sequences of the class `running` (a newcomer is lifted to the
        level of those waiting: it goes first), then the earlier arrival."""
        best: tuple | None = None
        for name, queue in self.queues[priority].items():
            head = next((s for s in queue if s not in passed), None)
            if head is not None:
                key = (self.counters[name], running[name], head.sort_key(), head)
                best = key if best is None or key[:3] < best[:3] else best
        return best[-1] if best is not None else None

    def overserved(
        self, seq: Sequence, running: list[Sequence], exclude: set[Sequence]
    ) -> Sequence | None:
        """A running sequence to preempt so that `seq`, which does not fit, can run: the latest
        of the tenant holding the most running sequences, when that is more than seq's tenant
        would hold with seq and that tenant has been served at least as much. Sequences of
        other classes are not taken (the class rule is the scheduler's), nor those in `exclude`
        (admitted in this step). Tenants so converge on equal shares of the running
        sequences; none can take back what it gave up."""
        mine = seq.tenant.name
        held = Counter(s.tenant.name for s in running if s.priority == seq.priority)
        richest = max((n for n in held if n != mine), key=held.__getitem__, default=None)
        if richest is None or held[richest] <= held[mine] + 1:
            return None
        if self.counters[richest] < self.counters[mine]:
            return None
        same = [
            s
            for s in running
            if s.tenant.name == richest and s.priority == seq.priority and s not in exclude
        ]
        return max(same, key=Sequence.sort_key, default=None)

    def level(self) -> float:
        """What a tenant arriving now is lifted to."""
        waiting = [self.counters[name] for name in self._waiting_tenants()]
        return min(waiting) if waiting else self.last_admitted

    # -- inside -----------------------------------------------------------------------------

    def _waiting_tenants(self) -> set[str]:
        return {name for tenants in self.queues.values() for name, q in tenants.items() if q}

    def _waits(self, name: str) -> bool:
        return any(tenants.get(name) for tenants in self.queues.values())

    def _drop(self, seq: Sequence) -> None:
        tenants = self.queues[seq.priority]
        queue = tenants[seq.tenant.name]
        queue.remove(seq)
        if not queue:
            del tenants[seq.tenant.name]

    def _prune(self) -> None:
        """Forget the counters of tenants with nothing in the engine that the lift would raise
        to the level anyway: keeping them would change nothing, and tenants come and go."""
        level = self.level()
        for name in [n for n, c in self.counters.items() if n not in self.live and c <= level]:
            del self.counters[name]

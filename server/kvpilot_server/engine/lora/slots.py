"""Which adapters the engine knows, and which sit in its slots (rank 0, the engine thread).

An adapter is known by name once loaded (its files read and checked off the engine thread:
`load`, then `add` on it), and gets an id no other load ever gets: a sequence carries the id,
so an adapter unloaded and loaded again under the same name shares no prefix-cache block and
no slot with its earlier self. The slots (--max-loras) hold the adapters the running sequences
use: a waiting sequence is admitted once its adapter has a slot, taking an empty one or the one
used least recently of those no running sequence holds; if every slot is held, it waits.
Installing into a slot is a copy of small tensors. Under tensor parallelism the other ranks
install from the adapter's path when a step's plan says so (`take_installs`).
"""

import itertools
from collections import OrderedDict

from kvpilot_common.errors import AdapterError
from kvpilot_server.engine.lora import layers
from kvpilot_server.engine.lora.adapter import LoraAdapter

Install = tuple[int, int, str, str]  # (slot, adapter id, name, path): for the other ranks


class LoraSlots:
    def __init__(self, wrapped: layers.Wrapped, state: layers.LoraState, count: int) -> None:
        self.wrapped, self.state = wrapped, state
        self.names: dict[str, int] = {}  # name -> id of the adapter serving it now
        self.adapters: dict[int, LoraAdapter] = {}  # every id a name or a sequence still uses
        self.users: dict[int, int] = {}  # sequences (not finished) per id
        self.holder: list[int | None] = [None] * count  # slot -> id
        self.pins = [0] * count  # running sequences per slot
        self.recent: OrderedDict[int, None] = OrderedDict((s, None) for s in range(count))
        self.installs: list[Install] = []
        self._ids = itertools.count(1)

    # -- names ---------------------------------------------------------------------------------

    def add(self, adapter: LoraAdapter) -> None:
        if adapter.name in self.names:
            raise AdapterError(f"an adapter named {adapter.name!r} is already loaded")
        adapter_id = next(self._ids)
        self.names[adapter.name] = adapter_id
        self.adapters[adapter_id] = adapter
        self.users[adapter_id] = 0

    def remove(self, name: str) -> None:
        """New requests can no longer name it; those already admitted finish with it."""
        adapter_id = self.names.pop(name, None)
        if adapter_id is None:
            raise AdapterError(f"no adapter named {name!r} is loaded")
        self._drop_if_unused(adapter_id)

    def known(self) -> list[str]:
        return sorted(self.names)

    def resident(self) -> list[str]:
        """Names whose adapter sits in a slot now."""
        ids = {i for i in self.holder if i is not None}
        return sorted(name for name, i in self.names.items() if i in ids)

    # -- sequences -----------------------------------------------------------------------------

    def use(self, name: str) -> int:
        """The id a new sequence for `name` carries (its count of users taken)."""
        adapter_id = self.names.get(name)
        if adapter_id is None:
            raise AdapterError(f"no adapter named {name!r} is loaded")
        self.users[adapter_id] += 1
        return adapter_id

    def done(self, adapter_id: int) -> None:
        """A sequence that used `adapter_id` is finished."""
        self.users[adapter_id] -= 1
        self._drop_if_unused(adapter_id)

    def acquire(self, adapter_id: int) -> bool:
        """Pin a slot holding the adapter for one more running sequence, installing it into a
        free slot first if need be; False when every slot is pinned by other adapters."""
        slot = self.slot_of(adapter_id)
        if slot is None:
            free = [s for s in self.recent if self.pins[s] == 0]
            if not free:
                return False
            empty = [s for s in free if self.holder[s] is None]
            slot = (empty or free)[0]
            adapter = self.adapters[adapter_id]
            layers.install(self.wrapped, slot, adapter)
            self.holder[slot] = adapter_id
            self.installs.append((slot, adapter_id, adapter.name, adapter.path))
        self.pins[slot] += 1
        self.recent.move_to_end(slot)
        return True

    def available(self, adapter_id: int) -> bool:
        """Whether acquire() would succeed now (nothing changes)."""
        return self.slot_of(adapter_id) is not None or any(self.pins[s] == 0 for s in self.recent)

    def release(self, adapter_id: int) -> None:
        """One running sequence of the adapter stopped running (finished or preempted)."""
        slot = self.slot_of(adapter_id)
        assert slot is not None and self.pins[slot] > 0
        self.pins[slot] -= 1

    def slot_of(self, adapter_id: int) -> int | None:
        try:
            return self.holder.index(adapter_id)
        except ValueError:
            return None

    def take_installs(self) -> list[Install]:
        taken, self.installs = self.installs, []
        return taken

    def _drop_if_unused(self, adapter_id: int) -> None:
        if self.users[adapter_id] or adapter_id in self.names.values():
            return
        del self.users[adapter_id], self.adapters[adapter_id]
        slot = self.slot_of(adapter_id)
        if slot is not None:  # unpinned: nothing runs it; the slot is free for the next
            self.holder[slot] = None
            self.recent.move_to_end(slot, last=False)

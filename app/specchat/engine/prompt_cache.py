"""Several conversations' caches at once: the nearest is reused, the least
recently used dropped first, within a memory budget.

The target's cache (kv.CacheSlot) holds one conversation's prefix, and so
does each drafter that keeps one (the draft model's cache, a head's rows).
An agent and its sub-agent, or two editor windows, alternate requests:
with one cache each request's prompt read from nearly zero again. So when a
request starts, the engine asks ``PromptCache.nearest`` for the stored
conversation sharing the longest prefix with its prompt; if that beats
what the caches hold now, the current conversation is put aside (each
holder's state moved out, nothing copied: ``CacheSlot.take``,
``Drafter.save``) and the stored one moved in; then the request reuses its
prefix exactly as it would have its own (``CacheSlot.sync_to`` trims, or
for a cache that cannot drop positions goes back to where that prompt
ended). Greedy output cannot change: a cache holds what the model computed
for those ids, whichever conversation it was put aside with.

Why not mlx-lm's ``LRUPromptCache``: it stores a list of cache layers and
hands out deep copies (the stored one stays for the next request), so the
conversation in use is held twice, and it knows nothing of what a drafter
holds with it. Here a conversation is in exactly one place, and its
drafters' state travels with it. A budget of 0 keeps none aside: one
conversation at a time, as before.

No MLX, not even imported (the command line reads its default): what is
moved are the holders' own objects, and their sizes come from them
(``nbytes``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from specchat import values

if TYPE_CHECKING:
    from specchat.engine.kv import SlotState

GB = values.GB
DEFAULT_BYTES = int(values.PROMPT_CACHE_GB * GB)


@dataclass
class Conversation:
    """One conversation put aside: the ids its target cache holds, the
    target cache's state and each drafter's, by the engine's key."""

    ids: list[int]
    target: SlotState
    drafters: dict[str, object] = field(default_factory=dict)  # key -> drafters.Saved | None
    nbytes: int = 0


@dataclass(frozen=True)
class CacheUse:
    """How the cache stands, for a settings pane or a log line."""

    budget: int  # bytes the conversations put aside may hold
    held: int  # bytes they hold
    conversations: int  # put aside (the one in use not counted)
    switches: int  # times a request took a conversation back


class PromptCache:
    """The conversations put aside, least recently used first."""

    def __init__(self, budget: int = DEFAULT_BYTES):
        self.budget = max(0, int(budget))
        self._aside: list[Conversation] = []
        self.switches = 0

    def nearest(self, prompt: list[int], current: int) -> Conversation | None:
        """The conversation put aside sharing more of ``prompt`` than the
        ``current`` prefix the caches hold now (the longest such), taken
        out; None if none does better."""
        best, best_n = None, current
        for conv in self._aside:
            n = common_prefix(conv.ids, prompt)
            if n > best_n:
                best, best_n = conv, n
        if best is not None:
            self._aside.remove(best)
            self.switches += 1
        return best

    def put_aside(self, conv: Conversation) -> list[Conversation]:
        """Keep ``conv`` (most recently used), then drop the least recently
        used until the budget holds: those dropped, for their holders to free."""
        dropped = []
        if conv.ids:
            self._aside.append(conv)
        else:
            dropped.append(conv)
        while self._aside and self.held > self.budget:
            dropped.append(self._aside.pop(0))
        return dropped

    def resize(self, budget: int) -> list[Conversation]:
        """A new budget; the conversations that no longer fit, dropped."""
        self.budget = max(0, int(budget))
        dropped = []
        while self._aside and self.held > self.budget:
            dropped.append(self._aside.pop(0))
        return dropped

    def clear(self) -> None:
        """Drop every conversation (the models they were computed by unload)."""
        self._aside.clear()

    @property
    def held(self) -> int:
        return sum(c.nbytes for c in self._aside)

    def use(self) -> CacheUse:
        return CacheUse(self.budget, self.held, len(self._aside), self.switches)


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many ids ``a`` and ``b`` share from their start."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i

"""Finding stop strings in a reply as it streams: one Aho-Corasick automaton.

Checking each stop string on its own at every token (``text.find(s)`` and
a tail comparison per stop string) costs in proportion to how many there
are: a request with 400,000 of them held the one engine thread for 79 s
(issue 47). The automaton is built once per request from all of them (linear
in their total length, which ``specchat.values`` bounds) and then reads
each new character once, whatever their number:

- its state is the longest tail of the text read so far that is a prefix
  of some stop string: the text a stream must hold back, since the next
  characters may complete a stop string (while nothing has matched, that
  prefix is a proper one: a whole stop string would be a match);
- a state that ends a stop string (itself, or through its dictionary
  suffix) is a match: the first one reached is the earliest end of any
  stop string, and of those ending there the longest, so the text is cut
  where the first stop string that completes begins.

Pure Python, no MLX: the text streams a few characters a step, and a step
of the automaton is a dictionary lookup or two (a failure link taken is
paid for by the characters that went down the tree, so reading n
characters takes at most 2n lookups).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable


class StopMatcher:
    """An automaton over ``stops`` (empty strings are ignored) and the state
    it has reached on the text ``feed`` has given it."""

    def __init__(self, stops: Iterable[str]):
        self._next: list[dict[str, int]] = [{}]  # the tree's edges, from each node
        self._depth = [0]  # characters from the root: the length of the prefix a node is
        whole = set()  # the nodes a stop string ends at
        for stop in stops:
            node = 0
            for ch in stop:
                child = self._next[node].get(ch)
                if child is None:
                    child = len(self._next)
                    self._next[node][ch] = child
                    self._next.append({})
                    self._depth.append(self._depth[node] + 1)
                node = child
            if node:
                whole.add(node)
        self._fail, self._match = self._links(whole)
        self.state = 0

    def _links(self, whole: set[int]) -> tuple[list[int], list[int]]:
        """Each node's failure link (the node of its longest proper suffix
        in the tree) and the length of the longest stop string ending at
        it, itself or a suffix (0: none); breadth first, so a node's links
        are known before its children's."""
        fail = [0] * len(self._next)
        match = [self._depth[n] if n in whole else 0 for n in range(len(self._next))]
        queue = deque(self._next[0].values())  # the root's children fail to the root
        while queue:
            node = queue.popleft()
            match[node] = match[node] or match[fail[node]]
            for ch, child in self._next[node].items():
                f = fail[node]
                while f and ch not in self._next[f]:
                    f = fail[f]
                fail[child] = self._next[f].get(ch, 0)
                queue.append(child)
        return fail, match

    @property
    def held(self) -> int:
        """The length of the longest tail of the text so far that is a
        prefix of a stop string (a proper one while nothing has matched)."""
        return self._depth[self.state]

    def feed(self, text: str, start: int = 0) -> tuple[int, int] | None:
        """Read ``text[start:]``; at the first stop string it completes,
        stop reading and return (where that stop string ends in ``text``,
        its length: the longest one ending there); None if none did."""
        nxt, fail, match = self._next, self._fail, self._match
        state = self.state
        for i in range(start, len(text)):
            ch = text[i]
            while state and ch not in nxt[state]:
                state = fail[state]
            state = nxt[state].get(ch, 0)
            if match[state]:
                self.state = state
                return i + 1, match[state]
        self.state = state
        return None

"""DATA frames made once per chunk and shared by the subscribers at the same position.

Subscribers of a topic that keep up are all at the same position: every append wakes them
together and each fetches the same chunk. The first one turns the chunk into DATA frames
(:func:`protocols.translate.data_frames`); the others find the frames here and neither read
the chunk nor convert it again. A chunk is named by where it starts and how long it is: the
log is append-only, so that names the same bytes for as long as they are served.
"""

from __future__ import annotations

from collections import OrderedDict

from protocols.translate import DataFrames

#: ``(figg topic, tank topic, partition, requested seq, base seq, chunk length)``
ChunkKey = tuple[bytes, str, int, int, int | None, int]


class DataFrameCache:
    """The DATA frames of recent chunks, within ``budget`` bytes (least recently used go)."""

    def __init__(self, budget: int) -> None:
        if budget < 0:
            raise ValueError("the DATA frame cache budget can not be negative")
        self.budget = budget
        #: Bytes of frames held.
        self.size = 0
        self.hits = 0
        self.misses = 0
        self._entries: OrderedDict[ChunkKey, DataFrames] = OrderedDict()

    def get(self, key: ChunkKey) -> DataFrames | None:
        """The frames made for ``key``, or None."""
        found = self._entries.get(key)
        if found is None:
            self.misses += 1
            return None
        self.hits += 1
        self._entries.move_to_end(key)
        return found

    def put(self, key: ChunkKey, frames: DataFrames) -> None:
        """Keep ``frames`` for the next subscriber that asks for ``key``."""
        size = len(frames.frames)
        if size > self.budget // 4 or key in self._entries:
            return
        self._entries[key] = frames
        self.size += size
        while self.size > self.budget:
            _, old = self._entries.popitem(last=False)
            self.size -= len(old.frames)

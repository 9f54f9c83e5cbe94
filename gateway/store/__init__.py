"""The embedded log store: durable, append-only topics and partitions in Tank's on-disk layout.

Opening::

    async with open_store(data_dir, StoreSettings(durability="fsync")) as store:
        await store.create_topic("events", partitions=4, config_text="log.retention.secs=7d")
        p = store.partition("events", 0)

Layout (``../shared/notes/protocol-facts.md``, "On-disk layout of the real broker"):
``<data>/<topic>/<partition>/`` holds ``<base>_<ts>.log`` (the active segment),
``<base>-<last>_<ts>.ilog`` (rolled segments), ``<base>.index`` (``u32 relSeq | u32
fileOffset`` entries) and an optional ``config``; ``<data>/<topic>/config`` applies to
every partition. A segment is a run of ``varint len | bundle``, byte-identical to a
Tank Consume chunk, so a data directory is readable by the Tank broker and back.
A partition that stored idempotent Kafka producers' batches also holds
``.kafka-producers``, their sequence state (:mod:`gateway.store.producers`): an append
entry ``(bundle, base_seq, info, producer)`` writes its record with the bundle, synced in
the same round; ``Partition.stored_producer(pid)`` reads it back.

Store API, see :class:`LogStore`: ``open_store(data_dir, settings)`` (async context
manager; recovers every partition in a worker thread, runs fsync rounds and the periodic
maintenance in its own nursery), ``topics()``, ``topic(name)``, ``partition(topic, i)``
(:class:`UnknownTopic` / :class:`UnknownPartition`), ``await create_topic(name,
partitions, config_text)`` (atomic; :class:`TopicExists`, :class:`InvalidTopicName`,
:class:`InvalidConfig` (also a value below ``StoreSettings.config_bounds``),
:class:`LimitReached` (``max_topics``, ``max_partitions``, descriptors: refused before
anything is built); waits for a creation of the same topic under way),
``await reload_config(topic, i)`` (Tank's ReloadConf), ``await maintain()``.
Rolled segments open their files on demand, at most ``StoreSettings.max_open_segments``
at once (:mod:`gateway.store.files`).

Partition API (what the listeners use), see :class:`Partition`:

- ``first_available`` / ``high_water_mark``: bounds of what readers may see. Sequence
  numbers start at 1. A partition that never held a message reports ``(0, 0)``, as
  Tank's DiscoverPartitions does; one whose messages were all removed by retention
  reports ``(hwm + 1, hwm)`` (Tank's "base of the oldest segment" rule).
- ``await append(bundle, base_seq=None) -> AppendResult(first_seq, last_seq, size)``:
  validated first; durable per the durability mode when it returns. Errors:
  :class:`InvalidSequence` (Tank code 10), :class:`InvalidBundle`,
  :class:`BundleTooLarge`, :class:`StoreIOError` (code 2; its ``kind``: ``no_space``,
  ``read_only``, ``io_error``; :class:`DiskFull` when the free-space floor refused it),
  :class:`StoreClosed`.
  A plain bundle appended with a ``base_seq`` that leaves a gap is stored as a sparse
  bundle (its sequence numbers must be recoverable from the segment bytes).
- ``read(seq, fetch_size) -> ReadResult``: a file range of whole bundles, starting at
  the bundle that holds ``seq``, past ``max(fetch_size, 32)`` bytes to a bundle
  boundary, within one segment; 0 = first available, ``UINT64_MAX`` = tail. An empty
  result (``at_tail``) means "wait"; a sequence outside ``[first_available, hwm + 1]``
  raises :class:`OutOfRange`. The result holds a reference to the segment's one shared
  descriptor (no descriptor per read: ``fileno()``, ``sendfile_source()``,
  ``read_bytes()``) and must be closed (``with``); it also
  carries ``base_seq``, ``first_bundle_sparse`` (Tank's 0xfe flag), ``next_seq``,
  ``high_water_mark`` and ``first_available``.
- ``await wait_for(seq, deadline) -> bool``: park until ``high_water_mark >= seq`` or
  the trio clock reaches ``deadline``; woken right after the append becomes visible.
  ``await wait_changed()`` parks until the next visible append; ``add_waiter(event)`` sets
  an event then instead (one event waits on many partitions).
- ``appended_bytes``: framed bytes made visible so far (Tank's ``minBytes``).
- Damage (:mod:`gateway.store.damage`): a rolled segment is checked the first time it
  is read (or at open, ``StoreSettings.check_rolled_segments="startup"``); ``read`` skips
  what is damaged (a ``data_loss`` log line per region, ``on_data_loss`` called) and
  raises :class:`SegmentCheckPending` while a big segment is checked in a worker
  thread: ``await wait_checks()``, then read again.

Durability (``StoreSettings.durability``): ``"fsync"`` acknowledges after a group-commit
fsync in a worker thread (readers and waiters see a bundle only then); ``"os"`` after
``write()``, with Tank's ``flush.messages`` / ``flush.secs`` triggering background fsyncs.
"""

from gateway.store.config import CONFIG_KEYS, NO_BOUNDS, ConfigBounds, TopicConfig, parse_config
from gateway.store.durability import Durability
from gateway.store.errors import (
    BundleTooLarge,
    DiskFull,
    InvalidBundle,
    InvalidConfig,
    InvalidSequence,
    InvalidTopicName,
    LimitReached,
    OutOfRange,
    SegmentCheckPending,
    StoreClosed,
    StoreError,
    StoreIOError,
    TopicExists,
    UnknownPartition,
    UnknownTopic,
)
from gateway.store.names import MAX_PARTITIONS, is_valid_topic_name, validate_topic_name
from gateway.store.partition import Partition
from gateway.store.results import AppendResult, ReadResult
from gateway.store.store import LogStore, StoreSettings, Topic, open_store

__all__ = [
    "CONFIG_KEYS",
    "MAX_PARTITIONS",
    "NO_BOUNDS",
    "AppendResult",
    "BundleTooLarge",
    "ConfigBounds",
    "DiskFull",
    "Durability",
    "InvalidBundle",
    "InvalidConfig",
    "InvalidSequence",
    "InvalidTopicName",
    "LimitReached",
    "LogStore",
    "OutOfRange",
    "Partition",
    "ReadResult",
    "SegmentCheckPending",
    "StoreClosed",
    "StoreError",
    "StoreIOError",
    "StoreSettings",
    "Topic",
    "TopicConfig",
    "TopicExists",
    "UnknownPartition",
    "UnknownTopic",
    "is_valid_topic_name",
    "open_store",
    "parse_config",
    "validate_topic_name",
]

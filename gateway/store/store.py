"""The log store: topics and partitions under one data directory, in Tank's layout."""

from __future__ import annotations

import math
import os
import shutil
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Final

import structlog
import trio

from gateway.store.config import MIB, ConfigBounds, TopicConfig, parse_config_leniently
from gateway.store.descriptors import DescriptorBudget
from gateway.store.disk import LOOK_EVERY_SECS, DiskGuard
from gateway.store.durability import Durability, sync_directory
from gateway.store.errors import (
    InvalidConfig,
    LimitReached,
    StoreClosed,
    StoreError,
    StoreIOError,
    TopicExists,
    UnknownPartition,
    UnknownTopic,
)
from gateway.store.files import OpenFiles
from gateway.store.names import is_valid_topic_name, validate_partition_count, validate_topic_name
from gateway.store.partition import Partition, PartitionEnv
from gateway.store.producers import ProducerBudget
from gateway.store.syncer import open_syncer
from gateway.store.tail import TailCache
from protocols.tank.bundle import MAX_BUNDLE_SIZE

log = structlog.get_logger("gateway.store")

CONFIG_FILE: Final = "config"
#: What creating a directory is taken to cost on disk (a block), for the floor.
_DIRECTORY_BYTES: Final = 4096
#: Damage checks of rolled segments running at once (worker threads).
CHECK_THREADS: Final = 2


@dataclass(frozen=True, slots=True)
class StoreSettings:
    """How the store behaves; one frozen object, built from the gateway's configuration."""

    #: "fsync" (default): acknowledge an append after its fsync (group commit).
    #: "os": acknowledge after write(), like the Tank broker.
    durability: str = "fsync"
    #: Appends of larger bundles are refused (BundleTooLarge).
    max_bundle_size: int = 64 * MIB
    #: Partitions of a topic created without a count (auto-created topics).
    default_partitions: int = 1
    #: Config of every topic before its own ``config`` files apply.
    topic_defaults: TopicConfig = field(default_factory=TopicConfig)
    #: Seconds between maintenance passes (retention, rolling by age, flush.secs).
    maintenance_interval: float = 1.0
    #: At open, the last this-many bytes of each active segment are validated message
    #: by message (the rest of it bundle header by bundle header).
    recovery_check_bytes: int = 64 * MIB
    #: Worker threads for fsyncs at a time (across all partitions).
    sync_threads: int = 8
    #: Bytes of the newest bundles (of all partitions) kept in memory for tail readers.
    tail_cache_bytes: int = 16 * MIB
    #: Rolled segment files open at once (least recently read closed first; a read in
    #: flight keeps its file open).
    max_open_segments: int = 1000
    #: Minimums of the config values clients and operators set (CreateTopic's config
    #: text, ``config`` files); ``topic_defaults`` is taken as given.
    config_bounds: ConfigBounds = field(default_factory=ConfigBounds)
    #: Topics the store holds at most; creating more raises :class:`LimitReached`.
    max_topics: int = 10_000
    #: Partitions of all topics together at most.
    max_partitions: int = 20_000
    #: A creation that would leave fewer descriptors than this free (under the soft
    #: RLIMIT_NOFILE) is refused (0: no check).
    descriptor_reserve: int = 128
    #: Descriptors others may want beside the partitions' (rolled segment files,
    #: connections): creation also keeps these free, up to half the limit, and raises the
    #: soft RLIMIT_NOFILE towards the hard one when it can (``raise_descriptor_limit``).
    descriptor_allowance: int = 0
    raise_descriptor_limit: bool = False
    #: When rolled segments are checked for damage: "lazy" (the first time each is
    #: read) or "startup" (all of them while the store opens).
    check_rolled_segments: str = "lazy"
    #: A lazy check of a rolled segment up to this size runs in the reader's call; a
    #: bigger one in a worker thread (the event loop goes on meanwhile).
    inline_check_bytes: int = 64 * 1024
    #: Idempotent Kafka producers remembered durably, across all partitions (each
    #: partition's ``.kafka-producers``; :mod:`gateway.store.producers`).
    max_producer_states: int = 20_000
    #: The floor of free space kept on the data directory's filesystem: the smaller of
    #: these bytes and this percentage of its size; a write that would leave less free is
    #: refused with :class:`DiskFull` (0: no floor). See :mod:`gateway.store.disk`.
    min_free_bytes: int = 256 * MIB
    min_free_percent: float = 5.0
    #: Zeros written ahead of all active segments together at most (``fsync``
    #: durability; 0: none).
    max_prefill_bytes: int = 128 * MIB
    #: Seconds between looks at the disk (free space; a probe after a fault).
    disk_check_interval: float = LOOK_EVERY_SECS

    def __post_init__(self) -> None:
        Durability(self.durability)  # raises ValueError for anything else
        if self.check_rolled_segments not in ("lazy", "startup"):
            raise ValueError("check_rolled_segments must be 'lazy' or 'startup'")
        if not 0 < self.max_bundle_size <= MAX_BUNDLE_SIZE:
            raise ValueError(f"max_bundle_size must be 1..{MAX_BUNDLE_SIZE}")
        validate_partition_count(self.default_partitions)
        if self.max_open_segments < 1:
            raise ValueError("max_open_segments must be at least 1")
        if self.max_topics < 1 or self.max_partitions < 1:
            raise ValueError("max_topics and max_partitions must be at least 1")
        if self.max_producer_states < 1:
            raise ValueError("max_producer_states must be at least 1")
        if self.min_free_bytes < 0 or self.max_prefill_bytes < 0:
            raise ValueError("min_free_bytes and max_prefill_bytes must be at least 0")
        if not 0 <= self.min_free_percent <= 100:
            raise ValueError("min_free_percent must be 0..100")


class Topic:
    """A topic: its partitions (``0..n-1``) and its config."""

    def __init__(self, name: str, directory: str, config: TopicConfig,
                 partitions: list[Partition]) -> None:
        self.name = name
        self.directory = directory
        self.config = config
        self.partitions = partitions

    def __repr__(self) -> str:
        return f"<Topic {self.name} partitions={len(self.partitions)}>"

    def partition(self, index: int) -> Partition:
        """Partition ``index``, or :class:`UnknownPartition`."""
        if not 0 <= index < len(self.partitions):
            raise UnknownPartition(f"topic {self.name} has no partition {index}")
        return self.partitions[index]


class LogStore:
    """All topics of a data directory. Open it with :func:`open_store`."""

    def __init__(self, data_dir: str, settings: StoreSettings,
                 clock: Callable[[], float],
                 observe_fsync: Callable[[float], None] | None = None,
                 on_data_loss: Callable[[int, int], None] | None = None,
                 on_producer_evicted: Callable[[], None] | None = None,
                 on_write_failure: Callable[[str], None] | None = None) -> None:
        self.data_dir = data_dir
        self.settings = settings
        self._clock = clock
        self._topics: dict[str, Topic] = {}
        self._creating: dict[str, trio.Event] = {}
        #: Partitions of all topics, those being created included.
        self._partitions = 0
        self._descriptors = DescriptorBudget(
            settings.descriptor_reserve, allowance=settings.descriptor_allowance,
            may_raise=settings.raise_descriptor_limit)
        self._nursery: trio.Nursery | None = None
        self._limiter = trio.CapacityLimiter(settings.sync_threads)
        self._syncer = open_syncer(settings.sync_threads)
        #: The newest bundles of every partition, for the readers at the tail.
        self.tail_cache = TailCache(settings.tail_cache_bytes)
        #: The rolled segment files open now, within ``settings.max_open_segments``.
        self.open_files = OpenFiles(settings.max_open_segments)
        self._closed = False
        #: Idempotent producers remembered by every partition together.
        self.producers = ProducerBudget(settings.max_producer_states, on_producer_evicted)
        #: The data directory's disk: free space, the floor, prefill, write faults.
        self.disk = DiskGuard(data_dir, min_free_bytes=settings.min_free_bytes,
                              min_free_percent=settings.min_free_percent,
                              max_prefill_bytes=settings.max_prefill_bytes,
                              on_failure=on_write_failure)
        self.disk.reclaim = self._hand_back_zeros
        self._env = PartitionEnv(
            durability=Durability(settings.durability),
            max_bundle_size=settings.max_bundle_size,
            recovery_check_bytes=settings.recovery_check_bytes,
            spawn=self.spawn,
            limiter=self._limiter,
            check_limiter=trio.CapacityLimiter(CHECK_THREADS),
            syncer=self._syncer,
            tail=self.tail_cache,
            files=self.open_files,
            clock=clock,
            observe_fsync=observe_fsync,
            check_rolled=settings.check_rolled_segments,
            inline_check_bytes=settings.inline_check_bytes,
            on_data_loss=on_data_loss,
            producers=self.producers,
            disk=self.disk,
        )

    # -- opening --------------------------------------------------------------------------------

    def spawn(self, fn: Callable[..., Awaitable[object]], *args: object) -> None:
        """Run ``fn(*args)`` as a task of the store (it must outlive its callers)."""
        if self._nursery is None:
            raise StoreClosed("the store is not running (use open_store)")
        self._nursery.start_soon(fn, *args)

    def _load(self) -> None:
        """Scan the data directory and open every topic. Blocking."""
        os.makedirs(self.data_dir, exist_ok=True)
        self.disk.look()
        for name in sorted(os.listdir(self.data_dir)):
            path = os.path.join(self.data_dir, name)
            if name.startswith("."):
                if os.path.isdir(path) and not os.path.islink(path):
                    # A topic whose creation never finished (built as .<topic>, then renamed).
                    shutil.rmtree(path, ignore_errors=True)
                    log.warning("stray_directory_removed", directory=name)
                continue
            if not os.path.isdir(path):
                continue
            if not is_valid_topic_name(name):
                log.warning("invalid_topic_directory_ignored", directory=name)
                continue
            topic = self._topics[name] = self._load_topic(name, path)
            self._partitions += len(topic.partitions)

    def _load_topic(self, name: str, path: str) -> Topic:
        config = self._read_config(self.settings.topic_defaults, path, name)
        ids = sorted(int(e) for e in os.listdir(path)
                     if e.isdigit() and os.path.isdir(os.path.join(path, e)))
        count = (ids[-1] + 1) if ids else 0
        if ids != list(range(count)):
            log.warning("partition_directories_missing", topic=name,
                        found=len(ids), expected=count)
        partitions = []
        try:
            for i in range(count):
                pdir = os.path.join(path, str(i))
                os.makedirs(pdir, exist_ok=True)
                pconfig = self._read_config(config, pdir, name, i)
                partition = Partition(name, i, pdir, pconfig, self._env)
                partitions.append(partition)
                partition.load()
        except BaseException:
            for partition in partitions:
                partition.close_now()
            raise
        return Topic(name, path, config, partitions)

    def _read_config(self, base: TopicConfig, directory: str, topic: str,
                     partition: int | None = None, *, strict: bool = False) -> TopicConfig:
        try:
            with open(os.path.join(directory, CONFIG_FILE), encoding="utf-8") as f:
                text = f.read()
        except FileNotFoundError:
            return base
        try:
            return base.with_text(text, self.settings.config_bounds)
        except InvalidConfig:
            if strict:
                raise
        # A file on disk (perhaps valid before the minimums): keep every good key (its
        # retention above all), raise a value below its minimum to it, leave out the rest.
        values, problems = parse_config_leniently(text)
        values, raised = self.settings.config_bounds.clamp(values)
        log.error("config_partly_ignored", topic=topic, partition=partition,
                  ignored=problems, raised_to_minimum=raised)
        return base.with_values(values)

    def _attach(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery

    # -- topics ---------------------------------------------------------------------------------

    def topics(self) -> list[str]:
        """Names of all topics, sorted."""
        return sorted(self._topics)

    @property
    def topic_count(self) -> int:
        """Topics held (those being created included)."""
        return len(self._topics) + len(self._creating)

    @property
    def partition_count(self) -> int:
        """Partitions of all topics (those being created included)."""
        return self._partitions

    def _unopened_partitions(self) -> int:
        """Partitions that hold no files yet (they open them at their first append)."""
        return sum(1 for t in self._topics.values() for p in t.partitions
                   if not p.holds_files)

    def _check_room(self, name: str, count: int) -> None:
        """Raise :class:`LimitReached` when ``count`` more partitions in one more topic
        would pass a limit (before anything is built: a refusal costs nothing)."""
        s = self.settings
        if self.topic_count + 1 > s.max_topics:
            raise LimitReached("max_topics", f"cannot create topic {name!r}: the server "
                               f"holds {self.topic_count} topics (limits.max_topics="
                               f"{s.max_topics})")
        if self._partitions + count > s.max_partitions:
            raise LimitReached("max_partitions", f"cannot create topic {name!r} with "
                               f"{count} partitions: the server holds {self._partitions} "
                               f"(limits.max_partitions={s.max_partitions})")
        fits, free, needed = self._descriptors.room_for(count, self._unopened_partitions)
        if not fits:
            raise LimitReached("open_files", f"cannot create topic {name!r}: its {count} "
                               f"partitions need {needed} descriptors and {free} are free, "
                               f"{self._descriptors.kept_free()} of which are kept for "
                               "connections and segment files "
                               "(raise limits.open_files or the hard RLIMIT_NOFILE)")

    def topic(self, name: str) -> Topic | None:
        """The topic, or None (also for names that are not valid topic names)."""
        return self._topics.get(name)

    def partition(self, topic: str, index: int) -> Partition:
        """A partition, or :class:`UnknownTopic` / :class:`UnknownPartition`."""
        t = self._topics.get(topic)
        if t is None:
            raise UnknownTopic(f"no topic {topic!r}")
        return t.partition(index)

    def find_partition(self, topic: str, index: int) -> Partition | None:
        """:meth:`partition`, or None where that raises (for the hot path)."""
        t = self._topics.get(topic)
        if t is None:
            return None
        partitions = t.partitions
        return partitions[index] if 0 <= index < len(partitions) else None

    async def create_topic(self, name: str, partitions: int | None = None,
                           config_text: str = "") -> Topic:
        """Create a topic atomically: build ``.<name>`` then rename it to ``<name>``.

        While another task creates the same topic, waits for it to finish first, so a
        caller told :class:`TopicExists` finds the topic there.
        Raises :class:`InvalidTopicName` (name or partition count), :class:`InvalidConfig`
        (also a value below ``settings.config_bounds``), :class:`TopicExists`,
        :class:`LimitReached` (``max_topics``, ``max_partitions``, descriptors), or
        :class:`StoreIOError`-like ``StoreError`` on failure.
        """
        self._check_open()
        validate_topic_name(name)
        count = validate_partition_count(
            self.settings.default_partitions if partitions is None else partitions)
        config = self.settings.topic_defaults.with_text(config_text,
                                                        self.settings.config_bounds)
        while (creating := self._creating.get(name)) is not None:
            await creating.wait()
        if name in self._topics:
            raise TopicExists(f"topic {name!r} exists")
        self._check_room(name, count)
        # A directory and its first block per partition, and the topic's own.
        if not self.disk.take((count + 1) * _DIRECTORY_BYTES):
            raise self.disk.refused((count + 1) * _DIRECTORY_BYTES, topic=name)
        done = self._creating[name] = trio.Event()
        self._partitions += count
        created = False
        try:
            path = await trio.to_thread.run_sync(
                self._build_topic_dir, name, count, config_text, limiter=self._limiter)
            topic = Topic(name, path, config, [
                Partition(name, i, os.path.join(path, str(i)), config, self._env)
                for i in range(count)])
            self._topics[name] = topic
            created = True
        except OSError as exc:
            failure = self.disk.failed("create_topic", exc, topic=name)
            raise StoreIOError(f"cannot create topic {name!r}: {failure}",
                               failure.kind) from exc
        finally:
            if not created:
                self._partitions -= count
            del self._creating[name]
            done.set()
        log.info("topic_created", topic=name, partitions=count)
        return topic

    def _build_topic_dir(self, name: str, count: int, config_text: str) -> str:
        final = os.path.join(self.data_dir, name)
        staging = os.path.join(self.data_dir, "." + name)
        if os.path.exists(final):
            raise FileExistsError(f"{final} exists")
        shutil.rmtree(staging, ignore_errors=True)
        os.mkdir(staging)
        if config_text.strip():
            with open(os.path.join(staging, CONFIG_FILE), "w", encoding="utf-8") as f:
                f.write(config_text)
                f.flush()
                os.fsync(f.fileno())
        for i in range(count):
            os.mkdir(os.path.join(staging, str(i)))
        sync_directory(staging)
        os.rename(staging, final)
        sync_directory(self.data_dir)
        return final

    async def reload_config(self, topic: str, partition: int) -> TopicConfig:
        """Re-read a partition's ``config`` files (Tank's ReloadConf) and apply them.

        Raises :class:`UnknownTopic`, :class:`UnknownPartition`, :class:`InvalidConfig`
        (the partition keeps its current config) or ``OSError``.
        """
        t = self._topics.get(topic)
        if t is None:
            raise UnknownTopic(f"no topic {topic!r}")
        p = t.partition(partition)

        def read() -> TopicConfig:
            base = self._read_config(self.settings.topic_defaults, t.directory, topic,
                                     strict=True)
            return self._read_config(base, p.directory, topic, partition, strict=True)

        p.config = await trio.to_thread.run_sync(read, limiter=self._limiter)
        return p.config

    # -- the disk -------------------------------------------------------------------------------

    def not_writable(self) -> str | None:
        """Why the store can not write now (disk full or below its floor, read-only, a
        write or fsync that failed and has not succeeded since), or None while it can."""
        return self.disk.not_writable()

    def _hand_back_zeros(self) -> int:
        """Trim the zeros written ahead of every active segment; the bytes freed."""
        freed = 0
        for topic in list(self._topics.values()):
            for partition in topic.partitions:
                freed += partition.hand_back_zeros()
        return freed

    async def watch_disk(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                         ) -> None:
        """Look at the disk every ``settings.disk_check_interval`` seconds (free space,
        read-only), probe it while a fault only a write can disprove stands, and log when
        the store becomes writable again."""
        disk = self.disk
        task_status.started()
        was = disk.not_writable()
        while not self._closed:
            await trio.sleep(self.settings.disk_check_interval)
            disk.look()
            if disk.needs_probe and await trio.to_thread.run_sync(disk.probe,
                                                                  limiter=self._limiter):
                disk.synced()
            now = disk.not_writable()
            if now is None and was is not None:
                log.warning("store_writable", was=was)
            elif now is not None and was is None:
                log.warning("store_not_writable", reason=now)
            was = now

    # -- maintenance and closing ------------------------------------------------------------------

    async def maintain(self, now: float | None = None) -> None:
        """One maintenance pass over every partition (retention, roll by age, flush.secs)."""
        for topic in list(self._topics.values()):
            for partition in topic.partitions:
                await partition.maintain(now)

    async def run_maintenance(self, *, interval: float | None = None,
                              task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                              ) -> None:
        """Run :meth:`maintain` every ``interval`` seconds (default: the settings') forever."""
        interval = self.settings.maintenance_interval if interval is None else interval
        task_status.started()
        while not self._closed:
            await trio.sleep(interval)
            try:
                await self.maintain()
            except StoreError as exc:
                log.error("maintenance_failed", error=str(exc))

    def _close_now(self) -> None:
        self._closed = True
        self._syncer.close()
        for topic in self._topics.values():
            for partition in topic.partitions:
                if not partition.closed:
                    partition.close_now()

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosed("the store is closed")

    async def aclose(self) -> None:
        """Finish pending appends, fsync and close every partition. Idempotent."""
        if self._closed:
            return
        self._closed = True
        with trio.CancelScope(shield=True):
            for topic in list(self._topics.values()):
                for partition in topic.partitions:
                    await partition.aclose()


@asynccontextmanager
async def open_store(data_dir: str | os.PathLike[str], settings: StoreSettings | None = None,
                     *, clock: Callable[[], float] = time.time,
                     maintenance: bool = True,
                     observe_fsync: Callable[[float], None] | None = None,
                     on_data_loss: Callable[[int, int], None] | None = None,
                     on_producer_evicted: Callable[[], None] | None = None,
                     on_write_failure: Callable[[str], None] | None = None
                     ) -> AsyncIterator[LogStore]:
    """Open (and recover) the store in ``data_dir``; close it on exit.

    Recovery runs in a worker thread. While open, the store runs its background work
    (fsync rounds, and with ``maintenance`` the periodic retention pass) in its own
    nursery. ``clock`` gives wall-clock seconds (segment names, retention);
    ``observe_fsync`` is called with the duration of every group fsync, ``on_data_loss``
    with ``(messages, bytes)`` of every damaged region found and every recovery cut,
    ``on_producer_evicted`` each time a partition forgets an idempotent producer for
    ``StoreSettings.max_producer_states``, ``on_write_failure`` with the kind of every
    failed or refused write (:mod:`gateway.store.disk`). The store looks at its disk
    every ``StoreSettings.disk_check_interval`` seconds (:meth:`LogStore.watch_disk`).
    """
    store = LogStore(os.fspath(data_dir), settings or StoreSettings(), clock, observe_fsync,
                     on_data_loss, on_producer_evicted, on_write_failure)
    try:
        await trio.to_thread.run_sync(store._load)
    except BaseException as exc:
        store._close_now()
        if isinstance(exc, OSError):
            raise StoreError(f"cannot open the store in {data_dir}: {exc}") from exc
        raise
    try:
        async with trio.open_nursery() as nursery:
            store._attach(nursery)
            nursery.start_soon(store._syncer.run)
            if math.isfinite(store.settings.disk_check_interval):
                nursery.start_soon(store.watch_disk)
            if maintenance and math.isfinite(store.settings.maintenance_interval):
                nursery.start_soon(store.run_maintenance)
            try:
                yield store
            finally:
                await store.aclose()
                nursery.cancel_scope.cancel()
    finally:
        store._nursery = None
        store._close_now()

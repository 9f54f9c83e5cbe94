"""The bridge backend: both listeners served by an upstream Tank broker.

:class:`BridgeBackend` implements :class:`~gateway.core.contract.Backend` request for request
over the upstream connection (:class:`~gateway.backend.bridge.upstream.Upstream`); figtank keeps no
log of its own. Sequence numbers are the upstream's, so a position means the same through
the bridge and at the broker.

- produce: bundles are checked here first (size, framing: :mod:`gateway.backend.forwarding`),
  as the embedded store does, so a bad one fails only its own batch and never reaches the
  broker; then one upstream
  Produce (ProduceWithSeqnum for batches with a base sequence) for all the appends of a
  scheduler round (:mod:`gateway.backend.bridge.produce`). Missing topics are created
  upstream as :class:`~gateway.core.contract.AutoCreate` says. Tank's Produce response
  carries no sequence numbers, so an OK outcome has them only where the batch named them
  (base sequence, sparse).
- fetch: one upstream Consume with the caller's long-poll parameters; identical fetches in
  flight share it (:mod:`gateway.backend.bridge.fetch`).
- admin: forwarded as the matching Tank request.

While the upstream is away, calls wait for it for up to ``wait_secs`` (a fetch: its
``max_wait``); then produce answers I/O fault, fetch FAULT, create_topic system error,
reload_conf I/O error, and the discovery and status calls raise
:class:`~gateway.core.contract.UpstreamUnavailable`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Final

import trio

from gateway.backend.bridge.fetch import FetchForwarder
from gateway.backend.bridge.produce import Entry, ProduceForwarder
from gateway.backend.bridge.upstream import Upstream
from gateway.backend.forwarding import (
    DEFAULT_WAIT_SECS,
    Forwarding,
    checked_bundle,
    refuse_topic_name,
    valid_new_topic,
)
from gateway.client.tank import topic_infos
from gateway.core.contract import (
    AutoCreate,
    BackendStatus,
    CreateTopicCode,
    FetchOutcome,
    FetchRequest,
    FetchStatus,
    PartitionInfo,
    ProduceBatch,
    ProduceCode,
    ProduceDone,
    ProduceOutcome,
    ProduceQueue,
    ReloadConfCode,
    TailChange,
    TopicInfo,
    UpstreamUnavailable,
)
from gateway.core.metrics import Metrics
from protocols.record import Answer, Request
from protocols.tank.bundle import BundleInfo
from protocols.tank.messages import (
    CreateTopicRequest,
    DiscoverPartitionsRequest,
    DiscoverTopicsRequest,
    ReloadConfRequest,
)
from protocols.topics import is_valid_topic_name
from protocols.wire import UINT64_MAX

_MAX_U16: Final = 0xFFFF


class BridgeBackend(Forwarding):
    """Serves both listeners from an upstream Tank broker; see the module doc.

    ``nursery`` runs the shared fetches and merged produce requests (it must outlive
    every call). ``default_partitions`` and ``topic_config`` (Tank config keys) are used
    for topics created upstream.
    """

    #: Whether produce outcomes carry the offsets (see the Backend contract).
    reports_offsets = False

    def __init__(self, upstream: Upstream, nursery: trio.Nursery, *,
                 auto_create_topics: bool = True, default_partitions: int = 1,
                 topic_config: Mapping[str, str] | None = None,
                 max_bundle_bytes: int = 64 * 1024 * 1024,
                 wait_secs: float = DEFAULT_WAIT_SECS, metrics: Metrics | None = None) -> None:
        self.upstream = upstream
        self.auto_create = AutoCreate(auto_create_topics, default_partitions)
        self.topic_config = dict(topic_config or {})
        self.max_bundle_bytes = max_bundle_bytes
        self.wait_secs = wait_secs
        self._metrics = metrics
        self._nursery = nursery
        self.produces = ProduceForwarder(
            upstream, nursery, wait_secs=wait_secs, auto_create=self.auto_create,
            create_topic=self.create_topic)
        self.fetches = FetchForwarder(upstream, nursery)
        self._produce_queue = ProduceQueue(self.produce, nursery.start_soon)

    def unavailable(self) -> str | None:
        """Why the bridge can not serve now (no connection to an upstream broker), or
        None while it can."""
        if self.upstream.upstream_up:
            return None
        return f"upstream unreachable: no connection to {', '.join(self.upstream.addresses)}"

    # -- produce -----------------------------------------------------------------------------

    async def produce(self, batches: Sequence[ProduceBatch]) -> list[ProduceOutcome]:
        """Append each batch upstream; outcomes in the same order."""
        started = time.perf_counter()
        outcomes: list[ProduceOutcome | None] = [None] * len(batches)
        infos: list[BundleInfo | None] = [None] * len(batches)
        entries: list[Entry] = []
        sent: list[int] = []
        for i, batch in enumerate(batches):
            refused = self._check(batch)
            if isinstance(refused, ProduceOutcome):
                outcomes[i] = refused
                continue
            infos[i] = refused
            entries.append((batch.topic, batch.partition, batch.bundle, batch.base_seq))
            sent.append(i)
        if entries:
            codes = await self.produces.send(entries)
            for i, code in zip(sent, codes, strict=True):
                info = infos[i]
                assert info is not None
                outcomes[i] = self._outcome(batches[i], info, code)
        if self._metrics is not None:
            self._metrics.append_seconds.observe(time.perf_counter() - started)
        return outcomes  # type: ignore[return-value]  # every slot filled above

    def produce_nowait(self, batches: Sequence[ProduceBatch], on_done: ProduceDone) -> None:
        """:meth:`produce` in a task of the bridge, in call order; ``on_done`` gets the
        outcomes."""
        self._produce_queue.submit(batches, on_done)

    def _check(self, batch: ProduceBatch) -> ProduceOutcome | BundleInfo:
        """The bundle's header when it may go upstream, else the outcome refusing it."""
        refused = refuse_topic_name(batch)
        if refused is not None:
            return refused
        if not 0 <= batch.partition <= _MAX_U16:
            return ProduceOutcome(ProduceCode.UNKNOWN_PARTITION)
        if batch.base_seq is not None and not 0 < batch.base_seq <= UINT64_MAX:
            return ProduceOutcome(ProduceCode.INVALID_SEQUENCE)
        return checked_bundle(batch, self.max_bundle_bytes)

    def _outcome(self, batch: ProduceBatch, info: BundleInfo, code: int) -> ProduceOutcome:
        if code != ProduceCode.OK:
            try:
                known = ProduceCode(code)
            except ValueError:  # insufficient replicas, no leader, other leader
                return ProduceOutcome(ProduceCode.IO_FAULT, reason=f"upstream code 0x{code:02x}")
            return ProduceOutcome(known, reason="upstream")
        if self._metrics is not None:
            self._metrics.appended(batch.topic, info.msg_count, len(batch.bundle))
        if info.sparse:
            return ProduceOutcome(ProduceCode.OK, info.first_seq or 0, info.last_seq or 0)
        if batch.base_seq is not None:
            return ProduceOutcome(ProduceCode.OK, batch.base_seq,
                                  batch.base_seq + info.msg_count - 1)
        return ProduceOutcome(ProduceCode.OK)

    # -- fetch -------------------------------------------------------------------------------

    def fetch_nowait(self, requests: Sequence[FetchRequest]) -> None:
        """Always None: only the upstream knows (see :meth:`fetch`)."""
        return None

    def watch_tail(self, topic: str, partition: int, seq: int,
                   on_change: TailChange) -> None:
        """None: readers long-poll the upstream (:meth:`fetch`)."""
        return None

    async def fetch(self, requests: Sequence[FetchRequest], *, max_wait_ms: int,
                    min_bytes: int) -> list[FetchOutcome]:
        """Read each partition with one upstream Consume; the upstream long-polls."""
        outcomes: list[FetchOutcome | None] = [None] * len(requests)
        entries = []
        asked = []
        for i, r in enumerate(requests):
            if not is_valid_topic_name(r.topic):
                outcomes[i] = FetchOutcome(FetchStatus.UNKNOWN_TOPIC)
            elif not 0 <= r.partition <= _MAX_U16:
                outcomes[i] = FetchOutcome(FetchStatus.UNKNOWN_PARTITION)
            else:
                entries.append((r.topic, r.partition, min(max(r.seq, 0), UINT64_MAX),
                                min(max(r.fetch_size, 0), 0xFFFFFFFF)))
                asked.append(i)
        if entries:
            fetched = await self.fetches.fetch(entries, max_wait_ms=max_wait_ms,
                                               min_bytes=min(max(min_bytes, 0), 0xFFFFFFFF))
            for i, outcome in zip(asked, fetched, strict=True):
                outcomes[i] = outcome
        return outcomes  # type: ignore[return-value]  # every slot filled above

    # -- admin -------------------------------------------------------------------------------

    def _deadline(self) -> float:
        return trio.current_time() + self.wait_secs


    async def _request(self, what: str, build: Callable[[int], Request[Answer]]) -> Answer:
        return await self.upstream.call(what, self._deadline(),
                                        lambda client: client.request(build))

    async def create_topic(self, name: str, partitions: int, config: str = ""
                           ) -> CreateTopicCode:
        """CreateTopic upstream, with the configured topic defaults for keys not given."""
        if not valid_new_topic(name, partitions):
            return CreateTopicCode.INVALID
        raw = _with_defaults(config, self.topic_config).encode()
        try:
            response = await self._request("create_topic", lambda rid: CreateTopicRequest(
                rid, name, partitions, raw))
        except UpstreamUnavailable:
            return CreateTopicCode.SYSTEM_ERROR
        try:
            return CreateTopicCode(response.error)
        except ValueError:
            return CreateTopicCode.SYSTEM_ERROR

    async def discover_partitions(self, topic: str) -> list[PartitionInfo] | None:
        """The upstream's bounds; a partition it can not serve is ``(UINT64_MAX,) * 2``."""
        if not is_valid_topic_name(topic):
            return None
        response = await self._request("discover_partitions",
                                       lambda rid: DiscoverPartitionsRequest(rid, topic, []))
        if not response.partitions:
            return None
        return [PartitionInfo(UINT64_MAX, UINT64_MAX) if p.error else
                PartitionInfo(p.first_available_seq_num, p.high_water_mark)
                for p in response.partitions]

    async def discover_topics(self) -> list[TopicInfo]:
        response = await self._request("discover_topics",
                                       lambda rid: DiscoverTopicsRequest(rid, 0))
        return topic_infos(response)

    async def reload_conf(self, topic: str, partition: int) -> ReloadConfCode:
        if not is_valid_topic_name(topic):
            return ReloadConfCode.UNKNOWN_TOPIC
        if not 0 <= partition <= _MAX_U16:
            return ReloadConfCode.UNKNOWN_PARTITION
        try:
            response = await self._request("reload_conf", lambda rid: ReloadConfRequest(
                rid, topic, partition))
        except UpstreamUnavailable:
            return ReloadConfCode.IO_ERROR
        try:
            return ReloadConfCode(response.error)
        except ValueError:  # 12: refused by a clustered broker
            return ReloadConfCode.IO_ERROR

    async def issue_producer_id(self) -> None:
        """None: the Kafka listener numbers producers itself."""
        return None

    async def status(self) -> BackendStatus:
        """The upstream broker's Status."""
        s = await self.upstream.call("status", self._deadline(),
                                     lambda client: client.status())
        return BackendStatus(s.topics, s.partitions, s.open_partitions, s.open_time_ms,
                             s.startup_ts, s.version)

    async def aclose(self) -> None:
        """Stop the shared requests and the upstream connection."""
        self._nursery.cancel_scope.cancel()
        await trio.lowlevel.cancel_shielded_checkpoint()


def _with_defaults(config: str, defaults: Mapping[str, str]) -> str:
    """``config`` (Tank ``key=value`` lines) plus each default whose key it does not set."""
    given = {line.partition("=")[0].strip() for line in config.splitlines() if "=" in line}
    extra = "".join(f"{k}={v}\n" for k, v in defaults.items() if k not in given)
    if extra and config and not config.endswith("\n"):
        config += "\n"
    return config + extra

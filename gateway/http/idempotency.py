"""``Idempotency-Key``: the keys of HTTP produces and their answers, kept durably.

A produce with an ``Idempotency-Key`` header is remembered under that key (scoped by the
principal it acts as): its request's fingerprint (a SHA-256 of the topic and of what
decides the messages: body, content type, key headers, ``?partition=``) and its answer.
A request that comes again with the key is not appended again:

- the first answer said every message was stored (200): the same status and body again,
  with ``Idempotent-Replayed: true``;
- some messages were not stored (a partition refused them): only those are appended now,
  each to the partition it was placed in, and the answer is the first one with them
  filled in (so a client retries a failed request with the same key until it gets 200);
- the fingerprint differs: 422 ``idempotency_key_reused``, nothing appended;
- a request with the key is under way in this process: the duplicate waits for it, then
  is answered as a retry;
- the gateway stopped while a request with the key was being appended (its ``begun``
  record has no outcome): 409 ``idempotency_outcome_unknown``, nothing appended (its
  messages may be stored or not: read the partitions to know).

Records go to ``figtank-http-idempotency.log`` in the data directory's root (a regular
file: the store loads only directories), one ``u32 length, u32 crc32, payload`` each, the
payload a JSON header line and the answer's body. A ``begun`` record is written (and in
``store.durability = "fsync"`` fsynced) before the append, the outcome's after it and
before the answer: so a crash never lets a retry append twice. Records waiting at the
same moment are written (and fsynced) together. At start-up the file is read back; a
short or torn record ends it (cut off, logged). It is rewritten with the live records
only once it holds twice as many bytes as they take (and over :data:`COMPACT_MIN_BYTES`).

Bounded: at most ``http.idempotency_max_keys`` keys and ``http.idempotency_max_bytes``
bytes of answers (memory and file), each kept ``http.idempotency_ttl_secs`` after its last
answer; past a bound the oldest are forgotten first (``figtank_limit_hits_total``). In the
upstream modes (no data directory of its own) the keys are kept in memory only.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import struct
import time
import zlib
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import structlog
import trio
from prometheus_client import Counter

from gateway.core.metrics import GaugeCollector, Metrics
from gateway.http.request import HttpError
from gateway.store.recordfile import append_whole, write_new

log = structlog.get_logger("figtank.http.idempotency")

#: The file's name in the data directory.
FILE_NAME: Final = "figtank-http-idempotency.log"
MAGIC: Final = b"FTIDEM1\n"
_HEAD = struct.Struct(">II")  # payload length, crc32 of the payload
#: The file is not rewritten below this size.
COMPACT_MIN_BYTES: Final = 1 << 20
#: What a remembered key costs against ``http.idempotency_max_bytes`` beside its body.
ENTRY_OVERHEAD: Final = 128
#: Longest key taken (the IETF draft leaves it to the server; UUIDs are 36).
MAX_KEY_LENGTH: Final = 255
#: Status of a ``begun`` record: an append under way, outcome not yet known.
BEGUN: Final = 0


@dataclass(slots=True)
class Remembered:
    """What a key holds: its request's fingerprint and the last answer (``status`` 0:
    an append began and its outcome was never recorded)."""

    fingerprint: str
    status: int
    body: bytes
    written: float = field(default_factory=time.time)

    @property
    def cost(self) -> int:
        return ENTRY_OVERHEAD + len(self.body)


def key_of(header: str | None) -> str | None:
    """The ``Idempotency-Key`` header's value, checked (400 when it is not one)."""
    if header is None:
        return None
    if not 0 < len(header) <= MAX_KEY_LENGTH or not all(" " <= c <= "~" for c in header):
        raise HttpError(400, "bad_idempotency_key", f"Idempotency-Key must be 1 to "
                        f"{MAX_KEY_LENGTH} printable ASCII characters")
    return header


def fingerprint(*parts: str | bytes | None) -> str:
    """A digest of the parts that make a request what it is."""
    digest = hashlib.sha256()
    for part in parts:
        data = b"\xff" if part is None else part.encode() if isinstance(part, str) else part
        digest.update(b"%d:" % len(data))
        digest.update(data)
    return digest.hexdigest()


def _record(key: str, entry: Remembered) -> bytes:
    head = json.dumps({"k": key, "f": entry.fingerprint, "s": entry.status,
                       "t": entry.written}, separators=(",", ":")).encode()
    payload = head + b"\n" + entry.body
    return _HEAD.pack(len(payload), zlib.crc32(payload)) + payload


def _parse(payload: bytes) -> tuple[str, Remembered]:
    head, _, body = payload.partition(b"\n")
    fields = json.loads(head)
    return fields["k"], Remembered(fields["f"], int(fields["s"]), body, float(fields["t"]))


def recover(path: Path) -> tuple[list[tuple[str, Remembered]], int, int]:
    """The records of ``path`` (made with the magic when missing), the size of its whole
    records and the bytes cut off after them (cut from the file too). Blocking."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        data = b""
    if not data.startswith(MAGIC):
        if data:
            raise OSError(errno.EINVAL, f"{path} is not an idempotency keys file")
        write_new(path, MAGIC)
        return [], len(MAGIC), 0
    records = []
    pos = len(MAGIC)
    while pos + _HEAD.size <= len(data):
        length, crc = _HEAD.unpack_from(data, pos)
        payload = data[pos + _HEAD.size:pos + _HEAD.size + length]
        if len(payload) != length or zlib.crc32(payload) != crc:
            break
        try:
            records.append(_parse(payload))
        except (ValueError, KeyError, UnicodeDecodeError):
            break
        pos += _HEAD.size + length
    cut = len(data) - pos
    if cut:
        with open(path, "r+b") as f:
            f.truncate(pos)
            os.fsync(f.fileno())
    return records, pos, cut


@dataclass(slots=True)
class _Round:
    """Records written together (one write, one fsync)."""

    records: list[bytes] = field(default_factory=list)
    done: trio.Event = field(default_factory=trio.Event)
    error: OSError | None = None


@dataclass(frozen=True, slots=True)
class Limits:
    """The bounds on the keys remembered (see the module doc)."""

    max_keys: int = 100_000
    max_bytes: int = 64 << 20
    ttl_secs: float = 86_400.0


class IdempotencyKeys:
    """The keys and answers of the server's HTTP listeners (see the module doc)."""

    def __init__(self, path: Path | None, limits: Limits | None = None, *,
                 fsync: bool = True, on_limit: Callable[[str], None] | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.path = path
        self.limits = limits or Limits()
        self.fsync = fsync
        self._on_limit = on_limit
        self._clock = clock
        self._entries: OrderedDict[str, Remembered] = OrderedDict()  # oldest answer first
        self.bytes = 0
        self._busy: dict[str, trio.Event] = {}
        self._fd: int | None = None
        self._size = 0
        self._round: _Round | None = None
        self._writing = False
        #: Requests with a key, by result (``new``, ``replayed``, ``resumed``,
        #: ``reused_key``, ``outcome_unknown``).
        self.results: dict[str, int] = {}
        #: Told each result too (the metric: :func:`register_metrics`).
        self.on_result: Callable[[str], None] | None = None

    def __len__(self) -> int:
        return len(self._entries)

    # -- opening -------------------------------------------------------------------------

    def load(self) -> None:
        """Read the file back and open it for appending (blocking); a no-op in memory."""
        if self.path is None:
            return
        records, self._size, cut = recover(self.path)
        for key, entry in records:
            self._put(key, entry, count=False)
        self._expire()
        if cut:
            log.warning("idempotency_keys_torn_tail", file=str(self.path), cut_bytes=cut,
                        action="the records after the last whole one were cut off")
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    # -- the requests' side --------------------------------------------------------------

    @asynccontextmanager
    async def claim(self, key: str) -> AsyncIterator[Remembered | None]:
        """Hold ``key`` for the block (a request under way with it); yields what it holds
        (None: nothing). A second claim of the key waits for the first to end."""
        while (busy := self._busy.get(key)) is not None:
            await busy.wait()
        self._expire()
        done = self._busy[key] = trio.Event()
        try:
            yield self._entries.get(key)
        finally:
            del self._busy[key]
            done.set()

    async def remember(self, key: str, entry: Remembered) -> None:
        """Keep ``entry`` under ``key``, durably before returning (raises OSError when the
        record could not be written: it is then kept in memory only)."""
        entry.written = self._clock()
        self._put(key, entry)
        self._expire()
        if self._fd is not None:
            await self._write(_record(key, entry))

    def counted(self, result: str) -> None:
        """Count a request with a key by its result."""
        self.results[result] = self.results.get(result, 0) + 1
        if self.on_result is not None:
            self.on_result(result)

    def restore(self, key: str, previous: Remembered | None) -> None:
        """Put back what ``key`` held before a :meth:`remember` whose record could not be
        written (in memory; the file never had the new record)."""
        if previous is not None:
            self._put(key, previous, count=False)
        elif (entry := self._entries.pop(key, None)) is not None:
            self.bytes -= entry.cost

    # -- inside --------------------------------------------------------------------------

    def _put(self, key: str, entry: Remembered, *, count: bool = True) -> None:
        old = self._entries.pop(key, None)
        if old is not None:
            self.bytes -= old.cost
        self._entries[key] = entry
        self.bytes += entry.cost
        limits = self.limits
        while len(self._entries) > 1 and (len(self._entries) > limits.max_keys
                                          or self.bytes > limits.max_bytes):
            name = ("http.idempotency_max_keys" if len(self._entries) > limits.max_keys
                    else "http.idempotency_max_bytes")
            oldest = next(iter(self._entries))
            if oldest in self._busy or oldest == key:
                break
            self.bytes -= self._entries.pop(oldest).cost
            if count and self._on_limit is not None:
                self._on_limit(name)

    def _expire(self) -> None:
        horizon = self._clock() - self.limits.ttl_secs
        while self._entries:
            oldest, entry = next(iter(self._entries.items()))
            if entry.written >= horizon or oldest in self._busy:
                return
            del self._entries[oldest]
            self.bytes -= entry.cost

    async def _write(self, record: bytes) -> None:
        """Append ``record`` with the others waiting (one write and fsync a round)."""
        current = self._round
        if current is None:
            current = self._round = _Round()
        current.records.append(record)
        if self._writing:
            await current.done.wait()
        else:
            self._writing = True
            try:
                while (next_round := self._round) is not None:
                    self._round = None
                    try:
                        await trio.to_thread.run_sync(self._append,
                                                      b"".join(next_round.records))
                    except OSError as exc:
                        next_round.error = exc
                    next_round.done.set()
                    if self._compaction_due():
                        await self._compact()
            finally:
                self._writing = False
        if current.error is not None:
            raise current.error

    def _append(self, data: bytes) -> None:
        """Write ``data`` (and fsync); on failure cut the file back to its whole records.
        Worker thread."""
        assert self._fd is not None
        self._size = append_whole(self._fd, data, self._size, fsync=self.fsync)

    def _compaction_due(self) -> bool:
        return self._size > max(COMPACT_MIN_BYTES, 2 * (self.bytes + len(MAGIC)))

    async def _compact(self) -> None:
        assert self.path is not None
        data = MAGIC + b"".join(_record(k, e) for k, e in self._entries.items())
        before = self._size
        try:
            await trio.to_thread.run_sync(write_new, self.path, data)
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        except OSError as exc:
            log.error("idempotency_keys_compaction_failed", file=str(self.path),
                      error=exc.strerror or repr(exc), action="the file is kept as it is")
            self._size = max(self._size, 2 * before)  # not again before it doubles
            return
        old, self._fd, self._size = self._fd, fd, len(data)
        if old is not None:
            os.close(old)
        log.info("idempotency_keys_compacted", file=str(self.path), bytes_before=before,
                 bytes_after=len(data), keys=len(self._entries))


def storage_error(exc: OSError, what: str) -> HttpError:
    """The refusal of a request whose key could not be recorded (nothing was appended)."""
    full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
    return HttpError(507 if full else 503, "idempotency_not_recorded",
                     f"{what}: {exc.strerror or exc}; nothing was appended")


@asynccontextmanager
async def open_idempotency_keys(path: Path | None, limits: Limits, *, fsync: bool,
                                on_limit: Callable[[str], None] | None = None
                                ) -> AsyncIterator[IdempotencyKeys]:
    """The keys read back from ``path`` (None: in memory), kept until the block ends.
    OSError when the file can not be used."""
    keys = IdempotencyKeys(path, limits, fsync=fsync, on_limit=on_limit)
    await trio.to_thread.run_sync(keys.load)
    log.info("idempotency_keys_loaded", file=None if path is None else str(path),
             keys=len(keys), durable=path is not None)
    try:
        yield keys
    finally:
        keys.close()


def register_metrics(keys: IdempotencyKeys, metrics: Metrics) -> None:
    """Export ``keys``' size and results (computed at scrape time)."""
    metrics.add_collector(GaugeCollector(
        "figtank_http_idempotency_keys", "Idempotency-Key values of HTTP produces "
        "remembered with their answers (http.idempotency_max_keys).", [],
        lambda: [([], float(len(keys)))]))
    metrics.add_collector(GaugeCollector(
        "figtank_http_idempotency_bytes", "Bytes of the answers remembered for "
        "Idempotency-Key values (http.idempotency_max_bytes).", [],
        lambda: [([], float(keys.bytes))]))
    results = Counter(
        "figtank_http_idempotency_requests", "HTTP produces with an Idempotency-Key, by "
        "result: new, replayed (the answer given again), resumed (the messages not "
        "stored before appended), reused_key (422), outcome_unknown (409).", ["result"],
        registry=metrics.registry)
    keys.on_result = lambda result: results.labels(result).inc()


def replay_headers() -> list[tuple[bytes, bytes]]:
    """The header marking an answer given again for its key."""
    return [(b"idempotent-replayed", b"true")]


def answer_json(body: bytes) -> dict[str, Any]:
    """A remembered answer's body as JSON (an object: every answer remembered is one)."""
    answer: dict[str, Any] = json.loads(body)
    return answer

"""Types of the compiled inner loops (``protocols/_speedups.pyx``).

Each function is the compiled twin of a pure-Python reference named in its docstring in
the ``.pyx``; the arguments are the reference's, passed positionally. Callers reach the
module through :data:`protocols.native.speedups` (None at run time when it is not built
or disabled). ``tests/test_stubs.py`` holds this file to the built module.
"""

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from protocols.errors import ProtocolError
from protocols.kafka.records import ProduceResponse
from protocols.tank.bundle import Message
from protocols.tank.scan import Appender, MakeBatch, ProducePass

_B = TypeVar("_B")

class _Outcome(Protocol):
    @property
    def code(self) -> int: ...

_Bytes = bytes | bytearray | memoryview

def validate_bundle(
    bundle: _Bytes, max_uncompressed: int
) -> tuple[int, int, int | None, int | None]: ...
def data_frames(
    topic: bytes, chunk: _Bytes, base_seq: int | None, min_seq: int, max_bundle_size: int,
    max_uncompressed: int,
) -> tuple[bytes, int, int, int, int | None]: ...
def decode_chunk(
    chunk: _Bytes, base_seq: int | None, min_seq: int, max_bundle_size: int,
    max_uncompressed: int,
) -> tuple[list[Message], int, int, int | None]: ...
# items: a (topic bytes, count, message set, acks) per run of PUBLISHes to one topic,
# (message type, payload) for the other frames: the caller turns the runs into batches.
def scan_publishes(
    buf: bytes | bytearray, pos: int, end: int, max_payload: int, timestamp: int
) -> tuple[list[Any], int, ProtocolError | None]: ...
def kafka_sections(
    chunk: _Bytes, base_seq: int | None, max_bundle_size: int, max_uncompressed: int
) -> tuple[bytearray, list[tuple[int, int, int, int, int, int, int, int]], int, int,
           int | None]: ...
def kafka_to_tank(
    section: _Bytes, pos: int, end: int, count: int, base_ts: int, forced: int | None,
    append_time: int | None, build: bool, with_head: bool,
) -> tuple[bytes | None, int, str | None]: ...
def tank_to_kafka_batch(
    bundles: Sequence[bytes | memoryview], producer_id: int, producer_epoch: int,
    base_sequence: int, now_ms: int, codec: int, max_uncompressed: int,
) -> tuple[bytes, int]: ...
def kafka_batches_to_bundles(
    records: bytes | bytearray | memoryview, from_offset: int, after_seq: int | None,
    max_decompressed: int, max_batch_size: int, bundle_class: Callable[..., _B],
) -> tuple[list[_B], int, tuple[int, int] | None]: ...
# items: a ProducePass per Produce, (message id, payload) for the other requests.
def scan_tank_requests(
    buf: bytes | bytearray, pos: int, end: int, max_payload: int, make_batch: MakeBatch,
    pass_type: type[ProducePass], reference: Callable[[bytes, MakeBatch], ProducePass],
) -> tuple[list[Any], int, ProtocolError | None]: ...
def tank_produce_response(
    request_id: int, layout: Sequence[tuple[str, Sequence[int]]], outcomes: Sequence[_Outcome],
) -> tuple[bytes, bool]: ...
def tank_produce_run(
    buf: bytes | bytearray, pos: int, end: int, max_payload: int,
    appenders: Mapping[tuple[str, int], Appender], room: int, max_uncompressed: int,
) -> tuple[int, bytes, int]: ...
def kafka_produce_request(
    version: int, correlation: int, client_id: bytes | None, acks: int, timeout_ms: int,
    topics: list[tuple[bytes, list[tuple[int, bytes | None]]]],
) -> list[bytes | bytearray]: ...
def kafka_produce_answers(
    frame: bytes, version: int,
) -> list[tuple[str, int, int, int, int, str | None]] | None: ...
def kafka_read_produce_request(
    buf: bytes, pos: int, end: int, version: int,
) -> tuple[str | None, int, int, list[tuple[str, list[tuple[int, memoryview | None]]]],
           int] | None: ...
def kafka_produce_response(
    version: int, correlation: int, response: ProduceResponse,
) -> bytes | None: ...

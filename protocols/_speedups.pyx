# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Compiled twins of the protocol layer's hot loops (see :mod:`protocols.native`).

Each function here has a pure-Python reference that defines it:

- :func:`validate_bundle`: ``protocols.tank.bundle.validate_bundle_py``;
- :func:`decode_chunk`: ``protocols.tank.bundle.decode_chunk_py``;
- :func:`scan_publishes`: ``protocols.translate.scan_publishes_py``;
- :func:`data_frames`: ``protocols.translate.data_frames_py``;
- :func:`tank_to_kafka_batch`: ``protocols.kafka.upstream_codec.bundles_to_record_batch_py``;
- :func:`kafka_batches_to_bundles`:
  ``protocols.kafka.upstream_codec.record_batches_to_bundles_py``;
- :func:`scan_tank_requests`: ``protocols.tank.scan.scan_requests_py``;
- :func:`tank_produce_response`: ``gateway.tank.produce.produce_response_frame_py``;
- :func:`tank_produce_run`: ``protocols.tank.scan.produce_run_py``.

They give the same results and raise the same :class:`ProtocolError` (same class, same
text) for the same input; ``tests/protocols/test_speedups.py``,
``tests/protocols/test_tank_scan.py``, ``tests/protocols/test_tank_produce_run.py`` and
the tests under ``tests/protocols/kafka/`` hold them to that. Every read is checked against the end of its buffer by hand (raw
pointers, no Cython bounds checks): no input can make them read or write outside a
buffer. They keep no state between calls and hold the GIL except while cramjam
decompresses.
"""

from cpython.buffer cimport PyBUF_READ, PyBUF_SIMPLE, PyBuffer_Release, PyObject_GetBuffer
from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_FromStringAndSize
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from cpython.mem cimport PyMem_Free, PyMem_Realloc
from cpython.memoryview cimport PyMemoryView_FromMemory, PyMemoryView_FromObject
from cpython.unicode cimport PyUnicode_DecodeUTF8
from libc.stdint cimport (
    INT64_MAX,
    INT64_MIN,
    int16_t,
    int32_t,
    int64_t,
    uint8_t,
    uint16_t,
    uint32_t,
    uint64_t,
)
from libc.string cimport memcmp, memcpy, memset

import cramjam
import crc32c

from protocols.errors import FrameTooLarge, ProtocolError

cdef uint64_t U64_MAX = 0xFFFFFFFFFFFFFFFF
#: Values of the Python ``UINT64_MAX``, for comparisons with Python ints.
cdef object PY_U64_MAX = (1 << 64) - 1
#: The snappy crate refuses larger outputs; the reference hears that from cramjam.
cdef uint64_t SNAPPY_MAX_OUTPUT = 0xFFFFFFFF

# Bundle and message flags (protocols/tank/bundle.py).
cdef enum:
    HAVE_KEY = 1
    USE_LAST_SPECIFIED_TS = 2
    SEQ_NUM_PREV_PLUS_ONE = 4
    MSG_FLAGS_MAX = 7
    SPARSE_BIT = 0x40
    RESERVED_BIT = 0x80

# Figg (protocols/figg/messages.py).
cdef enum:
    FIGG_HEADER = 8
    FIGG_VERSION = 1
    FIGG_ATTACH = 1
    FIGG_DETACH = 3
    FIGG_PUBLISH = 5
    FIGG_ACK = 6
    FIGG_DATA = 7
    FIGG_PING = 8
    ACK_FRAME = 16
    # DATA: header, u32 topic length, topic, u64 seq, u32 value length, value.
    DATA_OVERHEAD = 24
    DATA_FIXED_PAYLOAD = 16

# Kafka record batches (protocols/kafka/batch.py).
cdef enum:
    KAFKA_BATCH_HEADER = 61


# ------------------------------------------------------------------------ byte access


cdef inline uint16_t _be16(const uint8_t* p) noexcept nogil:
    return <uint16_t>((<uint16_t>p[0] << 8) | p[1])


cdef inline uint32_t _be32(const uint8_t* p) noexcept nogil:
    return ((<uint32_t>p[0] << 24) | (<uint32_t>p[1] << 16) | (<uint32_t>p[2] << 8)
            | <uint32_t>p[3])


cdef inline uint64_t _be64(const uint8_t* p) noexcept nogil:
    return (<uint64_t>_be32(p) << 32) | _be32(p + 4)


cdef inline uint64_t _le64(const uint8_t* p) noexcept nogil:
    cdef uint64_t value = 0
    cdef int i
    for i in range(7, -1, -1):
        value = (value << 8) | p[i]
    return value


cdef inline void _put_be16(uint8_t* p, uint16_t v) noexcept nogil:
    p[0] = <uint8_t>(v >> 8)
    p[1] = <uint8_t>v


cdef inline void _put_be32(uint8_t* p, uint32_t v) noexcept nogil:
    p[0] = <uint8_t>(v >> 24)
    p[1] = <uint8_t>(v >> 16)
    p[2] = <uint8_t>(v >> 8)
    p[3] = <uint8_t>v


cdef inline void _put_be64(uint8_t* p, uint64_t v) noexcept nogil:
    _put_be32(p, <uint32_t>(v >> 32))
    _put_be32(p + 4, <uint32_t>v)


cdef inline void _put_le64(uint8_t* p, uint64_t v) noexcept nogil:
    cdef int i
    for i in range(8):
        p[i] = <uint8_t>(v >> (8 * i))


cdef inline Py_ssize_t _varint_size(uint64_t v) noexcept nogil:
    cdef Py_ssize_t n = 1
    while v >= 0x80:
        v >>= 7
        n += 1
    return n


cdef inline Py_ssize_t _put_varint(uint8_t* p, uint64_t v) noexcept nogil:
    cdef Py_ssize_t n = 0
    while v >= 0x80:
        p[n] = <uint8_t>((v & 0x7F) | 0x80)
        v >>= 7
        n += 1
    p[n] = <uint8_t>v
    return n + 1


cdef int _read_varint(const uint8_t* buf, Py_ssize_t pos, Py_ssize_t end, uint64_t* value,
                      Py_ssize_t* next_pos) except -1:
    """``protocols.wire.decode_varint``: 1 and the value, or 0 when ``buf[pos:end]`` ends
    inside the varint; raises on an overflowing or over-long one."""
    cdef uint64_t result = 0
    cdef int shift = 0
    cdef uint8_t byte
    while pos < end:
        byte = buf[pos]
        pos += 1
        if shift == 63 and byte > 1:
            raise ProtocolError("varint overflows 64 bits")
        result |= <uint64_t>(byte & 0x7F) << shift
        if byte < 0x80:
            if byte == 0 and shift > 0:
                raise ProtocolError("over-long varint (redundant zero group)")
            value[0] = result
            next_pos[0] = pos
            return 1
        shift += 7
        if shift >= 70:
            raise ProtocolError("varint longer than 10 bytes")
    return 0


cdef object _truncated_at(str what, Py_ssize_t pos):
    return ProtocolError(f"truncated {what} at offset {pos}")


cdef object _truncated_message():
    return ProtocolError("truncated message in bundle message set")


cdef uint64_t _limit(object value, str name) except? 0:
    """A size limit as a u64 (a larger one limits nothing more)."""
    if value < 0:
        raise ValueError(f"{name} must not be negative")
    return U64_MAX if value > PY_U64_MAX else <uint64_t>value


# ----------------------------------------------------------------------- output buffer


cdef struct OutBuf:
    uint8_t* data
    size_t length
    size_t capacity


cdef int _reserve(OutBuf* out, size_t extra) except -1:
    """Make room for ``extra`` more bytes, growing geometrically."""
    cdef size_t need = out.length + extra
    cdef size_t capacity
    cdef void* grown
    if need <= out.capacity:
        return 0
    capacity = out.capacity * 2
    if capacity < need:
        capacity = need
    if capacity < 4096:
        capacity = 4096
    grown = PyMem_Realloc(out.data, capacity)
    if grown == NULL:
        raise MemoryError()
    out.data = <uint8_t*>grown
    out.capacity = capacity
    return 0


# ----------------------------------------------------------------------------- bundles


cdef struct Header:
    int codec
    uint64_t count
    bint sparse
    uint64_t first
    uint64_t last
    Py_ssize_t pos  # where the message set starts


cdef int _parse_header(const uint8_t* buf, Py_ssize_t pos, Py_ssize_t end,
                       Header* h) except -1:
    """``bundle._parse_header`` of the bundle at ``buf[pos:end]``."""
    cdef uint8_t flags
    cdef uint64_t gap
    cdef Py_ssize_t after
    if pos >= end:
        raise ProtocolError("empty bundle")
    flags = buf[pos]
    pos += 1
    if flags & RESERVED_BIT:
        raise ProtocolError(f"bundle flags {<int>flags:#04x}: bit 7 is not supported")
    h.codec = flags & 3
    if h.codec > 1:
        raise ProtocolError(f"unknown bundle codec {h.codec}")
    h.count = (flags >> 2) & 0xF
    if h.count == 0:
        if not _read_varint(buf, pos, end, &h.count, &after):
            raise _truncated_at("bundle message count", pos)
        pos = after
        if h.count == 0:
            raise ProtocolError("bundle with no messages")
    h.sparse = (flags & SPARSE_BIT) != 0
    h.first = h.last = 0
    if h.sparse:
        if end - pos < 8:
            raise ProtocolError("truncated sparse bundle first sequence number")
        h.first = h.last = _le64(buf + pos)
        pos += 8
        if h.count > 1:
            if not _read_varint(buf, pos, end, &gap, &after):
                raise _truncated_at("sparse bundle last sequence number", pos)
            pos = after
            if h.first == U64_MAX or gap > U64_MAX - h.first - 1:
                raise ProtocolError("sparse bundle last sequence number overflows u64")
            h.last = h.first + gap + 1
            if gap < h.count - 2:  # spans gap + 2 sequence numbers
                raise ProtocolError(f"sparse bundle spans {<object>gap + 2} sequence numbers "
                                    f"for {h.count} messages")
    # Every message takes at least 2 bytes.
    if h.codec == 0 and h.count > <uint64_t>((end - pos) // 2):
        raise ProtocolError(f"bundle claims {h.count} messages in {end - pos} bytes")
    h.pos = pos
    return 0


cdef bytearray _snappy_plain(object source, const uint8_t* buf, Py_ssize_t pos,
                             Py_ssize_t end, object max_uncompressed):
    """``bundle._message_set`` for a Snappy bundle: its message set, decompressed.

    ``buf[pos:end]`` is the compressed set inside the buffer of ``source``.
    """
    cdef uint64_t size
    cdef Py_ssize_t after
    cdef bytearray plain
    if not _read_varint(buf, pos, end, &size, &after):
        raise _truncated_at("snappy uncompressed length", pos)
    if size > max_uncompressed:
        raise ProtocolError(f"snappy message set of {size} bytes is over the "
                            f"{max_uncompressed} byte limit")
    if size <= SNAPPY_MAX_OUTPUT:
        # A fresh buffer of the announced size per bundle: cramjam releases the GIL.
        plain = PyByteArray_FromStringAndSize(NULL, <Py_ssize_t>size)
    compressed = memoryview(source)[pos:end]
    try:
        if size > SNAPPY_MAX_OUTPUT:  # refused by the decompressor: let it say so
            plain = bytearray(cramjam.snappy.decompress_raw(compressed))
        else:
            written = cramjam.snappy.decompress_raw_into(compressed, plain)
            if written != size:
                del plain[written:]
    except Exception as exc:  # whatever the decompressor says, the input is corrupt
        raise ProtocolError(f"corrupt snappy message set: {exc.__cause__ or exc}") from None
    finally:
        compressed.release()
    if <uint64_t>len(plain) != size:
        raise ProtocolError("snappy message set length differs from its preamble")
    return plain


cdef enum:
    SINK_MESSAGES = 0
    SINK_DATA = 1
    SINK_KAFKA = 2
    SINK_BATCH = 3


cdef struct Sink:
    # What a walk makes of each message with seq >= min_seq: SINK_DATA, a DATA frame for
    # ``topic`` appended to ``out``; SINK_KAFKA, a Kafka record (of the batch of its bundle)
    # appended to ``out``; SINK_BATCH, the same but one batch for every bundle walked, a
    # timestamp of 0 taken as ``now``; SINK_MESSAGES (decode_chunk), a Message.
    uint64_t min_seq
    int kind
    const uint8_t* topic
    Py_ssize_t topic_len
    OutBuf out
    Py_ssize_t frames
    # SINK_KAFKA, per bundle: messages so far, the first one's seq and timestamp, the
    # largest timestamp.
    uint64_t bundle_count
    uint64_t bundle_first
    uint64_t base_ts
    uint64_t max_ts
    uint64_t now


cdef int _walk(const uint8_t* buf, Py_ssize_t pos, Py_ssize_t end, Py_ssize_t buf_len,
               uint64_t count, bint sparse, uint64_t first, uint64_t last, bint plain_decode,
               Sink* sink, list messages, object message_class) except -1:
    """Check every message of the message set ``buf[pos:end]``; with a sink, deliver them.

    ``bundle._walk`` (sparse bundles, and validation), or with ``plain_decode``
    ``bundle._decode_plain`` (plain bundles: numbered from ``first``, their count checked
    only at the end). ``buf_len`` is the length of the whole buffer: where the reference
    reads a message length just past ``end`` it gets the byte of the next bundle, which
    decides its error message, so this does too.
    """
    cdef uint64_t idx = 0
    cdef uint64_t seq = first
    cdef uint64_t ts = 0
    cdef uint64_t n
    cdef uint64_t gap
    cdef uint8_t flags
    cdef uint8_t byte
    cdef Py_ssize_t key_pos = 0
    cdef Py_ssize_t key_len = -1
    cdef Py_ssize_t after
    cdef uint8_t* w
    while pos < end:
        if idx == count and not plain_decode:
            raise ProtocolError(f"message set holds more than the {count} messages counted")
        flags = buf[pos]
        pos += 1
        if flags > MSG_FLAGS_MAX:
            raise ProtocolError(f"invalid message flags {<int>flags:#04x}")
        if plain_decode:
            seq = first + idx  # wraps only past the count, which is an error at the end
        elif sparse and idx != 0:  # the first message's seq is the header's first
            # Here seq < last: the header has first < last, and each step checks it.
            if idx == count - 1:
                if flags & SEQ_NUM_PREV_PLUS_ONE and seq + 1 != last:
                    raise ProtocolError("sparse sequence numbers disagree with the header")
                seq = last
            else:
                if flags & SEQ_NUM_PREV_PLUS_ONE:
                    seq += 1
                else:
                    if not _read_varint(buf, pos, end, &gap, &after):
                        raise _truncated_at("sparse sequence delta", pos)
                    pos = after
                    if gap >= last - seq - 1:
                        raise ProtocolError("sparse sequence numbers disagree with the header")
                    seq += gap + 1
                if seq >= last:
                    raise ProtocolError("sparse sequence numbers disagree with the header")
        if not flags & USE_LAST_SPECIFIED_TS:
            if end - pos < 8:
                raise _truncated_message()
            ts = _le64(buf + pos)
            pos += 8
        key_len = -1
        if flags & HAVE_KEY:
            if pos >= end:
                raise _truncated_message()
            key_len = buf[pos]
            key_pos = pos + 1
            if key_len > end - key_pos:
                raise _truncated_message()
            pos = key_pos + key_len
        if pos >= buf_len:  # pos <= end here; see the docstring for pos == end
            raise _truncated_message()
        byte = buf[pos]
        if byte < 0x80:
            n = byte
            pos += 1
        else:
            if not _read_varint(buf, pos, end, &n, &after):
                raise _truncated_at("message length", pos)
            pos = after
        if pos > end or n > <uint64_t>(end - pos):
            raise _truncated_message()
        if sink != NULL and seq >= sink.min_seq:
            if sink.kind == SINK_KAFKA:
                _kafka_record(sink, seq, ts, buf + key_pos, key_len, buf + pos, n)
            elif sink.kind == SINK_BATCH:
                _kafka_record(sink, seq, ts if ts else sink.now, buf + key_pos, key_len,
                              buf + pos, n)
            elif sink.kind == SINK_DATA:
                if n > 0xFFFFFFFF - DATA_FIXED_PAYLOAD - <uint64_t>sink.topic_len:
                    raise ValueError("DATA frame payload over 4 GiB")
                _reserve(&sink.out, DATA_OVERHEAD + sink.topic_len + n)
                w = sink.out.data + sink.out.length
                _put_be16(w, FIGG_DATA)
                _put_be16(w + 2, FIGG_VERSION)
                _put_be32(w + 4, <uint32_t>(sink.topic_len + n + DATA_FIXED_PAYLOAD))
                _put_be32(w + 8, <uint32_t>sink.topic_len)
                memcpy(w + 12, sink.topic, sink.topic_len)
                w += 12 + sink.topic_len
                _put_be64(w, seq)
                _put_be32(w + 8, <uint32_t>n)
                memcpy(w + 12, buf + pos, n)
                sink.out.length += DATA_OVERHEAD + sink.topic_len + n
            else:
                messages.append(message_class(
                    PyBytes_FromStringAndSize(<const char*>buf + pos, <Py_ssize_t>n),
                    None if key_len < 0
                    else PyBytes_FromStringAndSize(<const char*>buf + key_pos, key_len),
                    ts, seq))
            sink.frames += 1
        pos += n
        idx += 1
    if idx != count:
        if plain_decode:
            raise ProtocolError(
                f"bundle header says {count} messages, message set holds more or less")
        raise ProtocolError(f"bundle header says {count} messages, message set holds {idx}")
    return 0


cdef int _walk_body(object source, const uint8_t* buf, Py_ssize_t end, Py_ssize_t buf_len,
                    Header* h, uint64_t first, uint64_t last, bint plain_decode,
                    object max_uncompressed, Sink* sink, list messages,
                    object message_class) except -1:
    """Walk the message set of the bundle ``buf[h.pos:end]``, decompressing it first if
    needed."""
    cdef bytearray plain
    cdef Py_ssize_t size
    if h.codec == 0:
        return _walk(buf, h.pos, end, buf_len, h.count, h.sparse, first, last, plain_decode,
                     sink, messages, message_class)
    plain = _snappy_plain(source, buf, h.pos, end, max_uncompressed)
    size = len(plain)
    return _walk(<const uint8_t*>PyByteArray_AS_STRING(plain), 0, size, size, h.count,
                 h.sparse, first, last, plain_decode, sink, messages, message_class)


def validate_bundle(bundle, max_uncompressed):
    """Check a whole bundle (no length prefix) like ``validate_bundle_py``.

    ``bundle`` is any contiguous bytes-like object. Returns ``(count, codec, first,
    last)``; ``first``/``last`` are ``None`` for a plain bundle. Raises ``ProtocolError``.
    """
    cdef Py_buffer view
    cdef Header h
    cdef const uint8_t* buf
    PyObject_GetBuffer(bundle, &view, PyBUF_SIMPLE)
    try:
        buf = <const uint8_t*>view.buf
        _parse_header(buf, 0, view.len, &h)
        _walk_body(bundle, buf, view.len, view.len, &h, h.first, h.last, False,
                   max_uncompressed, NULL, None, None)
    finally:
        PyBuffer_Release(&view)
    if h.sparse:
        return h.count, h.codec, h.first, h.last
    return h.count, h.codec, None, None


cdef inline Py_ssize_t _zigzag_size(int64_t v) noexcept nogil:
    return _varint_size((<uint64_t>v << 1) ^ <uint64_t>(v >> 63))


cdef inline Py_ssize_t _put_zigzag(uint8_t* p, int64_t v) noexcept nogil:
    return _put_varint(p, (<uint64_t>v << 1) ^ <uint64_t>(v >> 63))


cdef int _kafka_record(Sink* sink, uint64_t seq, uint64_t ts, const uint8_t* key,
                       Py_ssize_t key_len, const uint8_t* value, uint64_t n) except -1:
    """``bundles._kafka_records`` for one message: its Kafka record appended to the sink.

    Deltas are taken modulo 2**64: a bundle whose timestamps or sequence numbers do not
    fit a batch is refused by the caller after the walk, its records unused."""
    cdef int64_t ts_delta
    cdef int64_t seq_delta
    cdef Py_ssize_t body
    cdef uint8_t* w
    if sink.bundle_count == 0:
        sink.bundle_first = seq
        sink.base_ts = sink.max_ts = ts
    elif ts > sink.max_ts:
        sink.max_ts = ts
    sink.bundle_count += 1
    ts_delta = <int64_t>(ts - sink.base_ts)
    seq_delta = <int64_t>(seq - sink.bundle_first)
    # attributes, timestampDelta, offsetDelta, key, value, headers count
    body = 1 + _zigzag_size(ts_delta) + _zigzag_size(seq_delta) + 1
    if key_len < 0:
        body += 1
    else:
        body += _zigzag_size(key_len) + key_len
    body += _zigzag_size(<int64_t>n) + <Py_ssize_t>n
    _reserve(&sink.out, 10 + body)
    w = sink.out.data + sink.out.length
    w += _put_zigzag(w, body)
    w[0] = 0
    w += 1
    w += _put_zigzag(w, ts_delta)
    w += _put_zigzag(w, seq_delta)
    if key_len < 0:
        w[0] = 1  # zigzag(-1): null
        w += 1
    else:
        w += _put_zigzag(w, key_len)
        memcpy(w, key, key_len)
        w += key_len
    w += _put_zigzag(w, <int64_t>n)
    memcpy(w, value, n)
    w += n
    w[0] = 0  # no headers
    w += 1
    sink.out.length = w - sink.out.data
    return 0


# ------------------------------------------------------------------------------ chunks


cdef object _partial_prefix(const uint8_t* buf, Py_ssize_t pos, Py_ssize_t end,
                            object max_bundle_size):
    """``bundle._frame_at`` when the chunk ends inside a length prefix: a lower bound of
    the framed length (the varint has at least one more, non-zero, group)."""
    cdef Py_ssize_t have = end - pos
    cdef Py_ssize_t i
    partial = 0  # Python ints from here: the bound may pass 2**64
    for i in range(have):
        partial += <object>(buf[pos + i] & 0x7F) << (7 * i)
    need = have + 1 + partial + (<object>1 << (7 * have))
    if need > max_bundle_size:
        raise ProtocolError(f"bundle length prefix at offset {pos} over the limit")
    return need


cdef tuple _walk_chunk(object chunk, object base_seq, object min_seq, object max_bundle_size,
                       object max_uncompressed, Sink* sink, list messages,
                       object message_class):
    """``bundle.decode_chunk``: deliver every message of the framed bundles in ``chunk``
    to ``sink``; returns ``(next_seq, consumed, partial_bundle_len)``."""
    cdef Py_buffer view
    cdef Header h
    cdef const uint8_t* buf
    cdef Py_ssize_t end
    cdef Py_ssize_t pos = 0
    cdef Py_ssize_t start
    cdef Py_ssize_t bundle_end
    cdef uint64_t length
    cdef uint64_t first
    cdef uint64_t last
    cdef uint64_t prev_last = 0
    cdef bint have_prev = False
    cdef size_t section = 0
    cdef uint64_t limit = _limit(max_bundle_size, "max_bundle_size")
    # Messages are wanted from min_seq on: none when it is past every u64.
    cdef bint none_wanted = min_seq > PY_U64_MAX
    sink.min_seq = 0 if min_seq <= 0 or none_wanted else <uint64_t>min_seq
    partial = None
    PyObject_GetBuffer(chunk, &view, PyBUF_SIMPLE)
    try:
        buf = <const uint8_t*>view.buf
        end = view.len
        while pos < end:
            if buf[pos] < 0x80:
                length = buf[pos]
                start = pos + 1
            elif not _read_varint(buf, pos, end, &length, &start):
                partial = _partial_prefix(buf, pos, end, max_bundle_size)
                break
            if length == 0:
                raise ProtocolError(f"zero-length bundle at offset {pos}")
            if length > limit:
                raise ProtocolError(f"bundle of {length} bytes at offset {pos} is over the limit")
            if length > <uint64_t>(end - start):
                partial = (start - pos) + <object>length
                break
            bundle_end = start + <Py_ssize_t>length
            _parse_header(buf, start, bundle_end, &h)
            if h.sparse:
                if have_prev and h.first <= prev_last:
                    raise ProtocolError("sparse bundle goes back in sequence numbers")
                first, last = h.first, h.last
            else:
                if have_prev:
                    if prev_last == U64_MAX or h.count - 1 > U64_MAX - (prev_last + 1):
                        raise ProtocolError("bundle sequence numbers overflow u64")
                    first = prev_last + 1
                else:
                    if base_seq is None:
                        raise ProtocolError(
                            "chunk starts with a plain bundle but no base sequence")
                    if base_seq + h.count - 1 > PY_U64_MAX:
                        raise ProtocolError("bundle sequence numbers overflow u64")
                    first = base_seq
                last = first + h.count - 1
            # Bundles entirely below min_seq are skipped unread.
            if not none_wanted and last >= sink.min_seq:
                if sink.kind == SINK_KAFKA:
                    # Room for the batch header, written by the caller.
                    _reserve(&sink.out, KAFKA_BATCH_HEADER)
                    memset(sink.out.data + sink.out.length, 0, KAFKA_BATCH_HEADER)
                    sink.out.length += KAFKA_BATCH_HEADER
                    section = sink.out.length
                    sink.bundle_count = 0
                _walk_body(chunk, buf, bundle_end, end, &h, first, last, not h.sparse,
                           max_uncompressed, sink, messages, message_class)
                if sink.kind == SINK_KAFKA:
                    messages.append((first, last, sink.base_ts, sink.max_ts, h.count,
                                     h.codec, section, sink.out.length))
            prev_last = last
            have_prev = True
            pos = bundle_end
    finally:
        PyBuffer_Release(&view)
    after = (<object>prev_last + 1) if have_prev else (base_seq or 0)
    return max(min_seq, after), pos, partial


def data_frames(topic, chunk, base_seq, min_seq, max_bundle_size, max_uncompressed):
    """``data_frames_py``: the Figg DATA frames for ``topic`` (UTF-8 bytes) of the messages
    in the framed bundles of ``chunk`` with ``seq >= min_seq``, without a Python object
    per message.

    Returns ``(frames, count, next_seq, consumed, partial_bundle_len)`` and raises the
    errors of ``decode_chunk_py``.
    """
    cdef Py_buffer name
    cdef Sink sink
    sink.out.data = NULL
    sink.out.length = sink.out.capacity = 0
    sink.frames = 0
    PyObject_GetBuffer(topic, &name, PyBUF_SIMPLE)
    try:
        if name.len > 0xFFFFFFFF - DATA_FIXED_PAYLOAD:
            raise ValueError("topic too long for a DATA frame")
        sink.kind = SINK_DATA
        sink.topic = <const uint8_t*>name.buf
        sink.topic_len = name.len
        # Enough for values of about 100 bytes and a short topic (grown when needed), but
        # not a large chunk's worth up front: min_seq may skip most of it.
        _reserve(&sink.out, min(<size_t>len(chunk) + len(chunk) // 4, 4 << 20))
        next_seq, consumed, partial = _walk_chunk(chunk, base_seq, min_seq, max_bundle_size,
                                                  max_uncompressed, &sink, None, None)
        frames = PyBytes_FromStringAndSize(<const char*>sink.out.data,
                                           <Py_ssize_t>sink.out.length)
    finally:
        PyMem_Free(sink.out.data)
        PyBuffer_Release(&name)
    return frames, sink.frames, next_seq, consumed, partial


def decode_chunk(chunk, base_seq, min_seq, max_bundle_size, max_uncompressed):
    """``decode_chunk_py``, returning ``(messages, next_seq, consumed,
    partial_bundle_len)`` (the fields of ``ChunkResult``). Same errors."""
    cdef Sink sink
    cdef list messages = []
    sink.kind = SINK_MESSAGES
    sink.frames = 0
    from protocols.tank.bundle import Message  # not at import: bundle imports this module

    next_seq, consumed, partial = _walk_chunk(chunk, base_seq, min_seq, max_bundle_size,
                                              max_uncompressed, &sink, messages, Message)
    return messages, next_seq, consumed, partial


# ----------------------------------------------------------------------------- PUBLISH


cdef struct Publish:
    Py_ssize_t data_pos  # in the scanned buffer
    uint32_t data_len
    uint64_t seq


cdef object _publish_error(const uint8_t* topic, Py_ssize_t topic_len, object error):
    """The reference decodes the topic before reading on: a PUBLISH that is bad after a
    topic that is not UTF-8 fails on the topic."""
    try:
        PyUnicode_DecodeUTF8(<const char*>topic, topic_len, NULL)
    except UnicodeDecodeError:
        return ProtocolError("Publish.topic is not UTF-8")
    return error


cdef object _parse_publish(const uint8_t* p, Py_ssize_t size, Py_ssize_t* topic_pos,
                           Py_ssize_t* topic_len, Publish* record):
    """Decode the PUBLISH payload ``p[:size]`` like the generated ``Publish`` decoder
    (but for the topic's UTF-8 check). Positions are relative to ``p``. Returns ``None``
    or the error."""
    cdef Py_ssize_t pos = 0
    cdef uint32_t n
    if size < 4:
        return ProtocolError(f"truncated Publish.topic length: payload ends {size} bytes "
                             f"after offset 0")
    n = _be32(p)
    pos = 4
    if n > size - pos:
        return ProtocolError(f"Publish.topic: length {n} overruns the payload "
                             f"({size - pos} bytes left)")
    topic_pos[0] = pos
    topic_len[0] = n
    pos += n
    if size - pos < 12:
        return _publish_error(p + 4, n, ProtocolError(
            f"truncated Publish.seq_num/data length: payload ends {size - pos} bytes "
            f"after offset {pos}"))
    record.seq = _be64(p + pos)
    record.data_len = _be32(p + pos + 8)
    pos += 12
    if record.data_len > size - pos:
        return _publish_error(p + 4, n, ProtocolError(
            f"Publish.data: length {record.data_len} overruns the payload "
            f"({size - pos} bytes left)"))
    record.data_pos = pos
    pos += record.data_len
    if pos != size:
        return _publish_error(p + 4, n, ProtocolError(
            f"{size - pos} unexpected trailing bytes in Publish"))
    return None


cdef tuple _publish_run(const uint8_t* buf, Py_ssize_t topic_pos, Py_ssize_t topic_len,
                        const Publish* run, Py_ssize_t count, uint64_t timestamp):
    """``(topic, count, message_set, acks)`` of consecutive PUBLISHes to one topic."""
    cdef Py_ssize_t size = 8 + count  # the timestamp, a flags byte per message
    cdef Py_ssize_t i
    cdef uint8_t* w
    for i in range(count):
        size += _varint_size(run[i].data_len) + run[i].data_len
    message_set = PyBytes_FromStringAndSize(NULL, size)
    w = <uint8_t*>PyBytes_AS_STRING(message_set)
    w[0] = 0  # the first message carries the timestamp
    _put_le64(w + 1, timestamp)
    w += 9
    for i in range(count):
        if i:
            w[0] = USE_LAST_SPECIFIED_TS
            w += 1
        w += _put_varint(w, run[i].data_len)
        memcpy(w, buf + run[i].data_pos, run[i].data_len)
        w += run[i].data_len
    acks = PyBytes_FromStringAndSize(NULL, count * ACK_FRAME)
    w = <uint8_t*>PyBytes_AS_STRING(acks)
    for i in range(count):
        _put_be16(w, FIGG_ACK)
        _put_be16(w + 2, FIGG_VERSION)
        _put_be32(w + 4, 8)
        _put_be64(w + 8, run[i].seq)
        w += ACK_FRAME
    topic = PyBytes_FromStringAndSize(<const char*>buf + topic_pos, topic_len)
    return topic, count, message_set, acks


cdef object _refusal(uint16_t message_type):
    from protocols.translate import refusal  # not at import: translate imports this module

    return refusal(message_type)


def scan_publishes(buf, Py_ssize_t pos, Py_ssize_t end, max_payload, timestamp):
    """``scan_publishes_py`` over the Figg frames in ``buf[pos:end]``, without a Python
    object per PUBLISH.

    Returns ``(items, pos, error)`` like the reference, except that a run of PUBLISHes to
    one topic is ``(topic_bytes, count, message_set, acks)``: the caller checks that the
    topic is UTF-8 (once per run) and makes the ``PublishBatch``.
    """
    cdef Py_buffer view
    cdef const uint8_t* p
    cdef uint64_t ts = timestamp
    # payloadLen is a u32: a larger limit is no limit, a negative one refuses every frame.
    cdef long long limit = (-1 if max_payload < 0 else
                            0xFFFFFFFF if max_payload > 0xFFFFFFFF else max_payload)
    cdef uint16_t message_type
    cdef uint32_t length
    cdef Py_ssize_t start
    cdef Py_ssize_t topic_pos = 0
    cdef Py_ssize_t topic_len = 0
    cdef Py_ssize_t run_topic_pos = 0
    cdef Py_ssize_t run_topic_len = 0
    cdef Publish record
    cdef Publish* run = NULL
    cdef Py_ssize_t run_count = 0
    cdef Py_ssize_t run_capacity = 0
    cdef void* grown
    cdef list items = []
    error = None
    PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE)
    try:
        if pos < 0 or end < 0 or end > view.len:
            raise ValueError("scan bounds outside the buffer")
        p = <const uint8_t*>view.buf
        while end - pos >= FIGG_HEADER:
            message_type = _be16(p + pos)
            length = _be32(p + pos + 4)
            if <long long>length > limit:
                error = FrameTooLarge(f"frame payload of {length} bytes exceeds the maximum "
                                      f"of {max_payload}")
                break
            start = pos + FIGG_HEADER
            if end - start < length:
                break
            # The version is not looked at: the real Figg server ignores it too.
            if not (message_type == FIGG_PUBLISH or message_type == FIGG_ATTACH
                    or message_type == FIGG_DETACH or message_type == FIGG_PING):
                error = _refusal(message_type)
                break
            if message_type == FIGG_PUBLISH:
                error = _parse_publish(p + start, length, &topic_pos, &topic_len, &record)
                if error is not None:
                    break
                topic_pos += start
                record.data_pos += start
                if run_count and (topic_len != run_topic_len or memcmp(
                        p + topic_pos, p + run_topic_pos, topic_len) != 0):
                    items.append(_publish_run(p, run_topic_pos, run_topic_len, run,
                                              run_count, ts))
                    run_count = 0
                if run_count == 0:
                    run_topic_pos, run_topic_len = topic_pos, topic_len
                if run_count == run_capacity:
                    run_capacity = 2 * run_capacity if run_capacity else 64
                    grown = PyMem_Realloc(run, run_capacity * sizeof(Publish))
                    if grown == NULL:
                        raise MemoryError()
                    run = <Publish*>grown
                run[run_count] = record
                run_count += 1
            else:
                if run_count:
                    items.append(_publish_run(p, run_topic_pos, run_topic_len, run,
                                              run_count, ts))
                    run_count = 0
                items.append((message_type, PyBytes_FromStringAndSize(
                    <const char*>p + start, length)))
            pos = start + length
        if run_count:
            items.append(_publish_run(p, run_topic_pos, run_topic_len, run, run_count, ts))
    finally:
        PyMem_Free(run)
        PyBuffer_Release(&view)
    return items, pos, error


# ------------------------------------------------------------------------------ Kafka


def kafka_sections(chunk, base_seq, max_bundle_size, max_uncompressed):
    """``protocols.kafka.bundles.kafka_sections_py``: every whole framed bundle of
    ``chunk`` as the uncompressed records section of one Kafka batch, without a Python
    object per message.

    Returns ``(buffer, bundles, next_seq, consumed, partial_bundle_len)``: ``buffer``
    holds, per bundle, 61 zero bytes (room for the batch header) then its records;
    ``bundles`` has ``(first_seq, last_seq, base_ts, max_ts, count, codec, start, end)``
    per bundle, ``buffer[start:end]`` its records. Raises the errors of
    ``decode_chunk_py``, then the first bundle a batch can not carry.
    """
    cdef Sink sink
    cdef list bundles = []
    sink.kind = SINK_KAFKA
    sink.frames = 0
    sink.out.data = NULL
    sink.out.length = sink.out.capacity = 0
    try:
        _reserve(&sink.out, <size_t>len(chunk) + len(chunk) // 4 + 64)
        next_seq, consumed, partial = _walk_chunk(chunk, base_seq, 0, max_bundle_size,
                                                  max_uncompressed, &sink, bundles, None)
        buffer = PyByteArray_FromStringAndSize(<const char*>sink.out.data,
                                               <Py_ssize_t>sink.out.length)
    finally:
        PyMem_Free(sink.out.data)
    for first, last, base_ts, max_ts, count, codec, start, end in bundles:
        if last - 1 > 0x7FFFFFFFFFFFFFFF:
            raise ProtocolError(f"sequence number {last} is over Kafka's int64 offsets")
        if last - first > 0x7FFFFFFF:
            raise ProtocolError(f"bundle spans {last - first + 1} sequence numbers: "
                                "over a Kafka batch's int32 offset deltas")
        if max_ts > 0x7FFFFFFFFFFFFFFF:
            raise ProtocolError(f"timestamp {max_ts} is over Kafka's int64")
    return buffer, bundles, next_seq, consumed, partial


cdef object _corrupt(str message):
    from protocols.kafka.batch import CorruptBatch  # only on the error path

    return CorruptBatch(message)


cdef inline int64_t _kafka_varint(const uint8_t* buf, Py_ssize_t* ppos, Py_ssize_t end,
                                  bint wide, str what) except? -1:
    """``batch._zz32`` (or with ``wide``, ``batch._zigzag`` of a varlong with its int64
    check): the zigzag varint at ``buf[ppos[0]:end]``, ``ppos`` moved past it."""
    # Inline for the one- and two-byte varints that make up almost every record (14 bits
    # fit int32 and int64 alike); a call per field cost more than the whole record walk.
    cdef Py_ssize_t pos = ppos[0]
    cdef uint64_t raw
    if pos < end and buf[pos] < 0x80:
        raw = buf[pos]
        ppos[0] = pos + 1
        return <int64_t>(raw >> 1) ^ -<int64_t>(raw & 1)
    if pos + 1 < end and buf[pos + 1] < 0x80:
        raw = (buf[pos] & 0x7F) | (<uint64_t>buf[pos + 1] << 7)
        ppos[0] = pos + 2
        return <int64_t>(raw >> 1) ^ -<int64_t>(raw & 1)
    return _kafka_varint_long(buf, ppos, end, wide, what)


cdef int64_t _kafka_varint_long(const uint8_t* buf, Py_ssize_t* ppos, Py_ssize_t end,
                                bint wide, str what) except? -1:
    """:func:`_kafka_varint` for any length."""
    cdef Py_ssize_t pos = ppos[0]
    cdef int max_len = 10 if wide else 5
    cdef Py_ssize_t stop = end if end - pos < max_len else pos + max_len
    cdef uint64_t raw = 0
    cdef int shift = 0
    cdef bint big = False
    cdef uint8_t byte
    while pos < stop:
        byte = buf[pos]
        pos += 1
        raw |= <uint64_t>(byte & 0x7F) << shift
        if shift == 63 and (byte & 0x7F) > 1:
            big = True  # past 64 bits: outside int64
        if byte < 0x80:
            if wide:
                if big:
                    raise _corrupt(f"{what} outside int64")
            elif raw >> 32:
                raise _corrupt(f"{what}: varint outside int32")
            ppos[0] = pos
            return <int64_t>(raw >> 1) ^ -<int64_t>(raw & 1)
        shift += 7
    if pos >= end:
        raise _corrupt(f"truncated {what}")
    raise _corrupt(f"{what}: varint longer than {max_len} bytes")

cdef inline int64_t _skip_headers(const uint8_t* buf, Py_ssize_t* ppos,
                                  Py_ssize_t rend) except -1:
    """Step over a record's headers at ``buf[ppos[0]:rend]`` (their count, then each key
    and value), ``ppos`` moved past them; returns the count."""
    cdef int64_t nheaders = _kafka_varint(buf, ppos, rend, False, "record header count")
    cdef int64_t hlen
    cdef int64_t h
    if not nheaders:
        return 0
    if nheaders < 0 or nheaders * 2 > rend - ppos[0]:
        raise _corrupt(f"record header count {nheaders} does not fit the record")
    for h in range(nheaders):
        hlen = _kafka_varint(buf, ppos, rend, False, "header key length")
        if hlen < 0 or hlen > rend - ppos[0]:
            raise _corrupt(f"header key length {hlen} does not fit the record")
        ppos[0] += hlen
        hlen = _kafka_varint(buf, ppos, rend, False, "header value length")
        if hlen >= 0:
            if hlen > rend - ppos[0]:
                raise _corrupt("header value overruns the record")
            ppos[0] += hlen
        elif hlen != -1:
            raise _corrupt(f"header value length {hlen}")
    return nheaders

cdef inline int64_t _record_span(const uint8_t* buf, Py_ssize_t* ppos, Py_ssize_t rend,
                                 bint value, Py_ssize_t* start) except? -2:
    """A record's key (or, with ``value``, its value) at ``buf[ppos[0]:rend]``: its length
    (-1: null), where it starts in ``start[0]``, ``ppos`` moved past it."""
    cdef int64_t n
    if value:
        n = _kafka_varint(buf, ppos, rend, False, "record value length")
    else:
        n = _kafka_varint(buf, ppos, rend, False, "record key length")
    if n >= 0:
        if n > rend - ppos[0]:
            raise _corrupt("record value overruns the record" if value
                           else "record key overruns the record")
        start[0] = ppos[0]
        ppos[0] += n
    elif n != -1:
        raise _corrupt(f"record {'value' if value else 'key'} length {n}")
    return n




def kafka_to_tank(section, Py_ssize_t pos, Py_ssize_t end, Py_ssize_t count, int64_t base_ts,
                  forced, append_time, bint build, bint with_head):
    """A produced batch's records (``buf[pos:end]`` of ``section``, ``count`` of them,
    uncompressed) checked like ``batch.decode_records`` and, with ``build``, mapped like
    ``bundles.batch_to_messages`` (offset deltas 0, 1, ...; ``forced`` is the timestamp
    of every record of a LogAppendTime batch, ``append_time`` the one of records without
    one) and encoded like ``bundle.encode_bundle``'s plain message set, in one pass.

    Returns ``(out, index, why)``: ``out`` the message set (with ``with_head``, the whole
    uncompressed bundle), or ``None`` when the record at ``index`` can not be a Tank
    message (``why``) or nothing was built. Raises ``CorruptBatch`` like the reference.
    """
    cdef Py_buffer view
    cdef const uint8_t* buf
    cdef Py_ssize_t i
    cdef Py_ssize_t length
    cdef Py_ssize_t rend
    cdef int64_t ts_delta
    cdef int64_t off_delta
    cdef int64_t klen
    cdef int64_t vlen
    cdef int64_t nheaders
    cdef Py_ssize_t key_pos = 0
    cdef Py_ssize_t value_pos = 0
    cdef int64_t ts
    cdef uint64_t uts
    cdef bint over = False
    cdef uint64_t last_ts = 0
    cdef bint have_last = False
    cdef bint have_forced = forced is not None
    cdef int64_t forced_ts = forced if have_forced else 0
    cdef bint have_append = append_time is not None
    cdef int64_t append_ts = append_time if have_append else 0
    cdef Py_ssize_t refused = -1
    cdef uint8_t flags
    cdef uint8_t* w = NULL
    cdef OutBuf out
    why = None
    out.data = NULL
    out.length = out.capacity = 0
    PyObject_GetBuffer(section, &view, PyBUF_SIMPLE)
    try:
        if pos < 0 or end < pos or end > view.len or count < 0:
            raise ValueError("records bounds outside the buffer")
        buf = <const uint8_t*>view.buf
        if count * 7 > end - pos:
            raise _corrupt(f"batch claims {count} records in {end - pos} bytes")
        if build:
            # A Tank message takes at most 4 bytes more than its Kafka record.
            _reserve(&out, 16 + (end - pos) + 4 * count)
            w = out.data
            if with_head:
                if count <= 15:
                    w[0] = <uint8_t>(count << 2)
                    w += 1
                else:
                    w[0] = 0
                    w += 1 + _put_varint(w + 1, <uint64_t>count)
        for i in range(count):
            length = _kafka_varint(buf, &pos, end, False, "record length")
            rend = pos + length
            if length < 6 or rend > end:
                raise _corrupt(f"record length {length} does not fit the batch")
            pos += 1  # attributes (unused)
            ts_delta = _kafka_varint(buf, &pos, rend, True, "record timestamp delta")
            off_delta = _kafka_varint(buf, &pos, rend, False, "record offset delta")
            klen = _record_span(buf, &pos, rend, False, &key_pos)
            vlen = _record_span(buf, &pos, rend, True, &value_pos)
            nheaders = _skip_headers(buf, &pos, rend)
            if pos != rend:
                raise _corrupt("record length disagrees with its fields")
            if not build or refused >= 0:
                continue
            # batch_to_messages' checks, in its order.
            if off_delta != i:
                refused, why = i, f"offset delta {off_delta}, expected {i}"
                continue
            if vlen < 0:
                refused, why = i, ("null value (Tank messages always have a value; "
                                   "send an empty value instead)")
                continue
            if klen > 255:
                refused, why = i, f"key of {klen} bytes (Tank keys are at most 255)"
                continue
            if nheaders:
                refused, why = i, (f"{nheaders} record header(s) (Tank messages have no "
                                   "headers)")
                continue
            # The timestamp as a u64 (Python ints in the reference).
            if have_forced:
                ts = forced_ts
            elif ts_delta > 0 and base_ts > 0x7FFFFFFFFFFFFFFF - ts_delta:
                ts = 0  # over int64 but within u64: a valid Tank timestamp
                over = True
            elif ts_delta < 0 and base_ts < -0x7FFFFFFFFFFFFFFF - 1 - ts_delta:
                refused, why = i, (f"timestamp {<object>base_ts + <object>ts_delta} (Tank "
                                   "timestamps are milliseconds since 1970)")
                continue
            else:
                ts = base_ts + ts_delta
            if ts < 0:
                if ts != -1 or not have_append:
                    refused, why = i, (f"timestamp {ts} (Tank timestamps are milliseconds "
                                       "since 1970)")
                    continue
                uts = <uint64_t>append_ts
            elif over:
                over = False
                uts = <uint64_t>base_ts + <uint64_t>ts_delta
            else:
                uts = <uint64_t>ts
            flags = HAVE_KEY if klen >= 0 else 0
            if have_last and uts == last_ts:
                w[0] = flags | USE_LAST_SPECIFIED_TS
                w += 1
            else:
                w[0] = flags
                _put_le64(w + 1, uts)
                w += 9
                last_ts = uts
                have_last = True
            if klen >= 0:
                w[0] = <uint8_t>klen
                memcpy(w + 1, buf + key_pos, klen)
                w += 1 + klen
            w += _put_varint(w, <uint64_t>vlen)
            memcpy(w, buf + value_pos, vlen)
            w += vlen
        if pos != end:
            raise _corrupt(f"{end - pos} bytes after the batch's {count} records")
        if not build or refused >= 0:
            return None, refused, why
        return PyBytes_FromStringAndSize(<const char*>out.data, w - out.data), -1, None
    finally:
        PyMem_Free(out.data)
        PyBuffer_Release(&view)


# ------------------------------------------------------------ upstream Kafka client

#: tank_to_kafka_batch's records are built here, kept from call to call: a fresh buffer of
#: a batch's size each time cost more in page faults and growth copies than the walk
#: itself. Taken by one call at a time (the compressors release the GIL: a call from
#: another thread meanwhile builds in a buffer of its own); one larger than
#: _SCRATCH_KEPT is given back after the call.
cdef OutBuf _scratch
cdef bint _scratch_busy = False
DEF _SCRATCH_KEPT = 16 * 1024 * 1024


cdef Py_ssize_t _plain_size_hint(const uint8_t* buf, Py_ssize_t length, Header* h):
    """How many bytes the message set of the bundle ``buf[:length]`` (header parsed into
    ``h``) takes once uncompressed: its Snappy preamble, trusted up to the largest ratio
    Snappy reaches (a bad claim is refused by the walk; this only sizes a buffer)."""
    cdef uint64_t claim
    cdef Py_ssize_t after
    if h.codec == 0:
        return length
    if not _read_varint(buf, h.pos, length, &claim, &after):
        return length
    if claim > <uint64_t>(length * 32):
        return length * 32
    return <Py_ssize_t>claim


def tank_to_kafka_batch(bundles, int64_t producer_id, int producer_epoch,
                        int64_t base_sequence, uint64_t now_ms, int codec, max_uncompressed):
    """``upstream_codec.bundles_to_record_batch_py`` past its argument checks (shared):
    the plain Tank ``bundles`` as one Kafka record batch, ``(batch, count)``, without a
    Python object per message. Same results and errors."""
    global _scratch, _scratch_busy
    cdef Sink sink
    cdef Py_buffer view
    cdef Header h
    cdef const uint8_t* buf
    cdef uint64_t total = 0
    cdef Py_ssize_t hint = 0
    cdef Py_ssize_t size
    cdef uint8_t* w
    cdef bint own = not _scratch_busy
    sink.kind = SINK_BATCH
    sink.frames = 0
    sink.min_seq = 0
    sink.now = now_ms
    sink.bundle_count = 0
    sink.bundle_first = sink.base_ts = sink.max_ts = 0
    if own:
        sink.out = _scratch
        _scratch_busy = True
    else:
        sink.out.data = NULL
        sink.out.capacity = 0
    sink.out.length = 0
    try:
        for bundle in bundles:
            PyObject_GetBuffer(bundle, &view, PyBUF_SIMPLE)
            try:
                _parse_header(<const uint8_t*>view.buf, 0, view.len, &h)
                hint += _plain_size_hint(<const uint8_t*>view.buf, view.len, &h)
            finally:
                PyBuffer_Release(&view)
        # A record takes about as much as its Tank message.
        _reserve(&sink.out, KAFKA_BATCH_HEADER + hint + hint // 8 + 64)
        sink.out.length = KAFKA_BATCH_HEADER
        for bundle in bundles:
            PyObject_GetBuffer(bundle, &view, PyBUF_SIMPLE)
            try:
                buf = <const uint8_t*>view.buf
                _parse_header(buf, 0, view.len, &h)
                if h.sparse:
                    raise ValueError("a sparse bundle names its sequence numbers; a produced "
                                     "batch is numbered by the upstream")
                # Numbered on from the messages so far: offset deltas of one batch.
                _walk_body(bundle, buf, view.len, view.len, &h, total, total + h.count - 1,
                           True, max_uncompressed, &sink, None, None)
            finally:
                PyBuffer_Release(&view)
            total += h.count
        if total > 0x7FFFFFFF:
            raise ValueError(f"{total} messages are over a record batch's int32 count")
        if sink.max_ts > <uint64_t>INT64_MAX:
            raise ValueError(f"timestamp {sink.max_ts} is over Kafka's int64")
        size = <Py_ssize_t>sink.out.length - KAFKA_BATCH_HEADER
        if codec == 0:
            batch = PyBytes_FromStringAndSize(NULL, KAFKA_BATCH_HEADER + size)
            w = <uint8_t*>PyBytes_AS_STRING(batch)
            memcpy(w + KAFKA_BATCH_HEADER, sink.out.data + KAFKA_BATCH_HEADER, size)
        else:
            from protocols.kafka.codecs import Compression, compress

            # Compressed straight from the buffer: a view, released before it is reused.
            records = PyMemoryView_FromMemory(<char*>sink.out.data + KAFKA_BATCH_HEADER,
                                              size, PyBUF_READ)
            try:
                body = compress(Compression(codec), records)
            finally:
                records.release()
            size = len(body)
            batch = PyBytes_FromStringAndSize(NULL, KAFKA_BATCH_HEADER + size)
            w = <uint8_t*>PyBytes_AS_STRING(batch)
            memcpy(w + KAFKA_BATCH_HEADER, PyBytes_AS_STRING(<bytes?>body), size)
    finally:
        if own:
            if sink.out.capacity > _SCRATCH_KEPT:
                PyMem_Free(sink.out.data)
                sink.out.data = NULL
                sink.out.capacity = 0
            _scratch = sink.out
            _scratch_busy = False
        else:
            PyMem_Free(sink.out.data)
    if size > 0x7FFFFFFF - (KAFKA_BATCH_HEADER - 12):
        raise ValueError(f"records section of {size} bytes is over a record batch's int32 "
                         "length")
    _put_be64(w, 0)  # base offset
    _put_be32(w + 8, <uint32_t>(KAFKA_BATCH_HEADER - 12 + size))
    _put_be32(w + 12, 0xFFFFFFFF)  # partition leader epoch -1
    w[16] = 2  # magic
    _put_be16(w + 21, <uint16_t>codec)
    _put_be32(w + 23, <uint32_t>(total - 1))
    _put_be64(w + 27, sink.base_ts)
    _put_be64(w + 35, sink.max_ts)
    _put_be64(w + 43, <uint64_t>producer_id)
    _put_be16(w + 51, <uint16_t>producer_epoch)
    _put_be32(w + 53, <uint32_t>base_sequence)
    _put_be32(w + 57, <uint32_t>total)
    with memoryview(batch) as whole:
        crc = crc32c.crc32c(whole[21:])
    _put_be32(w + 17, <uint32_t>crc)  # the bytes are new: no one else has seen them
    return batch, <object>total


cdef struct KRec:
    # One record of a fetched batch: its timestamp delta (once mapped, its Tank
    # timestamp), offset delta, and where its key and value are in the records section
    # (length -1: null). 40 bytes: a batch's records take at least 7 bytes each.
    int64_t ts
    Py_ssize_t key_pos
    Py_ssize_t value_pos
    int32_t delta
    int32_t key_len
    int32_t value_len


cdef int _kafka_records(const uint8_t* buf, Py_ssize_t pos, Py_ssize_t end,
                        Py_ssize_t count, KRec* recs) except -1:
    """``batch.decode_records``: the ``count`` records filling ``buf[pos:end]`` into
    ``recs``, with the same CorruptBatch for the same fault."""
    cdef Py_ssize_t i, length, rend
    cdef int64_t klen, vlen
    if count * 7 > end - pos:
        raise _corrupt(f"batch claims {count} records in {end - pos} bytes")
    for i in range(count):
        length = _kafka_varint(buf, &pos, end, False, "record length")
        rend = pos + length
        if length < 6 or rend > end:
            raise _corrupt(f"record length {length} does not fit the batch")
        pos += 1  # attributes (unused)
        recs[i].ts = _kafka_varint(buf, &pos, rend, True, "record timestamp delta")
        recs[i].delta = <int32_t>_kafka_varint(buf, &pos, rend, False, "record offset delta")
        recs[i].key_len = <int32_t>_record_span(buf, &pos, rend, False, &recs[i].key_pos)
        recs[i].value_len = <int32_t>_record_span(buf, &pos, rend, True, &recs[i].value_pos)
        _skip_headers(buf, &pos, rend)  # headers are not carried
        if pos != rend:
            raise _corrupt("record length disagrees with its fields")
    if pos != end:
        raise _corrupt(f"{end - pos} bytes after the batch's {count} records")
    return 0


cdef object _tank_bundle(const uint8_t* buf, const KRec* recs, Py_ssize_t n, bint sparse,
                         uint64_t seq_base):
    """``frame_bundle(encode_bundle(messages, codec=NONE, sparse=sparse))`` of the mapped
    records ``recs[:n]`` (values and keys in ``buf``, sequence numbers ``seq_base`` +
    offset delta, timestamps u64), sized first, then written."""
    cdef Py_ssize_t size = 1
    cdef Py_ssize_t j, vlen, framed
    cdef uint64_t last_ts = 0
    cdef uint64_t first = seq_base + <uint64_t>recs[0].delta
    cdef uint64_t last = seq_base + <uint64_t>recs[n - 1].delta
    cdef uint8_t flags
    cdef uint8_t* w
    if n > 15:
        size += _varint_size(<uint64_t>n)
    if sparse:
        size += 8
        if n > 1:
            size += _varint_size(last - first - 1)
    for j in range(n):
        size += 1
        if sparse and 0 < j < n - 1 and recs[j].delta != recs[j - 1].delta + 1:
            size += _varint_size(<uint64_t>(recs[j].delta - recs[j - 1].delta - 1))
        if j == 0 or <uint64_t>recs[j].ts != last_ts:
            size += 8
            last_ts = <uint64_t>recs[j].ts
        if recs[j].key_len >= 0:
            size += 1 + recs[j].key_len
        vlen = recs[j].value_len if recs[j].value_len > 0 else 0
        size += _varint_size(<uint64_t>vlen) + vlen
    framed = _varint_size(<uint64_t>size) + size
    out = PyBytes_FromStringAndSize(NULL, framed)
    w = <uint8_t*>PyBytes_AS_STRING(out)
    w += _put_varint(w, <uint64_t>size)
    flags = SPARSE_BIT if sparse else 0  # codec none
    if n <= 15:
        w[0] = flags | <uint8_t>(n << 2)
        w += 1
    else:
        w[0] = flags
        w += 1 + _put_varint(w + 1, <uint64_t>n)
    if sparse:
        _put_le64(w, first)
        w += 8
        if n > 1:
            w += _put_varint(w, last - first - 1)
    for j in range(n):
        flags = HAVE_KEY if recs[j].key_len >= 0 else 0
        if j and <uint64_t>recs[j].ts == last_ts:
            flags |= USE_LAST_SPECIFIED_TS
        if sparse and 0 < j < n - 1:
            if recs[j].delta == recs[j - 1].delta + 1:
                w[0] = flags | SEQ_NUM_PREV_PLUS_ONE
                w += 1
            else:
                w[0] = flags
                w += 1 + _put_varint(w + 1, <uint64_t>(recs[j].delta - recs[j - 1].delta - 1))
        else:
            w[0] = flags
            w += 1
        if not flags & USE_LAST_SPECIFIED_TS:
            last_ts = <uint64_t>recs[j].ts
            _put_le64(w, last_ts)
            w += 8
        if recs[j].key_len >= 0:
            w[0] = <uint8_t>recs[j].key_len
            memcpy(w + 1, buf + recs[j].key_pos, recs[j].key_len)
            w += 1 + recs[j].key_len
        vlen = recs[j].value_len if recs[j].value_len > 0 else 0
        w += _put_varint(w, <uint64_t>vlen)
        if vlen:
            memcpy(w, buf + recs[j].value_pos, vlen)
            w += vlen
    return out


cdef inline uint64_t _record_ts(int64_t base_ts, int64_t delta) noexcept nogil:
    """``max(base_ts + delta, 0)`` as a u64 (the sum may pass int64, not u64)."""
    cdef int64_t ts
    if delta > 0 and base_ts > INT64_MAX - delta:
        return <uint64_t>base_ts + <uint64_t>delta
    if delta < 0 and base_ts < INT64_MIN - delta:
        return 0
    ts = base_ts + delta
    return <uint64_t>ts if ts > 0 else 0


def kafka_batches_to_bundles(records, int64_t from_offset, after_seq, max_decompressed,
                             max_batch_size, bundle_class):
    """``upstream_codec.record_batches_to_bundles_py`` past its argument checks (shared):
    ``(bundles, next_offset, refused)``, ``refused`` the ``(offset, key length)`` of the
    record that stopped the read, or None. No Python object per record; each batch is
    CRC-checked by ``crc32c`` and, when compressed, opened by ``codecs.decompress``."""
    from protocols.kafka.batch import BatchTooLarge, UnsupportedMagic
    from protocols.kafka.codecs import decompress

    cdef Py_buffer view
    cdef Py_buffer sview
    cdef bint have_section = False
    cdef const uint8_t* p
    cdef const uint8_t* sbuf
    cdef Py_ssize_t pos = 0, end, have, size, sstart, sstop, i, k0, k1
    cdef int32_t length, count, last_delta
    cdef int64_t base_offset, base_ts, max_ts
    cdef int attributes
    cdef uint32_t crc
    cdef uint64_t forced = 0
    cdef uint64_t offset, seq_base
    cdef int64_t prev
    cdef KRec* recs = NULL
    cdef Py_ssize_t capacity = 0
    cdef void* grown
    cdef list out = []
    next_offset = from_offset
    previous = after_seq
    previous_end = None
    refused = None
    PyObject_GetBuffer(records, &view, PyBUF_SIMPLE)
    whole = memoryview(records)
    try:
        p = <const uint8_t*>view.buf
        end = view.len
        while pos < end:
            # batch.open_batch, in its order.
            have = end - pos
            if have < 17:
                break
            length = <int32_t>_be32(p + pos + 8)
            if p[pos + 16] != 2:
                raise UnsupportedMagic(p[pos + 16])
            if length < KAFKA_BATCH_HEADER - 12:
                raise _corrupt(f"record batch length {length} is under the header's")
            size = 12 + <Py_ssize_t>length
            if size > max_batch_size:
                raise BatchTooLarge(size, max_batch_size)
            if have < size:
                break
            crc = _be32(p + pos + 17)
            actual = crc32c.crc32c(whole[pos + 21:pos + size])
            if actual != crc:
                raise _corrupt(f"record batch CRC {crc:#010x}, computed {actual:#010x}")
            count = <int32_t>_be32(p + pos + 57)
            if count < 0:
                raise _corrupt(f"record batch count {count}")
            attributes = <int16_t>_be16(p + pos + 21)
            if attributes & 7:
                section = decompress(attributes & 7,
                                     bytes(whole[pos + KAFKA_BATCH_HEADER:pos + size]),
                                     max_decompressed)
                PyObject_GetBuffer(section, &sview, PyBUF_SIMPLE)
                have_section = True
                sbuf = <const uint8_t*>sview.buf
                sstart, sstop = 0, sview.len
            else:
                sbuf = p
                sstart, sstop = pos + KAFKA_BATCH_HEADER, pos + size
            base_offset = <int64_t>_be64(p + pos)
            last_delta = <int32_t>_be32(p + pos + 23)
            base_ts = <int64_t>_be64(p + pos + 27)
            max_ts = <int64_t>_be64(p + pos + 35)
            pos += size
            # The batch's place.
            if base_offset < 0:
                raise _corrupt(f"record batch base offset {base_offset} is negative")
            if previous_end is not None and base_offset < previous_end:
                raise _corrupt(f"the batch at base offset {base_offset} starts before the "
                               f"previous batch ends (offset {previous_end})")
            batch_end = <object>base_offset + last_delta + 1
            previous_end = batch_end
            if attributes & 0x20:  # a control batch
                next_offset = max(next_offset, batch_end)
            else:
                if <Py_ssize_t>count * 7 > sstop - sstart:  # before taking room for them
                    raise _corrupt(f"batch claims {count} records in {sstop - sstart} bytes")
                if count > capacity:
                    grown = PyMem_Realloc(recs, count * sizeof(KRec))
                    if grown == NULL:
                        raise MemoryError()
                    recs = <KRec*>grown
                    capacity = count
                _kafka_records(sbuf, sstart, sstop, count, recs)
                prev = -1
                for i in range(count):
                    if recs[i].delta <= prev:
                        raise _corrupt(f"record offset delta {recs[i].delta} after {prev}")
                    if recs[i].delta > last_delta:
                        raise _corrupt(f"record offset delta {recs[i].delta} past the "
                                       f"batch's lastOffsetDelta {last_delta}")
                    prev = recs[i].delta
                # Offsets increase: the records below from_offset come first.
                k0 = 0
                while k0 < count and <uint64_t>base_offset + <uint64_t>recs[k0].delta \
                        < <uint64_t>from_offset:
                    k0 += 1
                forced = <uint64_t>max_ts if max_ts > 0 else 0
                k1 = k0
                while k1 < count:
                    if recs[k1].key_len > 255:
                        offset = <uint64_t>base_offset + <uint64_t>recs[k1].delta
                        refused = (offset, recs[k1].key_len)
                        next_offset = offset
                        break
                    # The u64 timestamp kept in the int64 field (written back as a u64).
                    recs[k1].ts = <int64_t>(forced if attributes & 0x08
                                            else _record_ts(base_ts, recs[k1].ts))
                    k1 += 1
                if k1 > k0:
                    seq_base = <uint64_t>base_offset + 1
                    first_seq = seq_base + <uint64_t>recs[k0].delta
                    last_seq = seq_base + <uint64_t>recs[k1 - 1].delta
                    plain = (recs[k1 - 1].delta - recs[k0].delta == k1 - k0 - 1
                             and (previous is None or first_seq == previous + 1))
                    out.append(bundle_class(first_seq, last_seq,
                                            _tank_bundle(sbuf, recs + k0, k1 - k0, not plain,
                                                         seq_base),
                                            plain, k1 - k0))
                    previous = last_seq
                if refused is None:
                    next_offset = max(next_offset, batch_end)
            if have_section:
                PyBuffer_Release(&sview)
                have_section = False
            if refused is not None:
                break
    finally:
        if have_section:
            PyBuffer_Release(&sview)
        whole.release()
        PyBuffer_Release(&view)
        PyMem_Free(recs)
    return out, next_offset, refused


# ------------------------------------------------------------------------- Tank requests

cdef enum:
    TANK_HEADER = 5
    TANK_PRODUCE = 0x01
    # Longest bundle length varint read here (35 bits); longer ones go to the reference.
    TANK_VARINT_MAX = 5
    TANK_UNKNOWN_PARTITION = 1
    TANK_OTHER_LEADER = 0xFC
    TANK_READ_ONLY = 0xFE
    TANK_UNKNOWN_TOPIC = 0xFF


cdef inline uint16_t _le16(const uint8_t* p) noexcept nogil:
    return <uint16_t>(p[0] | (<uint16_t>p[1] << 8))


cdef inline uint32_t _le32(const uint8_t* p) noexcept nogil:
    return (<uint32_t>p[0] | (<uint32_t>p[1] << 8) | (<uint32_t>p[2] << 16)
            | (<uint32_t>p[3] << 24))


cdef object _utf8(const uint8_t* p, Py_ssize_t n):
    """``p[:n]`` decoded, or None when it is not UTF-8 (the reference then says why)."""
    try:
        return PyUnicode_DecodeUTF8(<const char*>p, n, NULL)
    except UnicodeDecodeError:
        return None


cdef inline Py_ssize_t _bundle_length(const uint8_t* b, Py_ssize_t pos, Py_ssize_t n,
                                      uint64_t* value) noexcept nogil:
    """The bundle length varint at ``b[pos:n]`` into ``value``; where it ends, or -1 when
    it is truncated, over-long or longer than TANK_VARINT_MAX bytes."""
    cdef uint64_t v = 0
    cdef int shift = 0
    cdef int k = 0
    cdef uint8_t byte
    while True:
        if pos >= n or k == TANK_VARINT_MAX:
            return -1
        byte = b[pos]
        pos += 1
        k += 1
        v |= <uint64_t>(byte & 0x7F) << shift
        if byte < 0x80:
            if byte == 0 and shift > 0:
                return -1
            value[0] = v
            return pos
        shift += 7


cdef object _produce_pass(const uint8_t* b, Py_ssize_t n, object make_batch,
                          object pass_type):
    """The ProducePass of the Produce payload ``b[:n]``, or None for anything the
    reference decoder must look at (it raises the error, or reads what this does not)."""
    cdef Py_ssize_t pos = 6
    cdef Py_ssize_t stop
    cdef Py_ssize_t blen
    cdef Py_ssize_t size = 0
    cdef uint64_t v
    cdef unsigned int t, j, topic_count, part_count
    cdef uint16_t partition
    cdef list layout = []
    cdef list batches = []
    cdef list partitions
    if n < 7:
        return None
    client_version = _le16(b)
    request_id = _le32(b + 2)
    stop = pos + 1 + b[pos]
    if stop > n:
        return None
    client_id = _utf8(b + pos + 1, stop - pos - 1)
    if client_id is None:
        return None
    pos = stop
    if n - pos < 5:
        return None
    required_acks = b[pos]
    ack_timeout_ms = _le32(b + pos + 1)
    pos += 5
    if n - pos < 1:
        return None
    topic_count = b[pos]
    pos += 1
    if topic_count > n - pos:
        return None
    for t in range(topic_count):
        if pos >= n:
            return None
        stop = pos + 1 + b[pos]
        if stop > n:
            return None
        name = _utf8(b + pos + 1, stop - pos - 1)
        if name is None:
            return None
        pos = stop
        if n - pos < 1:
            return None
        part_count = b[pos]
        pos += 1
        if part_count > n - pos:
            return None
        partitions = []
        for j in range(part_count):
            if n - pos < 2:
                return None
            partition = _le16(b + pos)
            pos += 2
            pos = _bundle_length(b, pos, n, &v)
            if pos < 0:
                return None  # the reference names what is wrong
            if v > <uint64_t>(n - pos):
                return None
            blen = <Py_ssize_t>v
            bundle = PyBytes_FromStringAndSize(<const char*>b + pos, blen)
            pos += blen
            size += blen
            batches.append(make_batch(name, partition, bundle))
            partitions.append(partition)
        layout.append((name, tuple(partitions)))
    if pos != n:
        return None
    return tuple.__new__(pass_type, (client_version, request_id, client_id, required_acks,
                                     ack_timeout_ms, tuple(layout), batches, size))


def scan_tank_requests(buf, Py_ssize_t pos, Py_ssize_t end, max_payload, make_batch,
                       pass_type, reference):
    """``protocols.tank.scan.scan_requests_py`` without a Python record per topic or
    partition: a Produce becomes ``pass_type`` (the ``ProducePass``) straight from the
    bytes. A Produce payload this does not read cleanly (malformed, truncated, a name that
    is not UTF-8, a varint over 5 bytes) goes to ``reference(payload, make_batch)``, whose
    pass or ProtocolError it reports.
    """
    cdef Py_buffer view
    cdef const uint8_t* p
    cdef long long limit = (-1 if max_payload < 0 else
                            0xFFFFFFFF if max_payload > 0xFFFFFFFF else max_payload)
    cdef uint8_t msg_id
    cdef uint32_t length
    cdef Py_ssize_t start
    cdef list items = []
    error = None
    PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE)
    try:
        if pos < 0 or end < 0 or end > view.len or pos > end:
            raise ValueError("scan bounds outside the buffer")
        p = <const uint8_t*>view.buf
        while end - pos >= TANK_HEADER:
            msg_id = p[pos]
            length = _le32(p + pos + 1)
            if <long long>length > limit:
                error = FrameTooLarge(f"frame payload of {length} bytes exceeds the maximum "
                                      f"of {max_payload}")
                break
            start = pos + TANK_HEADER
            if end - start < length:
                break
            if msg_id == TANK_PRODUCE:
                item = _produce_pass(p + start, length, make_batch, pass_type)
                if item is None:
                    try:
                        item = reference(PyBytes_FromStringAndSize(
                            <const char*>p + start, length), make_batch)
                    except ProtocolError as exc:
                        error = exc
                        break
                items.append(item)
            else:
                items.append((msg_id, PyBytes_FromStringAndSize(<const char*>p + start,
                                                                length)))
            pos = start + length
    finally:
        PyBuffer_Release(&view)
    return items, pos, error


def tank_produce_response(request_id, layout, outcomes):
    """``gateway.tank.produce.produce_response_frame_py``: the whole ProduceResponse frame
    for a ProducePass's ``request_id`` and ``layout`` from its batches' ``outcomes`` (each
    with a ``code``), and whether every code is OK."""
    cdef Py_ssize_t total = 0
    cdef Py_ssize_t i = 0
    cdef Py_ssize_t k, parts, w, length
    cdef int code, first
    cdef bint mixed, wide
    cdef bint ok = True
    cdef uint8_t* out
    cdef uint32_t rid = request_id
    cdef uint8_t* c
    for entry in layout:
        total += len(entry[1])
    if len(outcomes) != total:
        raise ValueError(f"{len(outcomes)} outcomes for the {total} partitions requested")
    codes = PyByteArray_FromStringAndSize(NULL, total if total else 1)
    c = <uint8_t*>PyByteArray_AS_STRING(codes)
    for k in range(total):
        value = outcomes[k].code
        if not 0 <= value <= 0xFF or value == TANK_OTHER_LEADER:
            raise ValueError(f"produce code {int(value)} cannot be answered")
        code = value
        c[k] = <uint8_t>code
        if code:
            ok = False
    frame = PyBytes_FromStringAndSize(NULL, TANK_HEADER + 4 + total)
    out = <uint8_t*>PyBytes_AS_STRING(frame)
    w = TANK_HEADER + 4
    for entry in layout:
        parts = len(entry[1])
        if not parts:
            continue
        first = c[i]
        mixed = False
        wide = False
        for k in range(i, i + parts):
            if c[k] != first:
                mixed = True
            if c[k] == TANK_UNKNOWN_TOPIC or c[k] == TANK_READ_ONLY:
                wide = True
        if wide and not mixed:
            out[w] = <uint8_t>first  # one code covers the whole topic
            w += 1
        else:
            for k in range(i, i + parts):
                code = c[k]
                if code == TANK_UNKNOWN_TOPIC or code == TANK_READ_ONLY:
                    code = TANK_UNKNOWN_PARTITION
                out[w] = <uint8_t>code
                w += 1
        i += parts
    out[0] = TANK_PRODUCE
    length = w - TANK_HEADER
    out[1] = <uint8_t>length
    out[2] = <uint8_t>(length >> 8)
    out[3] = <uint8_t>(length >> 16)
    out[4] = <uint8_t>(length >> 24)
    out[5] = <uint8_t>rid
    out[6] = <uint8_t>(rid >> 8)
    out[7] = <uint8_t>(rid >> 16)
    out[8] = <uint8_t>(rid >> 24)
    return frame[:w], ok


cdef Py_ssize_t _single_produce(const uint8_t* b, Py_ssize_t n, uint32_t* request_id,
                                uint16_t* partition, Py_ssize_t* name_at,
                                Py_ssize_t* name_len, Py_ssize_t* bundle_at):
    """Where the one bundle of the Produce payload ``b[:n]`` starts (``bundle_at``, its
    length returned) when the payload is one topic with one partition and reads cleanly;
    -1 for anything else (the general path decodes it and says what is wrong)."""
    cdef Py_ssize_t pos = 6
    cdef Py_ssize_t stop
    cdef uint64_t v = 0
    if n < 7:
        return -1
    request_id[0] = _le32(b + 2)
    stop = pos + 1 + b[pos]
    if stop > n or _utf8(b + pos + 1, stop - pos - 1) is None:
        return -1
    pos = stop + 5  # required acks, ack timeout
    if n - pos < 2 or b[pos] != 1:  # one topic
        return -1
    pos += 1
    stop = pos + 1 + b[pos]
    if stop > n:
        return -1
    name_at[0] = pos + 1
    name_len[0] = stop - pos - 1
    pos = stop
    if n - pos < 3 or b[pos] != 1:  # one partition
        return -1
    partition[0] = _le16(b + pos + 1)
    pos = _bundle_length(b, pos + 3, n, &v)
    if pos < 0 or v != <uint64_t>(n - pos):  # the bundle ends the payload
        return -1
    bundle_at[0] = pos
    return <Py_ssize_t>v


cdef bint _plain_count(object bundle, object max_uncompressed, uint64_t* count):
    """Whether ``bundle`` is valid and not sparse (its message count in ``count``)."""
    cdef Py_buffer view
    cdef Header h
    PyObject_GetBuffer(bundle, &view, PyBUF_SIMPLE)
    try:
        _parse_header(<const uint8_t*>view.buf, 0, view.len, &h)
        _walk_body(bundle, <const uint8_t*>view.buf, view.len, view.len, &h, h.first, h.last,
                   False, max_uncompressed, NULL, None, None)
    except ProtocolError:
        return False
    finally:
        PyBuffer_Release(&view)
    count[0] = h.count
    return not h.sparse


def tank_produce_run(buf, Py_ssize_t pos, Py_ssize_t end, max_payload, appenders,
                     Py_ssize_t room, max_uncompressed):
    """``protocols.tank.scan.produce_run_py``: append and answer the run of plain
    single-partition Produces at ``buf[pos:end]`` through ``appenders``; returns
    ``(pos, responses, count)``."""
    cdef Py_buffer view
    cdef const uint8_t* p
    cdef long long limit = (-1 if max_payload < 0 else
                            0xFFFFFFFF if max_payload > 0xFFFFFFFF else max_payload)
    cdef uint32_t length, request_id
    cdef uint16_t partition
    cdef Py_ssize_t start, name_at, name_len, bundle_at, bundle_len
    cdef Py_ssize_t count = 0
    cdef uint64_t messages
    cdef OutBuf out
    cdef uint8_t* w
    out.data = NULL
    out.length = 0
    out.capacity = 0
    PyObject_GetBuffer(buf, &view, PyBUF_SIMPLE)
    try:
        if pos < 0 or end < 0 or end > view.len or pos > end:
            raise ValueError("run bounds outside the buffer")
        p = <const uint8_t*>view.buf
        while end - pos >= TANK_HEADER and <Py_ssize_t>out.length < room:
            length = _le32(p + pos + 1)
            start = pos + TANK_HEADER
            if p[pos] != TANK_PRODUCE or <long long>length > limit or end - start < length:
                break
            bundle_len = _single_produce(p + start, length, &request_id, &partition,
                                         &name_at, &name_len, &bundle_at)
            if bundle_len < 0:
                break
            name = _utf8(p + start + name_at, name_len)
            if name is None:
                break
            appender = appenders.get((name, partition))
            if appender is None:
                break
            bundle = PyBytes_FromStringAndSize(<const char*>p + start + bundle_at, bundle_len)
            if not _plain_count(bundle, max_uncompressed, &messages):
                break
            if not appender(bundle, messages):
                break
            _reserve(&out, TANK_HEADER + 5)
            w = out.data + out.length
            w[0] = TANK_PRODUCE
            w[1] = 5
            w[2] = w[3] = w[4] = 0
            w[5] = <uint8_t>request_id
            w[6] = <uint8_t>(request_id >> 8)
            w[7] = <uint8_t>(request_id >> 16)
            w[8] = <uint8_t>(request_id >> 24)
            w[9] = 0  # OK
            out.length += TANK_HEADER + 5
            count += 1
            pos = start + length
        return pos, PyBytes_FromStringAndSize(<const char*>out.data, out.length), count
    finally:
        PyBuffer_Release(&view)
        PyMem_Free(out.data)


# ------------------------------------------------------------ Kafka Produce (a client's)


cdef inline Py_ssize_t _kafka_count_size(Py_ssize_t n, bint flexible) noexcept:
    """Bytes of a (compact) array count or string/bytes length."""
    return _varint_size(<uint64_t>(n + 1)) if flexible else 4


cdef inline Py_ssize_t _put_kafka_length(uint8_t* p, Py_ssize_t n, bint flexible,
                                         bint wide) noexcept:
    """A length or count: compact (n + 1 as an unsigned varint; -1 -> 0), else int32
    (``wide``) or int16."""
    if flexible:
        return _put_varint(p, <uint64_t>(n + 1))
    if wide:
        _put_be32(p, <uint32_t><int32_t>n)
        return 4
    _put_be16(p, <uint16_t><int16_t>n)
    return 2


def kafka_produce_request(int version, int32_t correlation, client_id, int acks,
                          int32_t timeout_ms, list topics):
    """``protocols.kafka.produce_frames.produce_request_py``: the frame of a Produce
    request (size included) as pieces, every ``records`` value a piece of its own."""
    cdef bint flexible = version >= 9
    cdef Py_ssize_t size = 0, n, client_len = -1, written
    cdef list pieces = []
    cdef bytearray head = bytearray()
    cdef bytearray scratch = bytearray(32)
    cdef uint8_t* p = <uint8_t*>PyByteArray_AS_STRING(scratch)
    cdef object topic, partitions, partition, records
    if not 3 <= version <= 9:
        raise ValueError(f"ProduceRequest: unsupported version {version}")
    if client_id is not None:
        client_len = len(<bytes>client_id)
        if client_len > 0x7FFF:
            raise ValueError("client id over 32767 bytes")
    # One pass for the sizes (the frame's size goes first), one to write.
    size = 8 + 2 + (0 if client_len < 0 else client_len) + (1 if flexible else 0)
    size += (1 if flexible else 2) + 6 + _kafka_count_size(len(topics), flexible)
    for topic in topics:
        n = len(<bytes>topic[0])
        if n > 0x7FFF:
            raise ValueError("topic name over 32767 bytes")
        partitions = topic[1]
        size += (_kafka_count_size(n, True) if flexible else 2) + n
        size += _kafka_count_size(len(partitions), flexible) + (1 if flexible else 0)
        for partition in partitions:
            records = partition[1]
            n = -1 if records is None else len(records)
            size += 4 + (_kafka_count_size(n, True) if flexible else 4) + max(n, 0)
            size += 1 if flexible else 0
    size += 1 if flexible else 0
    if size > 0x7FFFFFFF:
        raise ValueError("a Produce request over 2 GiB")
    _put_be32(p, <uint32_t>size)
    _put_be16(p + 4, 0)
    _put_be16(p + 6, <uint16_t>version)
    _put_be32(p + 8, <uint32_t>correlation)
    _put_be16(p + 12, <uint16_t><int16_t>client_len)
    head += scratch[:14]
    if client_len > 0:
        head += <bytes>client_id
    if flexible:
        head.append(0)  # the header's tagged fields
        head.append(0)  # transactional_id: null (compact)
    else:
        head += b"\xff\xff"
    _put_be16(p, <uint16_t><int16_t>acks)
    _put_be32(p + 2, <uint32_t>timeout_ms)
    written = 6 + _put_kafka_length(p + 6, len(topics), flexible, True)
    head += scratch[:written]
    for topic in topics:
        n = len(<bytes>topic[0])
        written = _put_kafka_length(p, n, flexible, False)
        head += scratch[:written]
        head += <bytes>topic[0]
        partitions = topic[1]
        written = _put_kafka_length(p, len(partitions), flexible, True)
        head += scratch[:written]
        for partition in partitions:
            records = partition[1]
            _put_be32(p, <uint32_t><int32_t>partition[0])
            n = -1 if records is None else len(records)
            written = 4 + _put_kafka_length(p + 4, n, flexible, True)
            head += scratch[:written]
            if n > 0:
                pieces.append(head)
                pieces.append(records)
                head = bytearray()
            if flexible:
                head.append(0)  # the partition's tagged fields
        if flexible:
            head.append(0)  # the topic's
    if flexible:
        head.append(0)  # the request's
    if len(head):
        pieces.append(head)
    return pieces


cdef inline int _answer_length(const uint8_t* buf, Py_ssize_t* ppos, Py_ssize_t end,
                               bint flexible, bint wide, Py_ssize_t* n) noexcept:
    """A count or length (compact, int32 or int16) into ``n`` (-1: null); 0 when the
    buffer ends first or a varint is over 5 bytes."""
    cdef Py_ssize_t pos = ppos[0]
    cdef uint64_t value = 0
    cdef int shift = 0
    cdef uint8_t byte
    if flexible:
        while True:
            if pos >= end or shift > 28:
                return 0
            byte = buf[pos]
            pos += 1
            value |= <uint64_t>(byte & 0x7F) << shift
            if byte < 0x80:
                break
            shift += 7
        n[0] = <Py_ssize_t>value - 1
    elif wide:
        if end - pos < 4:
            return 0
        n[0] = <int32_t>_be32(buf + pos)
        pos += 4
    else:
        if end - pos < 2:
            return 0
        n[0] = <int16_t>_be16(buf + pos)
        pos += 2
    ppos[0] = pos
    return 1


#: What :func:`_kafka_string` returns when there is no string to read.
cdef object _NO_STRING = object()


cdef object _kafka_string(const uint8_t* buf, Py_ssize_t* ppos, Py_ssize_t end,
                          bint flexible, bint nullable):
    """A (compact, nullable) string (None: null, when ``nullable``), or
    :data:`_NO_STRING` when the buffer ends first or the length is not allowed; raises
    UnicodeDecodeError."""
    cdef Py_ssize_t n
    cdef object text
    if not _answer_length(buf, ppos, end, flexible, False, &n) or n < -1 \
            or (n == -1 and not nullable) or end - ppos[0] < max(n, 0):
        return _NO_STRING
    if n < 0:
        return None
    text = PyUnicode_DecodeUTF8(<const char*>(buf + ppos[0]), n, NULL)
    ppos[0] += n
    return text


cdef inline int _empty_tags(const uint8_t* buf, Py_ssize_t* ppos, Py_ssize_t end,
                            bint flexible) noexcept:
    """1 past an empty tagged-field section (nothing to pass when not ``flexible``); 0
    when it is not there or holds fields (the reference reads those)."""
    if not flexible:
        return 1
    if ppos[0] >= end or buf[ppos[0]] != 0:
        return 0
    ppos[0] += 1
    return 1


def kafka_produce_answers(frame, int version):
    """``protocols.kafka.produce_frames.produce_answers_py`` for the common answer:
    ``(topic, partition, error_code, base_offset, log_append_time_ms, error_message)`` of
    each partition; None for anything else (tagged fields, record errors, a short or
    malformed frame), which the reference then reads (or refuses)."""
    cdef Py_buffer view
    cdef const uint8_t* buf
    cdef Py_ssize_t pos = 0, end, n_topics, n_parts, n, i, j
    cdef bint flexible = version >= 9
    cdef int32_t index
    cdef int16_t code
    cdef int64_t base, append_time
    cdef list answers = []
    cdef object name, message
    if not 3 <= version <= 9:
        return None
    PyObject_GetBuffer(frame, &view, PyBUF_SIMPLE)
    try:
        buf = <const uint8_t*>view.buf
        end = view.len
        if end < 4:
            return None
        pos = 4  # the correlation id, read by the caller
        if not _empty_tags(buf, &pos, end, flexible):
            return None
        if not _answer_length(buf, &pos, end, flexible, True, &n_topics) or n_topics < 0:
            return None
        for i in range(n_topics):
            name = _kafka_string(buf, &pos, end, flexible, False)
            if name is _NO_STRING:
                return None
            if not _answer_length(buf, &pos, end, flexible, True, &n_parts) or n_parts < 0:
                return None
            for j in range(n_parts):
                if end - pos < 22 + (8 if version >= 5 else 0):
                    return None
                index = <int32_t>_be32(buf + pos)
                code = <int16_t>_be16(buf + pos + 4)
                base = <int64_t>_be64(buf + pos + 6)
                append_time = <int64_t>_be64(buf + pos + 14)
                pos += 22 + (8 if version >= 5 else 0)
                message = None
                if version >= 8:
                    if not _answer_length(buf, &pos, end, flexible, True, &n) or n != 0:
                        return None  # record errors: the reference reads them
                    message = _kafka_string(buf, &pos, end, flexible, True)
                    if message is _NO_STRING:
                        return None
                if not _empty_tags(buf, &pos, end, flexible):
                    return None
                answers.append((name, index, code, base, append_time, message))
            if not _empty_tags(buf, &pos, end, flexible):
                return None
        if end - pos < 4:
            return None
        pos += 4  # throttle_time_ms
        if not _empty_tags(buf, &pos, end, flexible):
            return None
        if pos != end:
            return None
        return answers
    except UnicodeDecodeError:
        return None
    finally:
        PyBuffer_Release(&view)


# ----------------------------------------------------------- Kafka Produce (a broker's)


def kafka_read_produce_request(buf, Py_ssize_t pos, Py_ssize_t end, int version):
    """``protocols.kafka.produce_frames.read_produce_request_py`` for the common request:
    ``(transactional_id, acks, timeout_ms, [(topic, [(partition, records)])], pos)``, each
    ``records`` a view of ``buf`` (None: null); None for anything else (tagged fields,
    a short or malformed request, ``buf`` not ``bytes``), which the reference then reads
    (or refuses)."""
    cdef const uint8_t* p
    cdef Py_ssize_t n, n_topics, n_parts, i, j
    cdef bint flexible = version >= 9
    cdef int16_t acks
    cdef int32_t timeout_ms, index
    cdef object transactional_id = None, name, view
    cdef list topics = [], parts
    if type(buf) is not bytes or not 3 <= version <= 9 or not 0 <= pos <= end \
            or end > len(<bytes>buf):
        return None
    p = <const uint8_t*>PyBytes_AS_STRING(<bytes>buf)
    view = PyMemoryView_FromObject(buf)
    try:
        transactional_id = _kafka_string(p, &pos, end, flexible, True)
        if transactional_id is _NO_STRING:
            return None
        if end - pos < 6:
            return None
        acks = <int16_t>_be16(p + pos)
        timeout_ms = <int32_t>_be32(p + pos + 2)
        pos += 6
        if not _answer_length(p, &pos, end, flexible, True, &n_topics) or n_topics < 0:
            return None
        for i in range(n_topics):
            name = _kafka_string(p, &pos, end, flexible, False)
            if name is _NO_STRING:
                return None
            if not _answer_length(p, &pos, end, flexible, True, &n_parts) or n_parts < 0:
                return None
            parts = []
            for j in range(n_parts):
                if end - pos < 4:
                    return None
                index = <int32_t>_be32(p + pos)
                pos += 4
                if not _answer_length(p, &pos, end, flexible, True, &n) or n < -1 \
                        or end - pos < max(n, 0):
                    return None
                if n < 0:
                    parts.append((index, None))
                else:
                    parts.append((index, view[pos:pos + n]))
                    pos += n
                if not _empty_tags(p, &pos, end, flexible):
                    return None
            topics.append((name, parts))
            if not _empty_tags(p, &pos, end, flexible):
                return None
        if not _empty_tags(p, &pos, end, flexible):
            return None
        return transactional_id, acks, timeout_ms, topics, pos
    except UnicodeDecodeError:
        return None


cdef inline int _append_kafka_string(bytearray out, object text, bint flexible,
                                     bint nullable) except -1:
    cdef bytes encoded
    cdef uint8_t scratch[8]
    cdef Py_ssize_t written
    if text is None:
        written = _put_kafka_length(scratch, -1, flexible, False)
        out += (<char*>scratch)[:written]
        return 0
    encoded = text.encode()
    if len(encoded) > 0x7FFF:
        raise ValueError("string over 32767 bytes")
    written = _put_kafka_length(scratch, len(encoded), flexible, False)
    out += (<char*>scratch)[:written]
    out += encoded
    return 0


def kafka_produce_response(int version, int32_t correlation, response):
    """``protocols.kafka.produce_frames.produce_response_frame_py`` for the common answer
    (no record errors): the whole frame, size first; None for anything else, which the
    reference then encodes."""
    cdef bint flexible = version >= 9
    cdef bytearray out = bytearray(4)
    cdef uint8_t scratch[40]
    cdef Py_ssize_t written
    cdef object topic, part
    cdef uint8_t* head
    if not 3 <= version <= 9 or type(response.responses) is not list:
        return None
    _put_be32(scratch, <uint32_t>correlation)
    written = 4
    if flexible:
        scratch[4] = 0  # the header's tagged fields
        written = 5
    written += _put_kafka_length(scratch + written, len(response.responses), flexible, True)
    out += (<char*>scratch)[:written]
    try:
        for topic in response.responses:
            if type(topic.partition_responses) is not list or topic.name is None:
                return None
            _append_kafka_string(out, topic.name, flexible, False)
            written = _put_kafka_length(scratch, len(topic.partition_responses), flexible,
                                        True)
            out += (<char*>scratch)[:written]
            for part in topic.partition_responses:
                if part.record_errors:
                    return None
                _put_be32(scratch, <uint32_t><int32_t>part.index)
                _put_be16(scratch + 4, <uint16_t><int16_t>part.error_code)
                _put_be64(scratch + 6, <uint64_t><int64_t>part.base_offset)
                _put_be64(scratch + 14, <uint64_t><int64_t>part.log_append_time_ms)
                written = 22
                if version >= 5:
                    _put_be64(scratch + 22, <uint64_t><int64_t>part.log_start_offset)
                    written = 30
                if version >= 8:
                    written += _put_kafka_length(scratch + written, 0, flexible, True)
                out += (<char*>scratch)[:written]
                if version >= 8:
                    _append_kafka_string(out, part.error_message, flexible, True)
                if flexible:
                    out.append(0)
            if flexible:
                out.append(0)
        _put_be32(scratch, <uint32_t><int32_t>response.throttle_time_ms)
        out += (<char*>scratch)[:4]
        if flexible:
            out.append(0)
    except (OverflowError, TypeError, ValueError):
        return None  # a value that does not fit: the reference says which
    head = <uint8_t*>PyByteArray_AS_STRING(out)
    _put_be32(head, <uint32_t>(len(out) - 4))
    return bytes(out)

"""Random and mutated Figg frames: nothing but ProtocolError may escape, and the generated
fast codecs agree with the engine codecs on every payload."""

import random
from typing import Any

from protocols.connection import CLOSED, Role
from protocols.errors import ProtocolError
from protocols.figg.connection import FiggConnection
from protocols.figg.messages import CODEC_BY_TYPE, FAST, HEADER, MessageType

FRAMES = 100_000
SEED = 0xF166
MAX_FRAME = 4096


def random_frame(rng: random.Random) -> bytes:
    """A valid frame of any type, with edge values likely."""
    message_type = rng.choice(list(MessageType))
    values: list[Any] = []
    for spec in CODEC_BY_TYPE[message_type].spec.fields:
        if spec.type in ("string", "bytes"):
            size = rng.choice([0, 1, 2, rng.randrange(64), rng.randrange(600)])
            raw = rng.randbytes(size)
            values.append(raw if spec.type == "bytes" or rng.random() < 0.3
                          else "é/topic-ünï"[:size].encode())
        else:
            bits = {"uint16": 16, "uint64": 64}[spec.type]
            values.append(rng.choice([0, 1, 2**bits - 1, 0x8000, rng.getrandbits(bits)]))
    return FAST[message_type].encode_frame(*values)


def random_payload_frame(rng: random.Random) -> bytes:
    """A correct header (mostly) over a payload of random bytes, or a random length field."""
    payload = bytearray(rng.randbytes(rng.choice([0, rng.randrange(8), rng.randrange(40)])))
    if len(payload) >= 4 and rng.random() < 0.5:
        put_u32(payload, rng)
    version = 1 if rng.random() < 0.9 else rng.getrandbits(16)
    return HEADER.pack(rng.randint(0, 10), version, len(payload)) + payload


def put_u32(raw: bytearray, rng: random.Random) -> None:
    """Overwrite a length-sized window with a plausible lie."""
    if len(raw) < 4:
        return
    pos = rng.randrange(len(raw) - 3)
    value = rng.choice([0, 1, len(raw) - pos, len(raw) + 1, 0xFFFFFFFF, rng.getrandbits(32),
                        rng.getrandbits(12)])
    raw[pos:pos + 4] = value.to_bytes(4, "big")


def mutate(raw: bytes, rng: random.Random) -> bytes:
    out = bytearray(raw)
    for _ in range(rng.randint(1, 3)):
        action = rng.randrange(8)
        if action == 0 and out:
            out[rng.randrange(len(out))] = rng.getrandbits(8)
        elif action == 1:
            del out[rng.randrange(len(out) + 1):]
        elif action == 2:
            pos = rng.randrange(len(out) + 1)
            out[pos:pos] = rng.randbytes(rng.randint(1, 12))
        elif action == 3:
            put_u32(out, rng)
        elif action == 4 and len(out) >= 8:  # the header's payloadLen
            length = rng.choice([0, len(out) - 8 + rng.randint(-9, 9),
                                 rng.getrandbits(rng.choice([8, 12, 32]))])
            out[4:8] = max(0, length).to_bytes(4, "big")
        elif action == 5 and len(out) >= 4:  # type and version
            out[0:4] = rng.choice([rng.getrandbits(32), rng.randint(0, 11) << 16 | 1,
                                   rng.randint(1, 9) << 16 | rng.randint(0, 3)]).to_bytes(4, "big")
        elif action == 6:
            out += random_frame(rng)
        else:
            out = bytearray(rng.randbytes(rng.randrange(40)))
    return bytes(out)


def drain(role: Role, raw: bytes, rng: random.Random) -> bool:
    """Feed ``raw`` in random chunks, maybe followed by EOF: False if it was refused.

    Anything but ProtocolError escapes and fails the test.
    """
    conn = FiggConnection(role, max_frame_size=MAX_FRAME)
    try:
        pos = 0
        while pos < len(raw):
            step = rng.choice([len(raw), 1, rng.randint(1, 64)])
            conn.receive_data(raw[pos:pos + step])
            pos += step
            conn.next_events()
        if rng.random() < 0.5:
            conn.receive_data(b"")
            while (events := conn.next_events()) and events[-1] is not CLOSED:
                pass
    except ProtocolError:
        return False
    return True


def check_codecs_agree(raw: bytes) -> None:
    """The fast decoder and the engine decoder give the same record or both refuse."""
    if len(raw) < HEADER.size:
        return
    message_type = int.from_bytes(raw[:2], "big")
    if message_type not in FAST:
        return
    payload = raw[HEADER.size:]
    results = []
    for decode in (FAST[message_type].decode,
                   lambda p: CODEC_BY_TYPE[message_type].decode(p, version=1)):
        try:
            results.append(decode(payload))
        except ProtocolError:
            results.append(ProtocolError)
    assert results[0] == results[1], (raw.hex(), results)


def test_random_and_mutated_frames() -> None:
    rng = random.Random(SEED)
    accepted = 0
    for i in range(FRAMES):
        if i % 4 == 0:
            raw = random_frame(rng)
        elif i % 4 == 1:
            raw = random_payload_frame(rng)
        else:
            raw = mutate(random_frame(rng), rng)
        check_codecs_agree(raw)
        for role in Role:
            accepted += drain(role, raw, rng)
    # Both outcomes are common, so the mutations reach past the first check.
    assert FRAMES // 4 < accepted < FRAMES * 3 // 2

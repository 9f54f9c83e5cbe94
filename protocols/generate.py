"""Generate each protocol's record classes and codecs from its JSON declarations.

Run ``python -m protocols.generate`` after changing a file in ``protocols/*/specs/`` (or
this generator): it rewrites ``protocols/tank/records.py``, ``protocols/figg/records.py``
and ``protocols/kafka/records.py`` (Kafka's type system: :mod:`protocols.codegen.kafka`).
``--check`` only reports whether they are current (exit 1 if not); ``--out DIR`` writes
them under ``DIR`` instead. ``tests/protocols/test_generate.py`` holds the checked-in files
to the declarations.

For every message (and every inline struct) the output has a frozen, slotted record class
(:class:`protocols.record.Record`, with its ``__init__`` written out: no dataclass to
build at import) with typed fields and docstrings from the declaration (its leading ``//``
comment, the ``about`` texts). Its codecs are straight-line functions: one ``struct`` call
per run of fixed-width fields, explicit bounds checks that raise
:class:`~protocols.errors.ProtocolError`, no per-field dispatch:

- every message: ``decode_<name>(payload, version=None, context=None)`` and
  ``encode_<name>(record, version=None, context=None) -> bytes`` (the payload, no frame
  header), gathered in ``PAYLOAD_CODECS``;
- flat messages in a ``type | version | length`` frame (Figg): ``decode_<name>(payload)``
  and ``encode_<name>_frame(*fields)``, ``encode_<name>_record(record)`` for the whole
  frame, gathered in ``FLAT_CODECS``, and batch encoders for frames that share their
  leading fields.

Decoded records are built without the frozen ``__init__`` (which pays an
``object.__setattr__`` per field, three times the cost of a plain one): a private builder
with the same slots makes the instance and it becomes the record class at once.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Sequence
from pathlib import Path

from protocols.codegen.core import COMMAND, Module, Target
from protocols.codegen.kafka import KafkaModule
from protocols.spec import MessageSpec, TypeRegistry, load_package_specs

ROOT = Path(__file__).resolve().parent.parent


def targets() -> list[Target]:
    from protocols.tank.types import CUSTOM_TYPES

    return [
        Target("protocols.tank", "protocols.tank.records",
               "Tank's message records and payload codecs",
               TypeRegistry("little", CUSTOM_TYPES), custom_module="protocols.tank.types",
               answers={"ProduceWithSeqnumRequest": "ProduceResponse"}),
        Target("protocols.figg", "protocols.figg.records",
               "Figg's message records and frame codecs",
               TypeRegistry("big"), frame=">HHI", frame_version=1, batches={"Data": 1}),
        Target("protocols.kafka", "protocols.kafka.records",
               "Kafka's message records and payload codecs",
               TypeRegistry("big"), kafka=True),
    ]


def generate(target: Target, specs: Sequence[MessageSpec] | None = None) -> str:
    """The source of ``target``'s module (from its package's declarations by default)."""
    if specs is None:
        specs = list(load_package_specs(target.package).values())
    if target.kafka:
        return KafkaModule(target, specs).render()
    return Module(target, specs).render()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="only report whether the checked-in modules are current")
    parser.add_argument("--out", type=Path, default=ROOT,
                        help="write under this folder (default: the repository)")
    args = parser.parse_args(argv)
    stale = []
    for target in targets():
        path = args.out / target.path
        source = generate(target)
        current = path.read_text(encoding="utf-8") if path.exists() else ""
        if current == source:
            continue
        stale.append(str(target.path))
        if args.check:
            sys.stdout.writelines(difflib.unified_diff(
                current.splitlines(True), source.splitlines(True), str(path), "generated"))
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(source, encoding="utf-8")
            print(f"wrote {path}")
    if args.check and stale:
        print(f"out of date: {', '.join(stale)} (run {COMMAND})", file=sys.stderr)
        return 1
    return 0


__all__ = ["Target", "generate", "main", "targets"]

if __name__ == "__main__":
    sys.exit(main())

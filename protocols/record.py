"""The base of the generated record classes (``protocols/*/records.py``).

A record is a frozen, slotted value: its fields are positional or keyword arguments of
its ``__init__`` in declaration order (``__match_args__``), it compares, hashes, prints
and pickles by its fields, and assigning to a field raises
:class:`dataclasses.FrozenInstanceError`, as a ``@dataclass(frozen=True, slots=True)``
does. The generator writes each class's ``__init__`` out instead of decorating it: a
dataclass builds and compiles its methods when its module is imported (about 2 ms a
class, 0.2 s for Kafka's hundred, in every process that imports them); a written-out
class costs microseconds. :func:`replace` is ``dataclasses.replace`` for records.
"""

from __future__ import annotations

from dataclasses import FrozenInstanceError
from typing import TYPE_CHECKING, Any, ClassVar, Final, Generic, TypeVar

#: Sets a field of a record under construction (its own ``__setattr__`` refuses).
init_field: Final = object.__setattr__


class _Default:
    __slots__ = ()

    def __repr__(self) -> str:
        return "<a new default>"


#: The default of a field whose default is a new object for each record (a list, a
#: struct): its ``__init__`` makes one when it sees this.
NEW_DEFAULT: Final[Any] = _Default()


class Record:
    """A generated record: subclasses declare ``__slots__``, ``__match_args__`` (the
    fields, in order) and ``__init__``."""

    __slots__ = ()
    __match_args__: ClassVar[tuple[str, ...]] = ()

    if not TYPE_CHECKING:  # to a type checker, a record's fields are plain attributes
        def __setattr__(self, name: str, value: object) -> None:
            raise FrozenInstanceError(f"cannot assign to field {name!r}")

        def __delattr__(self, name: str) -> None:
            raise FrozenInstanceError(f"cannot delete field {name!r}")

    def _values(self) -> tuple[Any, ...]:
        return tuple([getattr(self, name) for name in self.__match_args__])

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        assert isinstance(other, Record)
        return self._values() == other._values()

    def __hash__(self) -> int:
        return hash(self._values())

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__match_args__)
        return f"{self.__class__.__qualname__}({fields})"

    def __reduce__(self) -> tuple[type[Record], tuple[Any, ...]]:
        return self.__class__, self._values()


R = TypeVar("R", bound=Record)

#: What answers a :class:`Request`.
Answer = TypeVar("Answer")


class Request(Record, Generic[Answer]):
    """A generated request record answered by an ``Answer`` (``FetchRequest`` is a
    ``Request[FetchResponse]``): so a call that sends one and waits for its answer is
    typed by the request it is given, whichever protocol."""

    __slots__ = ()


def replace(record: R, **changes: object) -> R:
    """A copy of ``record`` with the fields named in ``changes`` set to their values."""
    values = {name: getattr(record, name) for name in record.__match_args__}
    unknown = changes.keys() - values.keys()
    if unknown:
        raise TypeError(f"{record.__class__.__qualname__} has no field "
                        f"{', '.join(sorted(unknown))}")
    values.update(changes)
    return record.__class__(**values)

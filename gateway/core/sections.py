"""Settings per section: what one part of the gateway is configured with, and nothing else.

Every setting is declared once, as a field of :class:`~gateway.core.config.Settings` (its
key, flag, type, default and help). A *section* is a small frozen dataclass a listener
or a backend receives instead of the whole: each of its fields names the setting it takes
(``setting("figg.data_cache_bytes")``), and :meth:`Section.of` copies those values out of
a :class:`Settings`. A field's default is its setting's default, so ``FiggSettings()`` is
what an empty config file gives; ``tests/test_config_sections.py`` holds every section's
fields to the types of the settings they name.

The sections live with the part that reads them (``gateway/figg/settings.py``,
``gateway/backend/bridge/settings.py``, ...); the ones several listeners share are here:
:class:`ConnectionLimits`.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Self

from gateway.core.config import Settings, declared_field, option_of

__all__ = ["ConnectionLimits", "Section", "setting"]


def setting(key: str) -> Any:  # noqa: ANN401  (a dataclass field: its annotation types it)
    """A field of a :class:`Section` that takes setting ``key``, its default the
    setting's (a KeyError at import when no setting has that key)."""
    return declared_field(option_of(key).default, {"key": key})


@dataclass(frozen=True, slots=True)
class Section:
    """The base of a section: a frozen dataclass whose fields are made by :func:`setting`
    (and, in a listener's section, values of the listener's own ``[listeners.NAME]``
    table: see its :meth:`derived`)."""

    @classmethod
    def of(cls, settings: Settings, listener: str | None = None) -> Self:
        """The section's values in ``settings`` (for the listener named ``listener``,
        in a listener's section: its protocol's name when not given)."""
        return cls(**{f.name: getattr(settings, option_of(f.metadata["key"]).attr)
                      for f in fields(cls) if "key" in f.metadata},
                   **cls.derived(settings, listener))

    @classmethod
    def derived(cls, settings: Settings, listener: str | None) -> dict[str, Any]:
        """The values of the section's fields that no one setting gives: a listener's
        own, from its ``[listeners.NAME]`` table in ``settings`` (none unless a section
        says otherwise)."""
        return {}


@dataclass(frozen=True, slots=True)
class ConnectionLimits(Section):
    """The bounds every protocol listener holds its connections to (``limits.*``)."""

    max_connections: int = setting("limits.max_connections")
    max_frame_bytes: int = setting("limits.max_frame_bytes")
    idle_timeout_secs: float = setting("limits.idle_timeout_secs")
    frame_timeout_secs: float = setting("limits.frame_timeout_secs")
    max_requests_in_flight: int = setting("limits.max_requests_in_flight")
    unacked_bytes: int = setting("limits.unacked_bytes")


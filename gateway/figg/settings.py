"""What the Figg listener is configured with (:mod:`gateway.core.sections`)."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.core.sections import Section, setting

__all__ = ["FiggSettings"]


@dataclass(frozen=True, slots=True)
class FiggSettings(Section):
    """The Figg listener's settings (beside the :class:`ConnectionLimits` every listener
    holds)."""

    data_cache_bytes: int = setting("figg.data_cache_bytes")
    subscriber_buffer_bytes: int = setting("limits.subscriber_buffer_bytes")

"""What the Tank listener is configured with (:mod:`gateway.core.sections`)."""

from __future__ import annotations

from dataclasses import dataclass

from gateway.core.sections import Section, setting

__all__ = ["TankSettings"]


@dataclass(frozen=True, slots=True)
class TankSettings(Section):
    """The Tank listener's settings (beside the :class:`ConnectionLimits` every listener
    holds)."""

    response_buffer_bytes: int = setting("limits.response_buffer_bytes")

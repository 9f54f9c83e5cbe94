"""The table of listeners (gateway/server/listeners.py) and how settings reach the parts:
every protocol listener is one line of the table, agreeing with the settings' listener
names, and no listener or backend receives the whole Settings."""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable
from typing import Any

import pytest

from gateway.backend.bridge import open_bridge_backend
from gateway.backend.embedded import open_embedded_backend
from gateway.backend.kafka import open_kafka_backend
from gateway.core.config import LISTEN, PROTOCOLS, Settings
from gateway.core.metrics import Metrics
from gateway.core.sections import Section
from gateway.kafka.groups.coordinator import GroupCoordinator
from gateway.server.listeners import BY_NAME, LISTENERS
from gateway.server.run import ServerInfo


def test_the_table_names_every_listener_the_settings_name() -> None:
    assert set(BY_NAME) | {"metrics"} == set(PROTOCOLS) == set(LISTEN)
    assert len(BY_NAME) == len(LISTENERS)
    for kind in LISTENERS:
        assert kind.listener.protocol == kind.name  # type: ignore[attr-defined]
        assert issubclass(kind.section, Section)


def test_server_info_names_the_listeners_of_the_table() -> None:
    info = ServerInfo(Metrics())
    assert all(getattr(info, kind.name) is None for kind in LISTENERS)
    info.addresses = {"figg": ("127.0.0.1", 8119), "analytics": ("127.0.0.1", 1)}
    assert info.figg == ("127.0.0.1", 8119)
    assert info.tank is None
    with pytest.raises(AttributeError, match="analytics"):
        info.analytics  # noqa: B018 (a listener of its own is in addresses only)


def _settings_parameter(function: Callable[..., Any]) -> Any:
    """The type of the parameter named settings of ``function``."""
    function = inspect.unwrap(function)
    return typing.get_type_hints(function)["settings"]


@pytest.mark.parametrize("part", [
    *(kind.listener for kind in LISTENERS),
    open_embedded_backend, open_bridge_backend, open_kafka_backend, GroupCoordinator,
], ids=lambda part: getattr(part, "__qualname__", str(part)))
def test_no_listener_or_backend_receives_the_whole_settings(part: Callable[..., Any]) -> None:
    given = _settings_parameter(part.__init__ if isinstance(part, type) else part)
    assert given is not Settings
    assert issubclass(given, Section), f"{part} receives {given}, not a section"

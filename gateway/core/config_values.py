"""The values of settings: the parsers and validators of :mod:`gateway.core.config`
(each takes a value as TOML or a flag gives it and returns it checked, or raises
``ValueError`` / :class:`ConfigError` naming what is wrong), and the listener tables."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

MIB = 1024 * 1024


class ConfigError(ValueError):
    """A setting is missing, unknown or invalid; the message names the key."""


def parse_address(text: str) -> tuple[str, int]:
    """``HOST:PORT`` -> (host, port); ``[::1]:PORT`` for IPv6."""
    host, sep, port = text.rpartition(":")
    if not sep or not host:
        raise ValueError(f"expected HOST:PORT, got {text!r}")
    host = host.strip("[]")
    try:
        number = int(port)
    except ValueError:
        raise ValueError(f"port is not a number in {text!r}") from None
    if not 0 <= number <= 65535:
        raise ValueError(f"port out of range in {text!r}")
    return host, number


def _address(value: object) -> str:
    if not isinstance(value, str):
        raise ValueError("expected a \"HOST:PORT\" string")
    parse_address(value)
    return value


def _optional_address(value: object) -> str:
    return "" if value in ("", None) else _address(value)


def _addresses(value: object) -> tuple[str, ...]:
    """A list of ``HOST:PORT`` strings; a string (and each string of a list, as repeated
    flags give them) may hold several, comma-separated."""
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise ValueError("expected a list of \"HOST:PORT\" strings")
    return tuple(_address(part.strip()) for v in value for part in v.split(",")
                 if part.strip())


def _number(kind: type[int] | type[float], *, positive: bool) -> Callable[[object], Any]:
    """A parser of ints (from TOML integers or digits) or floats, over 0 or from 0."""
    if kind is int:
        expected = "a positive integer" if positive else "an integer >= 0"
    else:
        expected = "a number > 0" if positive else "a number >= 0"

    def parse(value: object) -> int | float:
        if isinstance(value, bool) or not isinstance(
                value, (int, str) if kind is int else (int, float, str)):
            raise ValueError(f"expected {expected}")
        number = kind(value)
        if number < 0 or (positive and number == 0):
            raise ValueError(f"expected {expected}")
        return number
    return parse


_positive_int = _number(int, positive=True)
_non_negative_int = _number(int, positive=False)
_positive_float = _number(float, positive=True)
_non_negative_float = _number(float, positive=False)


def _percent(value: object) -> float:
    number = _non_negative_float(value)
    if number > 100:
        raise ValueError("expected a percentage, 0 to 100")
    return float(number)


def _origins(value: object) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [v.strip() for v in value.split(",") if v.strip()]
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise ValueError("expected a list of origins (\"https://host[:port]\" or \"*\")")
    for origin in value:
        if origin != "*" and "://" not in origin:
            raise ValueError(f"not an origin: {origin!r} (scheme://host[:port], or *)")
    return tuple(v.rstrip("/") for v in value)


def _host_names(value: object) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [v.strip() for v in value.split(",") if v.strip()]
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) for v in value):
        raise ValueError("expected a list of host names (\"name\", \".domain\" or \"*\")")
    for name in value:
        if not name or any(c in name for c in "/: "):
            raise ValueError(f"not a host name: {name!r} (no scheme, port or path)")
    return tuple(value)


def _boolean(value: object) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
        return value.lower() in ("true", "1", "yes")
    raise ValueError("expected true or false")


def _choice(*allowed: str) -> Callable[[object], str]:
    def parse(value: object) -> str:
        if value not in allowed:
            raise ValueError(f"expected one of {', '.join(allowed)}")
        return str(value)
    parse.choices = allowed  # type: ignore[attr-defined]
    return parse


def _path(value: object) -> Path:
    if not isinstance(value, (str, Path)) or not str(value):
        raise ValueError("expected a path")
    return Path(value)


def _optional_path(value: object) -> Path | None:
    return None if value in ("", None) else _path(value)


def _optional_file(value: object) -> str:
    """A path as text, or "" for none (TLS files: kept as given, read at start-up)."""
    if value is None or value == "":
        return ""
    return str(_path(value))


#: Kafka's record batch codecs: of the batches produced to an upstream Kafka cluster, and
#: of the batches a Fetch serves compressed data in.
KAFKA_COMPRESSIONS: Final = ("none", "gzip", "snappy", "lz4", "zstd")


def _topic_codecs(value: object) -> dict[str, str]:
    """A table of topic name -> one of :data:`KAFKA_COMPRESSIONS`."""
    if not isinstance(value, Mapping):
        raise ValueError("expected a table of topic = \"codec\" "
                         f"({', '.join(KAFKA_COMPRESSIONS)})")
    codecs = {}
    for topic, codec in value.items():
        if not isinstance(topic, str) or not topic:
            raise ValueError(f"expected topic names, got {topic!r}")
        if codec not in KAFKA_COMPRESSIONS:
            raise ValueError(f"topic {topic!r}: expected one of "
                             f"{', '.join(KAFKA_COMPRESSIONS)}, got {codec!r}")
        codecs[topic] = str(codec)
    return codecs


#: Codecs of the batches produced to an upstream Kafka cluster: Kafka's, or the producer's.
UPSTREAM_COMPRESSIONS: Final = ("producer", *KAFKA_COMPRESSIONS)


def _workers(value: object) -> int:
    """A positive number of processes, or ``auto``: the cores this process may run on."""
    if value == "auto":
        return len(os.sched_getaffinity(0))
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError("expected a positive integer or \"auto\"")
    try:
        number = int(value)
    except ValueError:
        raise ValueError("expected a positive integer or \"auto\"") from None
    if number < 1:
        raise ValueError("expected a positive integer or \"auto\"")
    return number


def _optional_choice(*allowed: str) -> Callable[[object], str]:
    def parse(value: object) -> str:
        if value in ("", None):
            return ""
        if value not in allowed:
            raise ValueError(f"expected one of {', '.join(allowed)} (or empty)")
        return str(value)
    return parse


def _text(value: object) -> str:
    if not isinstance(value, str):
        raise ValueError("expected a string")
    return value


def _topic_config(value: object) -> dict[str, str]:
    if not isinstance(value, Mapping):
        raise ValueError("expected a table of Tank config keys")
    from gateway.store.config import (  # the store's own rules
        CONFIG_KEYS,
        ConfigBounds,
        parse_value,
    )
    from gateway.store.errors import InvalidConfig

    config = {str(k): str(v) for k, v in value.items()}
    for key, text in config.items():
        name = key.strip().lower()
        if name not in CONFIG_KEYS:
            raise ConfigError(f"topics.config: unknown Tank config key {key!r} "
                              f"(known: {', '.join(CONFIG_KEYS)})")
        try:
            ConfigBounds().check(dict([parse_value(name, text.strip())]))
        except InvalidConfig as exc:
            raise ConfigError(f"topics.config: bad value {text!r} for {key!r}: {exc}") from None
    return config


#: What a listener serves.
PROTOCOLS = ("tank", "figg", "kafka", "metrics", "http")
_LISTENER_KEYS = ("protocol", "address", "tls", "tls_cert", "tls_key", "tls_client_ca",
                  "sasl_mechanisms", "sasl_plain_without_tls")
#: The SASL mechanisms a Kafka listener may require.
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-")


@dataclass(frozen=True, slots=True)
class TLSFiles:
    """Where a listener's certificate chain, key and (mutual TLS) client CA are."""

    cert: Path
    key: Path
    client_ca: Path | None = None

    @property
    def mutual(self) -> bool:
        return self.client_ca is not None


@dataclass(frozen=True, slots=True)
class ListenerTable:
    """One ``[listeners.NAME]`` table as written (None: not given)."""

    protocol: str | None = None
    address: str | None = None
    tls: bool | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_client_ca: Path | None = None
    #: SASL mechanisms a Kafka listener requires (empty: no SASL).
    sasl_mechanisms: tuple[str, ...] = ()
    #: Whether PLAIN may be served without TLS.
    sasl_plain_without_tls: bool = False


@dataclass(frozen=True, slots=True)
class ListenerSpec:
    """A listener to open: its ``name`` (the principal of its plain connections), what it
    serves, where (``address``, the value of setting ``key``) and its TLS (None: plain)."""

    name: str
    protocol: str
    address: str
    key: str
    tls: TLSFiles | None = None
    #: The setting that gave the certificate (for errors).
    tls_key: str = ""


def _listener_tables(value: object) -> dict[str, ListenerTable]:
    if not isinstance(value, Mapping):
        raise ValueError("expected a table of listener tables ([listeners.NAME])")
    tables: dict[str, ListenerTable] = {}
    for name, table in value.items():
        where = f"listeners.{name}"
        if not (isinstance(name, str) and 0 < len(name) <= 64 and set(name) <= _NAME_CHARS):
            raise ConfigError(f"{where}: a listener's name is 1-64 characters of "
                              "[A-Za-z0-9_-]")
        if not isinstance(table, Mapping):
            raise ConfigError(f"{where}: expected a table (keys: {', '.join(_LISTENER_KEYS)})")
        values: dict[str, Any] = {}
        for key, raw in table.items():
            if key not in _LISTENER_KEYS:
                raise ConfigError(f"{where}.{key}: unknown setting (known: "
                                  f"{', '.join(_LISTENER_KEYS)})")
            parse = {"protocol": _choice(*PROTOCOLS), "address": _optional_address,
                     "tls": _boolean, "sasl_plain_without_tls": _boolean,
                     "sasl_mechanisms": _sasl_mechanisms}.get(key, _path)
            try:
                values[key] = parse(raw)
            except ValueError as exc:
                raise ConfigError(f"{where}.{key}: {exc} (got {raw!r})") from None
        if name in PROTOCOLS:
            if values.get("protocol", name) != name:
                raise ConfigError(f"{where}.protocol: listener {name!r} serves {name}; give "
                                  "another listener another name")
            if "address" in values:
                raise ConfigError(f"{where}.address: listener {name!r} listens where "
                                  f"listen.{name} says; set that instead")
        else:
            for key in ("protocol", "address"):
                if key not in values:
                    raise ConfigError(f"{where}.{key}: missing (a listener of its own "
                                      "needs a protocol and an address)")
        if values.get("sasl_mechanisms") and values.get("protocol", name) != "kafka":
            raise ConfigError(f"{where}.sasl_mechanisms: SASL is served on Kafka listeners "
                              "only")
        tables[name] = ListenerTable(**values)
    return tables


def _sasl_mechanisms(value: object) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError("expected a list of mechanism names")
    for v in value:
        if v not in SASL_MECHANISMS:
            raise ValueError(f"unknown SASL mechanism {v!r} (known: "
                             f"{', '.join(SASL_MECHANISMS)})")
    return tuple(dict.fromkeys(value))

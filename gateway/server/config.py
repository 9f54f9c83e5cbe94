"""One frozen settings object, from a TOML file and command-line flags.

Every option is declared once in :data:`OPTIONS`: its key in the TOML file, its
flag, its type, default and help. The CLI flags, the config-file parser and the
README's configuration reference all derive from that table.
"""

from __future__ import annotations

import argparse
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

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


def _address(value: Any) -> str:
    if not isinstance(value, str):
        raise ValueError("expected a \"HOST:PORT\" string")
    parse_address(value)
    return value


def _optional_address(value: Any) -> str:
    return "" if value in ("", None) else _address(value)


def _addresses(value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [v for v in value.split(",") if v.strip()]
    if not isinstance(value, (list, tuple)):
        raise ValueError("expected a list of \"HOST:PORT\" strings")
    return tuple(_address(v.strip()) for v in value)


def _positive_int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError("expected a positive integer")
    number = int(value)
    if number <= 0:
        raise ValueError("expected a positive integer")
    return number


def _non_negative_int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValueError("expected an integer >= 0")
    number = int(value)
    if number < 0:
        raise ValueError("expected an integer >= 0")
    return number


def _non_negative_float(value: Any) -> float:
    if isinstance(value, bool):
        raise ValueError("expected a number")
    number = float(value)
    if number < 0:
        raise ValueError("expected a number >= 0")
    return number


def _boolean(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
        return value.lower() in ("true", "1", "yes")
    raise ValueError("expected true or false")


def _choice(*allowed: str) -> Callable[[Any], str]:
    def parse(value: Any) -> str:
        if value not in allowed:
            raise ValueError(f"expected one of {', '.join(allowed)}")
        return value
    parse.choices = allowed  # type: ignore[attr-defined]
    return parse


def _path(value: Any) -> Path:
    if not isinstance(value, (str, Path)) or not str(value):
        raise ValueError("expected a path")
    return Path(value)


def _topic_config(value: Any) -> dict[str, str]:
    if not isinstance(value, Mapping):
        raise ValueError("expected a table of Tank config keys")
    from gateway.store.config import CONFIG_KEYS, parse_value  # the store's own rules
    from gateway.store.errors import InvalidConfig

    config = {str(k): str(v) for k, v in value.items()}
    for key, text in config.items():
        name = key.strip().lower()
        if name not in CONFIG_KEYS:
            raise ConfigError(f"topics.config: unknown Tank config key {key!r} "
                              f"(known: {', '.join(CONFIG_KEYS)})")
        try:
            parse_value(name, text.strip())
        except InvalidConfig as exc:
            raise ConfigError(f"topics.config: bad value {text!r} for {key!r}: {exc}") from None
    return config


@dataclass(frozen=True, slots=True)
class Option:
    """One setting: TOML ``key`` (``section.name``), attribute, parser and help."""

    key: str
    attr: str
    parse: Callable[[Any], Any]
    default: Any
    help: str
    flag: str | None = None


OPTIONS: tuple[Option, ...] = (
    Option("store.data_dir", "data_dir", _path, Path("data"),
           "Directory of the embedded log (Tank's on-disk layout).", "--data-dir"),
    Option("store.durability", "durability", _choice("fsync", "os"), "fsync",
           "fsync: acknowledge after the bundle is fsynced (group commit); "
           "os: after write(), like the Tank broker.", "--durability"),
    Option("store.max_bundle_bytes", "max_bundle_bytes", _positive_int, 64 * MIB,
           "Largest bundle accepted for one partition.", "--max-bundle-bytes"),
    Option("store.retention_check_secs", "retention_check_secs", _non_negative_float, 30.0,
           "How often retention and age-based rolling run.", None),
    Option("store.tail_cache_bytes", "tail_cache_bytes", _non_negative_int, 16 * MIB,
           "Memory for the newest bundles of all partitions, read by the readers at the "
           "tail instead of the files (0: off).", None),
    Option("listen.tank", "tank_listen", _optional_address, "127.0.0.1:11011",
           "Tank protocol listener (empty: off).", "--tank-listen"),
    Option("listen.figg", "figg_listen", _optional_address, "127.0.0.1:8119",
           "Figg protocol listener (empty: off).", "--figg-listen"),
    Option("listen.metrics", "metrics_listen", _optional_address, "127.0.0.1:9464",
           "Prometheus metrics and health endpoint (empty: off).", "--metrics-listen"),
    Option("upstream.brokers", "upstream", _addresses, (),
           "Bridge mode: upstream Tank brokers, tried in order (empty: embedded store).",
           "--upstream"),
    Option("topics.auto_create", "auto_create_topics", _boolean, True,
           "Create a topic on first produce, publish or attach.", "--auto-create-topics"),
    Option("topics.default_partitions", "default_partitions", _positive_int, 1,
           "Partitions of an auto-created topic.", "--default-partitions"),
    Option("topics.config", "topic_config", _topic_config, {},
           "Tank config keys for new topics, e.g. {\"log.segment.bytes\" = \"1073741824\"}.",
           None),
    Option("limits.max_frame_bytes", "max_frame_bytes", _positive_int, 64 * MIB,
           "Largest frame a client may send; larger closes the connection.",
           "--max-frame-bytes"),
    Option("limits.max_connections", "max_connections", _positive_int, 10_000,
           "Connections served at once per listener; more are closed on accept.",
           "--max-connections"),
    Option("limits.idle_timeout_secs", "idle_timeout_secs", _non_negative_float, 16.0,
           "A Tank connection that sends no request for this long is closed.", None),
    Option("limits.subscriber_buffer_bytes", "subscriber_buffer_bytes", _positive_int, 4 * MIB,
           "Bytes queued for one Figg connection before its subscriptions stop reading "
           "the log and wait for the socket.", None),
    Option("figg.data_cache_bytes", "figg_data_cache_bytes", _non_negative_int, 8 * MIB,
           "Memory for the DATA frames shared by Figg subscribers at the same position "
           "(0: off).", None),
    Option("log.level", "log_level", _choice("debug", "info", "warning", "error"), "info",
           "Lowest level logged.", "--log-level"),
    Option("log.format", "log_format", _choice("auto", "json", "console"), "auto",
           "json: one JSON object a line; console: for people; auto: console on a terminal.",
           "--log-format"),
)


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything the gateway is configured with. Build it with :func:`load_settings`."""

    data_dir: Path = Path("data")
    durability: str = "fsync"
    max_bundle_bytes: int = 64 * MIB
    retention_check_secs: float = 30.0
    tail_cache_bytes: int = 16 * MIB
    tank_listen: str = "127.0.0.1:11011"
    figg_listen: str = "127.0.0.1:8119"
    metrics_listen: str = "127.0.0.1:9464"
    upstream: tuple[str, ...] = ()
    auto_create_topics: bool = True
    default_partitions: int = 1
    topic_config: dict[str, str] = field(default_factory=dict)
    max_frame_bytes: int = 64 * MIB
    max_connections: int = 10_000
    idle_timeout_secs: float = 16.0
    subscriber_buffer_bytes: int = 4 * MIB
    figg_data_cache_bytes: int = 8 * MIB
    log_level: str = "info"
    log_format: str = "auto"

    @property
    def bridge_mode(self) -> bool:
        return bool(self.upstream)

    def with_overrides(self, **changes: Any) -> Settings:
        """A copy with some settings changed (each parsed like the config file's)."""
        by_attr = {o.attr: o for o in OPTIONS}
        parsed = {}
        for attr, value in changes.items():
            if attr not in by_attr:
                raise ConfigError(f"unknown setting {attr!r}")
            parsed[attr] = _parse_option(by_attr[attr], value)
        return replace(self, **parsed)


def _parse_option(option: Option, value: Any) -> Any:
    try:
        return option.parse(value)
    except ConfigError:
        raise  # already names the key (and the entry of a table)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"{option.key}: {exc} (got {value!r})") from None


def _flatten(table: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    known_tables = {o.key for o in OPTIONS if o.parse is _topic_config}
    flat: dict[str, Any] = {}
    for name, value in table.items():
        key = f"{prefix}{name}"
        if isinstance(value, Mapping) and key not in known_tables:
            flat.update(_flatten(value, f"{key}."))
        else:
            flat[key] = value
    return flat


def settings_from_mapping(table: Mapping[str, Any]) -> Settings:
    """Settings from a decoded TOML document; unknown keys are errors."""
    by_key = {o.key: o for o in OPTIONS}
    values: dict[str, Any] = {}
    for key, value in _flatten(table).items():
        option = by_key.get(key)
        if option is None:
            raise ConfigError(f"{key}: unknown setting")
        values[option.attr] = _parse_option(option, value)
    return Settings(**values)


def load_settings(config_file: Path | None = None,
                  overrides: Mapping[str, Any] | None = None) -> Settings:
    """Settings from an optional TOML file, then flag overrides (attr -> raw value)."""
    settings = Settings()
    if config_file is not None:
        try:
            with open(config_file, "rb") as f:
                document = tomllib.load(f)
        except OSError as exc:
            raise ConfigError(f"config file {config_file}: {exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {config_file}: {exc}") from None
        settings = settings_from_mapping(document)
    if overrides:
        settings = settings.with_overrides(
            **{k: v for k, v in overrides.items() if v is not None})
    return settings


def add_setting_flags(parser: argparse.ArgumentParser) -> None:
    """Add one flag per option that has one; unset flags stay None (no override)."""
    for option in OPTIONS:
        if option.flag is None:
            continue
        kwargs: dict[str, Any] = {"dest": option.attr, "default": None,
                                  "help": f"{option.help} [{option.key}]"}
        choices = getattr(option.parse, "choices", None)
        if choices:
            kwargs["choices"] = choices
        if option.parse is _addresses:
            kwargs["action"] = "append"
        parser.add_argument(option.flag, **kwargs)


def flag_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The settings given on the command line, by attribute name."""
    return {o.attr: getattr(args, o.attr) for o in OPTIONS
            if o.flag is not None and getattr(args, o.attr, None) is not None}


def reference_table() -> str:
    """The configuration reference as a Markdown table (kept in the README)."""
    rows = ["| key | flag | default | meaning |", "|---|---|---|---|"]
    for option in OPTIONS:
        default = option.default
        if isinstance(default, Path):
            default = str(default)
        shown = "(none)" if default in ((), {}, "") else f"`{default}`"
        rows.append(f"| `{option.key}` | {f'`{option.flag}`' if option.flag else ''} "
                    f"| {shown} | {option.help} |")
    return "\n".join(rows)


def _check_table_matches_settings() -> None:
    # The table and the dataclass must agree; checked at import so drift fails fast.
    defaults = Settings()
    declared = {o.attr for o in OPTIONS}
    if declared != {f.name for f in fields(Settings)}:
        raise RuntimeError("Settings and OPTIONS declare different settings")
    for option in OPTIONS:
        if getattr(defaults, option.attr) != option.default:
            raise RuntimeError(f"{option.key}: default differs between Settings and OPTIONS")


_check_table_matches_settings()

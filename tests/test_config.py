"""Settings: TOML file, flag overrides, and clear errors naming the key."""

import argparse
from pathlib import Path

import pytest

from gateway.core.config import (
    OPTIONS,
    ConfigError,
    Settings,
    add_setting_flags,
    flag_overrides,
    load_settings,
    parse_address,
    reference_table,
)


def test_defaults_are_the_documented_ports() -> None:
    settings = load_settings()
    assert settings.tank_listen == "127.0.0.1:11011"
    assert settings.figg_listen == "127.0.0.1:8119"
    assert settings.metrics_listen == "127.0.0.1:9464"
    assert settings.durability == "fsync"
    assert settings.auto_create_topics is True
    assert not settings.bridge_mode


def test_file_then_flags(tmp_path: Path) -> None:
    config = tmp_path / "figtank.toml"
    config.write_text("""
[store]
data_dir = "/srv/figtank"
durability = "os"

[listen]
tank = "127.0.0.1:21011"

[topics]
default_partitions = 4
config = { "log.segment.bytes" = 1048576, "log.retention.secs" = "3600" }

[upstream]
brokers = ["127.0.0.1:1", "127.0.0.1:2"]
""")
    settings = load_settings(config, {"durability": "fsync", "figg_listen": "127.0.0.1:9"})
    assert settings.data_dir == Path("/srv/figtank")
    assert settings.durability == "fsync"          # the flag wins over the file
    assert settings.tank_listen == "127.0.0.1:21011"
    assert settings.figg_listen == "127.0.0.1:9"
    assert settings.default_partitions == 4
    assert settings.topic_config == {"log.segment.bytes": "1048576",
                                     "log.retention.secs": "3600"}
    assert settings.upstream == ("127.0.0.1:1", "127.0.0.1:2")
    assert settings.bridge_mode


@pytest.mark.parametrize(("toml", "key"), [
    ('[store]\ndurability = "sometimes"', "store.durability"),
    ("[topics]\ndefault_partitions = 0", "topics.default_partitions"),
    ('[listen]\ntank = "nowhere"', "listen.tank"),
    ('[listen]\nfigg = "127.0.0.1:70000"', "listen.figg"),
    ("[limits]\nmax_frame_bytes = -5", "limits.max_frame_bytes"),
    ("[store]\ncolour = 1", "store.colour"),
    ('[topics]\nauto_create = "maybe"', "topics.auto_create"),
])
def test_bad_config_names_the_key(tmp_path: Path, toml: str, key: str) -> None:
    config = tmp_path / "bad.toml"
    config.write_text(toml)
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_settings(config)


def test_unreadable_and_malformed_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"missing\.toml"):
        load_settings(tmp_path / "missing.toml")
    broken = tmp_path / "broken.toml"
    broken.write_text("[store\n")
    with pytest.raises(ConfigError, match=r"broken\.toml"):
        load_settings(broken)


def test_flags_are_generated_from_the_table() -> None:
    parser = argparse.ArgumentParser()
    add_setting_flags(parser)
    args = parser.parse_args(["--durability", "os", "--upstream", "127.0.0.1:1",
                              "--upstream", "127.0.0.1:2", "--data-dir", "d"])
    overrides = flag_overrides(args)
    assert overrides == {"durability": "os", "upstream": ["127.0.0.1:1", "127.0.0.1:2"],
                         "data_dir": "d"}
    settings = load_settings(None, overrides)
    assert settings.upstream == ("127.0.0.1:1", "127.0.0.1:2")
    with pytest.raises(SystemExit):
        parser.parse_args(["--durability", "never"])


def test_reference_table_lists_every_option() -> None:
    table = reference_table()
    for option in OPTIONS:
        assert f"`{option.key}`" in table


def test_with_overrides_validates() -> None:
    with pytest.raises(ConfigError, match="unknown setting"):
        Settings().with_overrides(colour="blue")
    with pytest.raises(ConfigError, match=r"store\.durability"):
        Settings().with_overrides(durability="x")


@pytest.mark.parametrize(("text", "expected"), [
    ("127.0.0.1:11011", ("127.0.0.1", 11011)), ("[::1]:8119", ("::1", 8119)),
    ("localhost:0", ("localhost", 0)),
])
def test_parse_address(text: str, expected: tuple[str, int]) -> None:
    assert parse_address(text) == expected

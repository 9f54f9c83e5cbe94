"""Upstream-Kafka mode's settings: the flag, the config file, security and the
pass-through table, and the librdkafka configurations made from them."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from gateway.backend.kafka.clients import (
    admin_config,
    producer_config,
    reader_config,
)
from gateway.server.config import (
    ConfigError,
    Settings,
    add_setting_flags,
    flag_overrides,
    load_settings,
)


def _from_flags(*argv: str) -> Settings:
    parser = argparse.ArgumentParser()
    add_setting_flags(parser)
    return load_settings(None, flag_overrides(parser.parse_args(list(argv))))


def test_the_flag_takes_a_comma_separated_list_and_repeats() -> None:
    settings = _from_flags("--upstream-kafka", "k1:9092,k2:9092", "--upstream-kafka",
                           "k3:9093")
    assert settings.upstream_kafka == ("k1:9092", "k2:9092", "k3:9093")
    assert settings.upstream_kafka_mode and settings.upstream_mode
    assert not settings.bridge_mode
    assert producer_config(settings, delivery_timeout_ms=1)["bootstrap.servers"] == (
        "k1:9092,k2:9092,k3:9093")


def test_the_config_file_names_security_and_passes_librdkafka_settings(
        tmp_path: Path) -> None:
    config = tmp_path / "figtank.toml"
    config.write_text("""
[upstream_kafka]
bootstrap_servers = ["kafka-0:9093", "kafka-1:9093"]
client_id = "gw-a"
tls_ca = "ca.pem"
tls_cert = "client.pem"
tls_key = "client.key"
sasl_mechanism = "SCRAM-SHA-512"
sasl_username = "gateway"
sasl_password = "secret"

[upstream_kafka.librdkafka]
"socket.keepalive.enable" = true
"message.timeout.ms" = 20000
"acks" = "all"
""")
    settings = load_settings(config)
    produce = producer_config(settings, delivery_timeout_ms=10_000)
    assert produce["security.protocol"] == "sasl_ssl"
    assert (produce["ssl.ca.location"], produce["ssl.certificate.location"],
            produce["ssl.key.location"]) == ("ca.pem", "client.pem", "client.key")
    assert (produce["sasl.mechanism"], produce["sasl.username"], produce["sasl.password"]
            ) == ("SCRAM-SHA-512", "gateway", "secret")
    assert produce["client.id"] == "gw-a"
    assert produce["enable.idempotence"] is True and produce["acks"] == "all"
    # The table wins over figtank's own choices and is text, as librdkafka takes it.
    assert produce["message.timeout.ms"] == "20000"
    assert produce["socket.keepalive.enable"] == "true"
    read = reader_config(settings, queued_kbytes=512)
    assert read["enable.auto.commit"] is False and read["auto.offset.reset"] == "error"
    assert read["queued.max.messages.kbytes"] == 512
    assert read["security.protocol"] == "sasl_ssl"
    # A topic looked up through the admin client (a producer to librdkafka) must not be
    # created by a cluster that auto-creates topics (the e2e check: test_errors.py).
    assert admin_config(settings)["allow.auto.create.topics"] is False


@pytest.mark.parametrize(("extra", "protocol"), [
    ({}, "plaintext"),
    ({"upstream_kafka_tls": True}, "ssl"),
    ({"upstream_kafka_sasl_mechanism": "PLAIN", "upstream_kafka_sasl_username": "u"},
     "sasl_plaintext"),
    ({"upstream_kafka_tls_ca": "ca.pem", "upstream_kafka_sasl_mechanism": "SCRAM-SHA-256",
      "upstream_kafka_sasl_username": "u"}, "sasl_ssl"),
])
def test_security_protocol_follows_what_is_configured(extra: dict, protocol: str) -> None:
    settings = Settings().with_overrides(upstream_kafka="k:9092", **extra)
    assert admin_config(settings)["security.protocol"] == protocol


@pytest.mark.parametrize(("toml", "names"), [
    ('[upstream]\nbrokers = ["t:11011"]\n[upstream_kafka]\nbootstrap_servers = ["k:9092"]',
     "not both"),
    ('[upstream_kafka]\nbootstrap_servers = ["k:9092"]\ntls_cert = "c.pem"',
     "upstream_kafka.tls_cert"),
    ('[upstream_kafka]\nbootstrap_servers = ["k:9092"]\nsasl_mechanism = "GSSAPI"',
     "upstream_kafka.sasl_mechanism"),
    ('[upstream_kafka]\nbootstrap_servers = ["k:9092"]\nsasl_mechanism = "PLAIN"',
     "upstream_kafka.sasl_username"),
    ('[upstream_kafka]\nbootstrap_servers = ["k9092"]', "upstream_kafka.bootstrap_servers"),
    ('[upstream_kafka.librdkafka]\n"a" = [1]', "upstream_kafka.librdkafka"),
])
def test_bad_settings_name_the_key(tmp_path: Path, toml: str, names: str) -> None:
    config = tmp_path / "figtank.toml"
    config.write_text(toml)
    with pytest.raises(ConfigError, match=names.replace(".", r"\.")):
        load_settings(config)

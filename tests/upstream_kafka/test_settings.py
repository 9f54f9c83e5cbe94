"""Upstream-Kafka mode's settings: the flag, the config file, security, the producer's
own settings, and what the gateway's client is given from them."""

from __future__ import annotations

import argparse
import ssl
from pathlib import Path

import pytest

from gateway.backend.kafka import UpstreamKafkaSettings, bootstrap_addresses, security_of
from gateway.core.config import (
    ConfigError,
    Settings,
    add_setting_flags,
    flag_overrides,
    load_settings,
)
from tests.tls_certs import Certs


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
    assert bootstrap_addresses(UpstreamKafkaSettings.of(settings)) == [
        ("k1", 9092), ("k2", 9092), ("k3", 9093)]
    # Batches go up compressed as the clients compressed their bundles (Kafka's
    # compression.type=producer), at most 512 KiB of records each.
    assert (settings.upstream_kafka_compression,
            settings.upstream_kafka_max_batch_bytes) == ("producer", 512 * 1024)
    # Reads behind the tail fetch 16 reads ahead at most, together.
    assert UpstreamKafkaSettings.of(settings).read_ahead == 16


def test_the_config_file_names_security_and_the_producer_settings(
        tmp_path: Path, certs: Certs) -> None:
    config = tmp_path / "figtank.toml"
    config.write_text(f"""
[upstream_kafka]
bootstrap_servers = ["kafka-0:9093", "[::1]:9094"]
client_id = "gw-a"
tls_ca = "{certs.ca_pem}"
tls_cert = "{certs.client_cert}"
tls_key = "{certs.client_key}"
sasl_mechanism = "SCRAM-SHA-512"
sasl_username = "gateway"
sasl_password = "secret"
compression = "lz4"
max_batch_bytes = 65536
delivery_timeout_secs = 20
read_ahead = 0
""")
    settings = load_settings(config)
    upstream = UpstreamKafkaSettings.of(settings)
    assert bootstrap_addresses(upstream) == [("kafka-0", 9093), ("::1", 9094)]
    assert upstream.client_id == "gw-a"
    security = security_of(upstream)
    assert security.ssl_context is not None
    assert security.ssl_context.verify_mode is ssl.CERT_REQUIRED
    assert (security.sasl_mechanism, security.sasl_username, security.sasl_password) == (
        "SCRAM-SHA-512", "gateway", "secret")
    assert (settings.upstream_kafka_compression, settings.upstream_kafka_max_batch_bytes,
            settings.upstream_kafka_delivery_timeout_secs) == ("lz4", 65536, 20.0)
    assert upstream.read_ahead == 0


@pytest.mark.parametrize(("extra", "tls", "sasl"), [
    ({}, False, ""),
    ({"upstream_kafka_tls": True}, True, ""),
    ({"upstream_kafka_sasl_mechanism": "PLAIN", "upstream_kafka_sasl_username": "u"},
     False, "PLAIN"),
    ({"upstream_kafka_tls": True, "upstream_kafka_sasl_mechanism": "SCRAM-SHA-256",
      "upstream_kafka_sasl_username": "u"}, True, "SCRAM-SHA-256"),
])
def test_security_follows_what_is_configured(extra: dict, tls: bool, sasl: str) -> None:
    settings = Settings().with_overrides(upstream_kafka="k:9092", **extra)
    security = security_of(UpstreamKafkaSettings.of(settings))
    assert (security.ssl_context is not None, security.sasl_mechanism) == (tls, sasl)


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
    # librdkafka's pass-through table is gone with librdkafka: named, not ignored.
    ('[upstream_kafka.librdkafka]\n"acks" = "all"', "upstream_kafka.librdkafka"),
    ('[upstream_kafka]\ncompression = "brotli"', "upstream_kafka.compression"),
    ("[upstream_kafka]\nread_ahead = -1", "upstream_kafka.read_ahead"),
])
def test_bad_settings_name_the_key(tmp_path: Path, toml: str, names: str) -> None:
    config = tmp_path / "figtank.toml"
    config.write_text(toml)
    with pytest.raises(ConfigError, match=names.replace(".", r"\.")):
        load_settings(config)

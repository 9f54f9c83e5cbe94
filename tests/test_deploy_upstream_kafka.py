"""deploy/upstream-kafka/: two gateways in front of a 3-node Kafka cluster behind HAProxy.

Docker is not available where the suite runs, so the files are checked as far as they can
be here: the compose file parses (PyYAML, which mkdocs brings), each gateway's command and
its config file are accepted by figtank's own parser and config loader, the ports agree
between the gateways, HAProxy and the published ports, and HAProxy checks /health.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.cli.main import build_parser, settings_from_args
from gateway.core.config import Settings, load_settings, parse_address
from tests.test_deploy import CONFIG_PATH, PORTS, flags, serve_parser

HERE = Path(__file__).resolve().parents[1] / "deploy" / "upstream-kafka"
GATEWAYS = ("gateway-a", "gateway-b")
BROKERS = ("kafka-1", "kafka-2", "kafka-3")
#: What HAProxy balances: the gateway listener behind each of its frontends.
BALANCED = {"figg": PORTS["figg"], "tank": PORTS["tank"], "kafka": PORTS["kafka"]}


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    document = yaml.safe_load((HERE / "compose.yaml").read_text())
    assert isinstance(document, dict)
    return document


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, Any]:
    return compose["services"]


def haproxy_sections() -> dict[str, list[str]]:
    """``"backend NAME"`` (etc.) -> its lines, stripped, comments dropped."""
    sections: dict[str, list[str]] = {}
    current: list[str] = []
    for raw in (HERE / "haproxy.cfg").read_text().splitlines():
        line = raw.split("#", 1)[0].rstrip()
        if not line:
            continue
        if not raw[0].isspace():
            current = sections.setdefault(line.strip(), [])
        else:
            current.append(line.strip())
    return sections


def gateway_settings(command: list[str], tmp_path: Path) -> Settings:
    """What figtank makes of a gateway's command with the config file compose mounts."""
    args = build_parser().parse_args(command)
    assert str(args.config) == CONFIG_PATH
    local = tmp_path / "figtank.toml"
    local.write_text((HERE / "figtank.toml").read_text())
    args.config = local
    return settings_from_args(args)


def test_services_and_official_images(services: dict[str, Any]) -> None:
    assert set(services) == {*BROKERS, *GATEWAYS, "haproxy"}
    for broker in BROKERS:
        assert services[broker]["image"].startswith("apache/kafka:")
    assert services["haproxy"]["image"].startswith("haproxy:")
    for gateway in GATEWAYS:
        build = services[gateway]["build"]
        assert build["dockerfile"] == "deploy/Dockerfile"
        assert (HERE / build["context"] / build["dockerfile"]).is_file()
        assert services[gateway]["stop_signal"] == "SIGTERM"


def test_the_gateways_image_needs_no_extra(services: dict[str, Any]) -> None:
    """figtank speaks Kafka to the cluster itself: the gateways' image is the plain one
    (the Dockerfile still takes optional extras)."""
    dockerfile = (HERE.parent / "Dockerfile").read_text()
    assert re.search(r'^ARG EXTRAS=""$', dockerfile, re.MULTILINE)
    assert 'pip install --no-cache-dir "figtank[$EXTRAS]"' in dockerfile
    for gateway in GATEWAYS:
        assert "args" not in services[gateway]["build"]


@pytest.mark.parametrize("gateway", GATEWAYS)
def test_gateway_command_and_config_are_accepted(services: dict[str, Any], gateway: str,
                                                 tmp_path: Path) -> None:
    service = services[gateway]
    command = service["command"]
    assert command[0] == "serve"
    known = {option for action in serve_parser()._actions for option in action.option_strings}
    assert set(flags(command)) <= known
    assert f"./figtank.toml:{CONFIG_PATH}:ro" in service["volumes"]
    settings = gateway_settings(command, tmp_path)
    # In front of the three brokers, at the addresses they advertise.
    advertised = {services[b]["environment"]["KAFKA_ADVERTISED_LISTENERS"]
                  .removeprefix("PLAINTEXT://") for b in BROKERS}
    assert set(settings.upstream_kafka) == advertised
    assert settings.upstream_kafka_client_id == f"figtank-{gateway}"
    for name, port in PORTS.items():
        address = getattr(settings, f"{name}_listen")
        if name == "http":
            assert address == ""  # not balanced: off
        else:
            assert parse_address(address)[1] == port, name
    # The gateways' health check is the one the other deployments use.
    assert f"127.0.0.1:{PORTS['metrics']}/health'" in " ".join(service["healthcheck"]["test"])


def test_gateways_differ_only_by_client_id(services: dict[str, Any], tmp_path: Path) -> None:
    made = [gateway_settings(services[g]["command"], tmp_path) for g in GATEWAYS]
    assert len({s.upstream_kafka_client_id for s in made}) == len(GATEWAYS)
    a, b = (dataclasses.replace(s, upstream_kafka_client_id="") for s in made)
    assert a == b


def test_kafka_clients_are_sent_back_to_the_load_balancer(services: dict[str, Any]) -> None:
    settings = load_settings(HERE / "figtank.toml")
    host, port = parse_address(settings.kafka_advertised)
    published = {int(c): (h, int(p)) for h, p, c in (
        re.fullmatch(r"([\d.]+):(\d+):(\d+)", entry).groups()  # type: ignore[union-attr]
        for entry in services["haproxy"]["ports"])}
    assert published[PORTS["kafka"]] == (host, port)


def test_kraft_quorum(services: dict[str, Any]) -> None:
    voters = set()
    for broker in BROKERS:
        env = services[broker]["environment"]
        assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"
        voters.add(f"{env['KAFKA_NODE_ID']}@{broker}:9093")
        assert env["KAFKA_AUTO_CREATE_TOPICS_ENABLE"] == "false"  # the gateways decide
        replicas = int(env["KAFKA_DEFAULT_REPLICATION_FACTOR"])
        assert int(env["KAFKA_MIN_INSYNC_REPLICAS"]) < replicas <= len(BROKERS)
        assert f"{broker}-data:/var/lib/kafka/data" in services[broker]["volumes"]
    assert len(voters) == len(BROKERS)
    for broker in BROKERS:
        env = services[broker]["environment"]
        assert set(env["KAFKA_CONTROLLER_QUORUM_VOTERS"].split(",")) == voters
        assert env["CLUSTER_ID"] == services[BROKERS[0]]["environment"]["CLUSTER_ID"]


def test_haproxy_balances_each_listener_over_healthy_gateways(services: dict[str, Any]
                                                             ) -> None:
    sections = haproxy_sections()
    assert "mode tcp" in sections["defaults"]
    published = sorted(int(entry.rsplit(":", 1)[1]) for entry in services["haproxy"]["ports"])
    assert published == sorted(BALANCED.values())
    for name, port in BALANCED.items():
        frontend = sections[f"frontend {name}"]
        assert f"bind :{port}" in frontend
        [backend_name] = [line.split()[1] for line in frontend
                          if line.startswith("default_backend ")]
        backend = sections[f"backend {backend_name}"]
        assert "option httpchk GET /health" in backend
        assert "http-check expect status 200" in backend
        [defaults] = [line for line in backend if line.startswith("default-server ")]
        assert "check" in defaults.split() and f"port {PORTS['metrics']}" in defaults
        servers = {line.split()[1]: line.split()[2] for line in backend
                   if line.startswith("server ")}
        assert servers == {gateway: f"{gateway}:{port}" for gateway in GATEWAYS}
    assert "./haproxy.cfg:/usr/local/etc/haproxy/haproxy.cfg:ro" in services["haproxy"]["volumes"]

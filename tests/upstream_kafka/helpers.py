"""Upstream-Kafka tests: ``figtank serve --upstream-kafka`` gateways, as real processes, in
front of an upstream cluster that is either a ``figtank serve`` process (its embedded store
behind its Kafka listener: :class:`Upstream`) or Tansu, a Kafka-compatible broker written
elsewhere (:class:`tests.tansu.TansuUpstream`). The ``upstream`` fixture
(``tests/upstream_kafka/conftest.py``) runs a test against each."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import confluent_kafka as ck
import trio

from gateway.auth.users import user_entry
from gateway.client.errors import UnknownTopicError
from gateway.client.tank import open_tank_client
from tests.bridge.helpers import free_port
from tests.serving import Served, ServeProcess
from tests.tansu import TansuUpstream
from tests.tls_certs import Certs

LOOPBACK = "127.0.0.1:0"
#: The upstreams the ``upstream`` fixture runs a test against.
UPSTREAM_KINDS = ("figtank", "tansu")


class Upstream:
    """The figtank stand-in upstream: Kafka listener (what gateways use) and Tank listener
    (what the tests read the stored log with) on fixed ports, so that it comes back where
    it was after a kill."""

    kind = "figtank"

    def __init__(self, data_dir: Path, *more: str) -> None:
        self.kafka_port = free_port()
        self.tank_port = free_port()
        self.address = f"127.0.0.1:{self.kafka_port}"
        self.served = Served(
            "--data-dir", str(data_dir), "--durability", "fsync",
            "--kafka-listen", self.address, "--tank-listen", f"127.0.0.1:{self.tank_port}",
            "--figg-listen", "", "--metrics-listen", "", "--grace", "0.2", *more)

    async def start(self) -> None:
        await self.served.start()

    async def kill(self) -> None:
        await self.served.kill()

    def close(self) -> None:
        self.served.close()

    @property
    def pid(self) -> int:
        assert self.served.process is not None
        return self.served.process.process.pid

    async def create_topic(self, topic: str, partitions: int) -> None:
        async with open_tank_client("127.0.0.1", self.tank_port, request_timeout=10) as tank:
            await tank.create_topic(topic, partitions)

    async def partitions(self, topic: str) -> int:
        """How many partitions the upstream has for ``topic`` (0: unknown)."""
        async with open_tank_client("127.0.0.1", self.tank_port, request_timeout=10) as tank:
            try:
                return len(await tank.discover_partitions(topic))
            except UnknownTopicError:
                return 0

    async def stored(self, topic: str, partition: int = 0) -> list[tuple[int, bytes]]:
        """``(sequence, value)`` of every message the upstream holds in the partition."""
        async with open_tank_client("127.0.0.1", self.tank_port, request_timeout=10) as tank:
            bounds = await tank.discover_partitions(topic)
            high = bounds[partition].high_water_mark
            out: list[tuple[int, bytes]] = []
            seq = 1
            while seq <= high:
                result = await tank.consume(topic, partition, seq, fetch_size=4 * 1024 * 1024)
                out += [(m.seq, m.value) for m in result.messages if m.seq >= seq]
                seq = result.next_seq if result.messages else high + 1
            return out


#: Either upstream (both have ``kind``, ``address``, ``start``, ``kill``, ``close``, ``pid``,
#: ``create_topic``, ``partitions`` and ``stored``).
AnyUpstream = Upstream | TansuUpstream


def new_upstream(kind: str, root: Path) -> AnyUpstream:
    """An upstream of ``kind`` (:data:`UPSTREAM_KINDS`), not started, its files in ``root``."""
    return Upstream(root / "up") if kind == "figtank" else TansuUpstream(root / "tansu")


#: SASL mechanisms the secured upstream's Kafka listener enables.
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
#: The gateway's user at the secured upstream, and its password.
GATEWAY_USER, GATEWAY_PASSWORD = "gateway", "gateway-secret"


def upstream_config(root: Path, *, certs: Certs | None = None, rules: str = "",
                    listener: str = "", settings: str = "") -> Path:
    """A config file for an upstream: with ``certs``, its Kafka listener ``secure``
    (port :attr:`Upstream.kafka_port`, given with ``--kafka-listen ""``) requires TLS and
    SASL (:data:`MECHANISMS`) and user :data:`GATEWAY_USER` exists; ``rules`` are access
    policy rules (default allow), ``listener`` more keys of that listener, ``settings``
    more TOML (tables after the listener)."""
    root.mkdir(parents=True, exist_ok=True)
    policy = root / "access.toml"
    policy.write_text('default = "allow"\n' + rules + "\n" + user_entry(
        GATEWAY_USER, GATEWAY_PASSWORD, ["SCRAM-SHA-256", "SCRAM-SHA-512"]))
    text = f'[auth]\npolicy_file = "{policy}"\n'
    if certs is not None:
        mechanisms = ", ".join(f'"{m}"' for m in MECHANISMS)
        text += (f'[listeners.secure]\nprotocol = "kafka"\naddress = "{{address}}"\n'
                 f'tls_cert = "{certs.server_cert}"\ntls_key = "{certs.server_key}"\n'
                 f'sasl_mechanisms = [{mechanisms}]\n{listener}')
    config = root / "upstream.toml"
    config.write_text(text + settings)
    return config


class SecuredUpstream(Upstream):
    """An upstream whose Kafka listener requires TLS and SASL (:func:`upstream_config`):
    :attr:`address` is that listener's."""

    def __init__(self, root: Path, certs: Certs, *, rules: str = "", listener: str = "",
                 settings: str = "", more: tuple[str, ...] = ()) -> None:
        config = upstream_config(root, certs=certs, rules=rules, listener=listener,
                                 settings=settings)
        super().__init__(root / "data", "--config", str(config), *more)
        config.write_text(config.read_text().replace("{address}", self.address))
        # The secure listener replaces the plain one.
        args = list(self.served.args)
        args[args.index("--kafka-listen") + 1] = ""
        self.served.args = tuple(args)


def gateway_config(root: Path, *, certs: Certs | None = None, mechanism: str = "",
                   password: str = GATEWAY_PASSWORD, settings: str = "") -> Path:
    """A gateway's config file: ``[upstream_kafka]`` TLS (the test CA) and SASL
    (``mechanism`` as :data:`GATEWAY_USER`), and ``settings`` (more TOML)."""
    root.mkdir(parents=True, exist_ok=True)
    text = "[upstream_kafka]\n"
    if certs is not None:
        text += f'tls_ca = "{certs.ca_pem}"\n'
    if mechanism:
        text += (f'sasl_mechanism = "{mechanism}"\nsasl_username = "{GATEWAY_USER}"\n'
                 f'sasl_password = "{password}"\n')
    config = root / "gateway.toml"
    config.write_text(text + settings)
    return config


def gateway(upstream: str, *more: str) -> Served:
    """A gateway in upstream-Kafka mode, every listener on an ephemeral loopback port."""
    return Served("--upstream-kafka", upstream, "--tank-listen", LOOPBACK,
                  "--figg-listen", LOOPBACK, "--kafka-listen", LOOPBACK,
                  "--metrics-listen", LOOPBACK, "--grace", "0.2", *more)


@asynccontextmanager
async def upstream_and_gateway(root: Path, *more: str, upstream: AnyUpstream | None = None
                               ) -> AsyncIterator[tuple[Any, Served, ServeProcess]]:
    """An upstream (``upstream``, else a figtank one with its data in ``root / "up"``) and
    a gateway in front of it (``more``: its further arguments), both started (within 60 s)
    and closed on the way out: the upstream, the gateway's :class:`Served` and its
    running process."""
    upstream = upstream if upstream is not None else Upstream(root / "up")
    front = gateway(upstream.address, *more)
    try:
        with trio.fail_after(60):
            await upstream.start()
            served = await front.start()
        yield upstream, front, served
    finally:
        front.close()
        upstream.close()


def kafka_delivery_error(address: str, topic: str, value: bytes = b"x", *,
                         timeout_ms: int = 4000, **config: Any) -> str:
    """The error name librdkafka reports for one produce to ``topic``/0 at ``address``
    ("" when written; ``config``: more producer settings, e.g. ``acks``)."""
    producer = ck.Producer({"bootstrap.servers": address, "message.timeout.ms": timeout_ms,
                            **config})
    errors: list[str] = []
    producer.produce(topic, value, partition=0,
                     on_delivery=lambda err, msg: errors.append(err.name() if err else ""))
    producer.flush(timeout_ms / 1000 + 4)
    return errors[0] if errors else "no report"


def kafka_address(served: Any) -> str:
    host, port = served.kafka
    return f"{host}:{port}"


async def blocking(fn: Callable[..., Any], *args: Any) -> Any:
    """A blocking client call (confluent-kafka, kafka-python) in a worker thread."""
    return await trio.to_thread.run_sync(fn, *args)

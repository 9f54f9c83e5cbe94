"""A figtank server whose Kafka listeners require SASL, with users in its policy file."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from gateway.auth.users import user_entry
from gateway.core.config import ListenerTable, Settings
from gateway.server.run import ServerInfo, open_server
from tests.tls_certs import Certs

MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
#: Users and passwords of the test policy: alice may do anything; reader may read topic
#: ``guarded`` but not write it.
PASSWORDS = {"alice": "alice-secret", "reader": "reader-secret"}
RULES = """
default = "allow"

[[rule]]
who = ["user:reader"]
topics = ["guarded"]
allow = ["subscribe"]
deny = ["publish", "create"]
"""


def policy_text(users: dict[str, str] | None = None) -> str:
    """The policy file: :data:`RULES` and a ``[[user]]`` of each user."""
    return RULES + "\n" + "\n".join(
        user_entry(name, password, ["SCRAM-SHA-256", "SCRAM-SHA-512"])
        for name, password in (users or PASSWORDS).items())


@asynccontextmanager
async def sasl_server(tmp_path: Path, certs: Certs | None = None,
                      mechanisms: tuple[str, ...] = MECHANISMS, **more: Any
                      ) -> AsyncIterator[ServerInfo]:
    """Listener ``kafka``: SASL over plain TCP (PLAIN allowed there for the tests); with
    ``certs``, listener ``secure`` too: SASL over TLS."""
    policy = tmp_path / "access.toml"
    if not policy.exists():
        policy.write_text(policy_text())
    listeners = {"kafka": ListenerTable(tls=False, sasl_mechanisms=mechanisms,
                                        sasl_plain_without_tls=True)}
    tls: dict[str, Any] = {}
    if certs is not None:
        listeners["secure"] = ListenerTable(protocol="kafka", address="127.0.0.1:0",
                                            sasl_mechanisms=mechanisms)
        tls = {"tls_cert": str(certs.server_cert), "tls_key": str(certs.server_key)}
    settings = Settings(data_dir=tmp_path / "data", durability="os",
                        kafka_listen="127.0.0.1:0", http_listen="", tank_listen="", figg_listen="",
                        metrics_listen="", policy_file=policy, listeners=listeners,
                        **tls, **more)
    async with open_server(settings, grace=0.2) as server:
        yield server


def address(server: ServerInfo, listener: str = "kafka") -> str:
    host, port = server.addresses[listener]
    return f"{host}:{port}"


def failures(server: ServerInfo, listener: str, mechanism: str) -> float:
    """``figtank_sasl_auth_failures_total{listener,mechanism}``."""
    start = (f'figtank_sasl_auth_failures_total{{listener="{listener}",'
             f'mechanism="{mechanism}"}} ')
    for line in server.metrics_registry.render().decode().splitlines():
        if line.startswith(start):
            return float(line.split()[-1])
    return 0.0

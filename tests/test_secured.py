"""A secured figtank end to end (issue 16): one ``figtank serve`` with mutual TLS on its
Figg and Tank listeners, a plain operators' listener, and a deny-by-default access policy.

Real handshakes on loopback: the client certificate's subject is the identity the policy
names; SIGHUP reloads a changed policy and a renewed certificate together while a
subscriber stays connected.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from gateway.client.errors import UnknownTopicError
from gateway.client.figg_blocking import BlockingFiggClient
from gateway.client.tank_blocking import BlockingTankClient
from tests.serving import ServeProcess, figtank_serve
from tests.test_tls_serve import figtank, server_subject
from tests.tls_certs import Certs

ALICE = "CN=alice,OU=ops,O=acme"
POLICY = """
default = "deny"

[[rule]]                      # alice: her orders, and nothing of payments
who = ["CN=alice,OU=ops,O=acme"]
topics = ["orders-*"]
allow = ["publish", "subscribe", "create"]

[[rule]]                      # the operators' plain listener may do everything
who = ["listener:ops"]
topics = ["*"]
allow = ["publish", "subscribe", "create", "configure", "admin"]
"""
#: After the reload: alice may still read her orders, no longer write them.
READ_ONLY_POLICY = POLICY.replace('allow = ["publish", "subscribe", "create"]',
                                  'allow = ["subscribe"]')


def wait_events(server: ServeProcess, name: str, count: int, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while len(server.events(name)) < count:
        assert time.monotonic() < deadline, f"no {name} line: {server.log_lines[-5:]}"
        time.sleep(0.02)


def secured_config(tmp_path: Path, certs: Certs) -> tuple[Path, Path, Path, Path]:
    """The config file, and the live policy, certificate and key files it names."""
    policy, cert, key = tmp_path / "access.toml", tmp_path / "live.pem", tmp_path / "live.key"
    policy.write_text(POLICY)
    cert.write_bytes(certs.server_cert.read_bytes())
    key.write_bytes(certs.server_key.read_bytes())
    config = tmp_path / "figtank.toml"
    config.write_text(f"""
[store]
data_dir = "{tmp_path / 'data'}"
durability = "os"

[listen]
tank = "127.0.0.1:0"
figg = "127.0.0.1:0"
metrics = ""

[tls]
cert = "{cert}"
key = "{key}"
client_ca = "{certs.ca_pem}"

[listeners.ops]
protocol = "tank"
address = "127.0.0.1:0"
tls = false

[auth]
policy_file = "{policy}"
""")
    return config, policy, cert, key


def test_identities_policy_and_reload_over_real_tls(tmp_path: Path, certs: Certs) -> None:
    config, policy, cert, key = secured_config(tmp_path, certs)
    renewed_cert, renewed_key = certs.issue_server("renewed")
    alice = {"ca": certs.ca_pem, "cert": certs.client_cert, "key": certs.client_key}
    with figtank_serve("--config", str(config)) as server:
        assert server.figg is not None and server.tank is not None
        ops_host, _, ops_port = server.events("figtank_serving")[0]["listeners"]["ops"] \
            .rpartition(":")
        with BlockingTankClient(ops_host, int(ops_port)) as ops:
            ops.produce({("payments", 0): [b"salary"]})

        with BlockingTankClient(*server.tank, **alice) as tank:
            tank.produce({("orders-eu", 0): [b"o1"]})
            assert [m.value for m in tank.consume("orders-eu", 0, 0).messages] == [b"o1"]
            with pytest.raises(UnknownTopicError):  # not hers to read: no such topic
                tank.consume("payments", 0, 0)

        with BlockingFiggClient(*server.figg, **alice) as subscriber:
            sub = subscriber.subscribe("orders-eu", from_offset=0)
            assert sub.get(timeout=5).data == b"o1"

            policy.write_text(READ_ONLY_POLICY)
            cert.write_bytes(renewed_cert.read_bytes())
            key.write_bytes(renewed_key.read_bytes())
            os.kill(server.process.pid, signal.SIGHUP)
            wait_events(server, "reloaded", 3)  # the policy, and tank's and figg's TLS
            assert server_subject(server.figg, certs).startswith("CN=renewed")

            # The new policy holds for alice's new requests: her publish is refused...
            refused = figtank("publish", "orders-eu", "o2", "--figg",
                              f"{server.figg[0]}:{server.figg[1]}", "--ca",
                              str(certs.ca_pem), "--cert", str(certs.client_cert), "--key",
                              str(certs.client_key), "--timeout", "5")
            assert refused.returncode == 1, refused.stderr
            # ...while her subscriber, connected before the reload, still reads on.
            with BlockingTankClient(ops_host, int(ops_port)) as ops:
                ops.produce({("orders-eu", 0): [b"from ops"]})
            assert sub.get(timeout=5).data == b"from ops"
            assert subscriber.client.connections == 1
        assert server.stop() == 0

    denied = {(e["identity"], e["topic"], e["operation"])
              for e in server.events("access_denied")}
    assert denied == {(ALICE, "payments", "subscribe"), (ALICE, "orders-eu", "publish")}

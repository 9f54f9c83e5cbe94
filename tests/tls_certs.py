"""Certificates for the TLS tests, made by trustme and written to PEM files."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import trustme


@dataclass
class Certs:
    """A CA, a server certificate for 127.0.0.1 and a client certificate (CN=alice,
    OU=ops, O=acme), as files in ``root``; plus an unrelated CA's client certificate."""

    root: Path
    ca: trustme.CA
    ca_pem: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    stranger_cert: Path
    stranger_key: Path

    def issue_server(self, name: str, ca: trustme.CA | None = None) -> tuple[Path, Path]:
        """A new server certificate (files ``name``.pem/.key) for 127.0.0.1."""
        leaf = (ca or self.ca).issue_cert("127.0.0.1", "localhost", common_name=name)
        return _write(self.root, name, leaf)


def _write(root: Path, name: str, leaf: trustme.LeafCert) -> tuple[Path, Path]:
    cert, key = root / f"{name}.pem", root / f"{name}.key"
    leaf.cert_chain_pems[0].write_to_path(str(cert))
    for extra in leaf.cert_chain_pems[1:]:
        extra.write_to_path(str(cert), append=True)
    leaf.private_key_pem.write_to_path(str(key))
    return cert, key


def make_certs(root: Path) -> Certs:
    root.mkdir(parents=True, exist_ok=True)
    ca = trustme.CA()
    ca_pem = root / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_pem))
    server = _write(root, "server", ca.issue_cert("127.0.0.1", "localhost",
                                                  common_name="figtank"))
    client = _write(root, "alice", ca.issue_cert(common_name="alice", organization_name="acme",
                                                 organization_unit_name="ops"))
    stranger = _write(root, "mallory", trustme.CA().issue_cert(
        common_name="alice", organization_name="acme", organization_unit_name="ops"))
    return Certs(root, ca, ca_pem, *server, *client, *stranger)

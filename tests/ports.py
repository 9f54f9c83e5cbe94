"""Loopback ports for servers a test stops and starts again on the same port.

The kernel gives every outgoing connection a source port from its ephemeral range
(``net.ipv4.ip_local_port_range``, 32768-60999 by default). A port taken from that range
(bind to port 0) can be handed to some other test's client while its server is down, and
the restart then fails with "address already in use" (seen in the suite, three workers
connecting all the while). So the port is chosen below the range, where the kernel never
assigns one, and checked free with a bind.

Each pytest process takes its ports from a slice of its own (the xdist workers ``gw0``,
``gw1``, ... and a process that is not one): a port checked free here can still be chosen
by a test running at the same time in another process, which then starts its server
there first (a gateway would then reach another test's upstream).
"""

from __future__ import annotations

import os
import random
import socket
from pathlib import Path

_FALLBACK_LOW = 32768
#: Slices of the range below the ephemeral one: one per pytest process (up to 7 workers).
_SLICES = 8


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return _FALLBACK_LOW


def free_port() -> int:
    """A loopback port nothing listens on now, outside the ephemeral range (see the
    module doc), for a server that must come back on the same one."""
    top = _ephemeral_low()
    bottom = max(1024, top - 12000)
    width = (top - bottom) // _SLICES
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    index = int(worker[2:]) + 1 if worker[2:].isdigit() else 0
    low = bottom + (index % _SLICES) * width
    high = low + width
    for _ in range(200):
        port = random.randrange(low, high)
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free loopback port in {low}-{high}")

"""``/health`` and ``/metrics`` of a real ``figtank serve``: a bridge is ready only while it
has an upstream connection; the bridge's metrics are not exported in embedded mode."""

from __future__ import annotations

import time
from pathlib import Path

from tests.bridge.helpers import free_port
from tests.serving import figtank_serve
from tests.test_serve import http_get

LOOPBACK = "127.0.0.1:0"


def wait_for_health(address: tuple[str, int], status: int, timeout: float = 15
                    ) -> tuple[int, str]:
    """Poll ``/health`` until it answers ``status``; the last answer."""
    deadline = time.monotonic() + timeout
    while True:
        answer = http_get(address, "/health")
        if answer[0] == status or time.monotonic() > deadline:
            return answer
        time.sleep(0.05)


def test_bridge_is_ready_only_with_an_upstream(tmp_path: Path) -> None:
    port = free_port()
    upstream = f"127.0.0.1:{port}"
    # The bridge starts and serves while nothing answers at its upstream address.
    with figtank_serve("--upstream", upstream, "--tank-listen", LOOPBACK, "--figg-listen",
                       LOOPBACK, "--metrics-listen", LOOPBACK, "--grace", "0.2",
                       cwd=tmp_path) as bridge:
        assert bridge.metrics
        assert http_get(bridge.metrics, "/health") == (
            503, f"upstream unreachable: no connection to {upstream}\n")
        assert http_get(bridge.metrics, "/health/live") == (200, "live\n")
        status, text = http_get(bridge.metrics, "/metrics")
        assert "figtank_upstream_up 0.0" in text.splitlines()
        assert "figtank_fsync_seconds" not in text  # the upstream fsyncs, not the bridge
        # An embedded figtank appears there as the Tank upstream: ready.
        with figtank_serve("--data-dir", str(tmp_path / "up"), "--tank-listen", upstream,
                           "--figg-listen", "", "--metrics-listen", "", "--grace", "0.2"
                           ) as up:
            assert wait_for_health(bridge.metrics, 200) == (200, "ready\n")
            assert up.stop() == 0
        # It went away: not ready again.
        status, body = wait_for_health(bridge.metrics, 503)
        assert (status, body) == (503, f"upstream unreachable: no connection to {upstream}\n")
        assert bridge.stop() == 0


def test_embedded_mode_exports_no_bridge_metrics(tmp_path: Path) -> None:
    with figtank_serve("--data-dir", str(tmp_path / "data"), "--tank-listen", LOOPBACK,
                       "--figg-listen", "", "--metrics-listen", LOOPBACK) as server:
        assert server.metrics
        status, text = http_get(server.metrics, "/metrics")
        assert status == 200
        assert "figtank_upstream_up" not in text
        assert "figtank_upstream_outages" not in text
        # What the embedded store does is there; the Figg listener is off: no Figg cache.
        assert "figtank_fsync_seconds_count 0.0" in text
        assert "figtank_figg_data_cache_bytes" not in text
        assert server.stop() == 0

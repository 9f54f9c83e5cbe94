"""A Tank listener on the embedded store, as its own process, for tests that need one.

``python -m tests.tank.serve_main DATA_DIR [setting=value ...]`` prints ``port=<n>`` on
stdout once listening and serves until stdin closes.
"""

from __future__ import annotations

import sys

import trio

from gateway.config import Settings
from gateway.embedded import open_embedded_backend
from gateway.logs import configure_logging
from gateway.metrics import Metrics
from gateway.tank_listener import serve_tank


async def main(argv: list[str]) -> None:
    overrides = dict(arg.split("=", 1) for arg in argv[1:])
    settings = Settings().with_overrides(data_dir=argv[0], tank_listen="127.0.0.1:0",
                                         figg_listen="", metrics_listen="", **overrides)
    configure_logging(settings.log_level, "json")
    async with open_embedded_backend(settings) as backend, trio.open_nursery() as nursery:
        listeners = await nursery.start(serve_tank, backend, settings, Metrics())
        print(f"port={listeners[0].socket.getsockname()[1]}", flush=True)
        await trio.to_thread.run_sync(sys.stdin.read, abandon_on_cancel=True)
        nursery.cancel_scope.cancel()


if __name__ == "__main__":
    trio.run(main, sys.argv[1:])

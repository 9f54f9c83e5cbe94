"""The peers' own compiled clients in ``figtank bench upstream-kafka``: figg-bench and
tank-cli straight at the upstream figtank's Figg and Tank listeners and through the
gateway's, so that the Figg and Tank paths are driven by clients that are not themselves
the bound (the bench's own clients are Python).

Each client runs once a side, the upstream first; the gateway's CPU is read around its
run. figg-bench: ``--msgs N --msg-size S`` (its publish, subscribe and resume lines; the
CPU figure covers all three passes); tank-cli: ``create_topic`` then ``bm p2b -s 100 -c N
-B 1000``. The clients are given by path (``--figg-bench``, ``--tank-cli``): the bench
builds and downloads nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import trio

from gateway.bench.peers import P2B_SIZE, RunFailed, run_figg_bench, run_p2b

#: tank-cli's p2b messages per bundle, as ``make bench-peers``.
P2B_BUNDLE: Final = 1000


@dataclass(frozen=True, slots=True)
class PeerRun:
    """One client's figure on both sides: messages/s straight and through the gateway,
    and the gateway's CPU seconds per message of its run."""

    label: str
    messages: int
    direct: float
    gateway: float
    gateway_cpu_per_message: float


def _figg(path: str, address: str, messages: int, size: int, timeout: float
          ) -> dict[str, float]:
    found = run_figg_bench(path, address, messages, size, timeout)
    if not {"pub", "sub"} <= found.keys():
        raise RunFailed("figg-bench printed no pub/sub stats line")
    return found


def _p2b(path: str, address: str, messages: int, timeout: float) -> float:
    return run_p2b(path, address, messages, min(P2B_BUNDLE, messages), timeout)


async def peer_runs(*, figg_bench: str | None, tank_cli: str | None,
                    upstream: tuple[str, str], gateway: tuple[str, str], messages: int,
                    size: int, timeout: float, gateway_cpu: Callable[[], float]
                    ) -> list[PeerRun]:
    """Run the given clients at the upstream's and the gateway's ``(figg, tank)``
    listeners; ``gateway_cpu()`` reads the gateway's CPU seconds."""
    runs: list[PeerRun] = []
    if figg_bench:
        straight = await trio.to_thread.run_sync(_figg, figg_bench, upstream[0], messages,
                                                 size, timeout)
        before = gateway_cpu()
        through = await trio.to_thread.run_sync(_figg, figg_bench, gateway[0], messages,
                                                size, timeout)
        cpu = (gateway_cpu() - before) / messages
        for kind, what in (("pub", "publish"), ("sub", "subscribe"), ("resume", "resume")):
            if kind in straight and kind in through:
                runs.append(PeerRun(f"figg-bench {what}", messages, straight[kind],
                                    through[kind], cpu))
    if tank_cli:
        straight_rate = await trio.to_thread.run_sync(_p2b, tank_cli, upstream[1], messages,
                                                      timeout)
        before = gateway_cpu()
        through_rate = await trio.to_thread.run_sync(_p2b, tank_cli, gateway[1], messages,
                                                     timeout)
        runs.append(PeerRun(f"tank-cli bm p2b ({P2B_SIZE} B, bundles of {P2B_BUNDLE})",
                            messages, straight_rate, through_rate,
                            (gateway_cpu() - before) / messages))
    return runs

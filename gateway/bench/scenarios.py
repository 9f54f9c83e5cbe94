"""Every ``figtank bench`` scenario, by name: a plain table of the scenario modules.

The scenario modules import :mod:`gateway.bench.scenario` (what a scenario is); this
module imports them, so nothing imports back.
"""

from __future__ import annotations

from typing import Final

from gateway.bench import e2e, figg, http_fanout, idle, kafka, loopback, tank, upstream
from gateway.bench.scenario import Scenario

#: In the order ``figtank bench --help`` lists them.
SCENARIOS: Final[dict[str, Scenario]] = {
    scenario.name: scenario
    for scenario in (*tank.SCENARIOS, *figg.SCENARIOS, *kafka.SCENARIOS, e2e.SCENARIO,
                     loopback.SCENARIO, http_fanout.SCENARIO, upstream.SCENARIO, idle.SCENARIO)}


def get_scenario(name: str) -> Scenario:
    """The scenario called ``name``; KeyError when there is none."""
    return SCENARIOS[name]

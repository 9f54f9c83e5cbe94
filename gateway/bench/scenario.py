"""What a scenario is, and what the scenarios share (reports, counts, samples).

A scenario runs in three steps: ``prepare`` (in the parent: create topics, fill them,
learn where they end), ``work`` (in each worker: the timed load, see
:mod:`gateway.bench.procs`) and ``finish`` (in the parent: merge the workers' results,
check the counts, build the :class:`~gateway.bench.report.Report`). Parameters travel as a
plain dict so they pickle to workers and go into the report unchanged. The scenarios
themselves are listed in :mod:`gateway.bench.scenarios`.
"""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from gateway.bench.procs import Share, WorkerResult, generator_load, server_load
from gateway.bench.report import Report
from gateway.extras import require

Params = dict[str, Any]


async def _unchanged(params: Params) -> Params:
    return params


@dataclass(frozen=True)
class Scenario:
    """One ``figtank bench`` subcommand."""

    name: str
    help: str
    #: Adds the scenario's own options to its subparser.
    add_arguments: Callable[[argparse.ArgumentParser], None]
    #: The scenario's parameters from the parsed options (the common ones are added).
    params: Callable[[argparse.Namespace], Params]
    work: Callable[[Params, Share], Awaitable[WorkerResult]]
    finish: Callable[[Params, list[WorkerResult]], Awaitable[Report]]
    prepare: Callable[[Params], Awaitable[Params]] = _unchanged
    #: Which endpoints it needs: a subset of {"tank", "figg", "kafka"}.
    needs: frozenset[str] = frozenset()
    #: The optional library it runs on and the pip extra that installs it, if any.
    requires: tuple[str, str] | None = None

    def check_requirements(self) -> None:
        """Raise :class:`~gateway.extras.MissingExtra` when the library it needs is
        missing (before anything is prepared)."""
        if self.requires is not None:
            module, extra = self.requires
            require(module, extra=extra, purpose=self.name)


def make_report(scenario: str, params: Params, results: list[WorkerResult],
                rows: list[Any], checks: list[Any], notes: list[str] | None = None
                ) -> Report:
    """A report with the generator's (and the server's) load filled in."""
    return Report(scenario, params.get("target", ""), public_params(params), rows, checks,
                  generator_load(results), server_load(results), notes or [])


def public_params(params: Params) -> Params:
    """The parameters a report records (internal keys start with an underscore)."""
    return {key: value for key, value in params.items() if not key.startswith("_")}


def total(results: list[WorkerResult], key: str) -> int:
    """A count summed over the workers."""
    return sum(r.counts.get(key, 0) for r in results)


def samples(results: list[WorkerResult], kind: str) -> list[float]:
    """Latency samples of ``kind`` from every worker."""
    return [s for r in results for s in r.samples.get(kind, ())]


def wall(results: list[WorkerResult]) -> float:
    """Seconds from the first worker's start to the last worker's end."""
    return max(r.end for r in results) - min(r.start for r in results)

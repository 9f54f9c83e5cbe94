"""The ``figtank bench SCENARIO ...`` command (loaded by :mod:`gateway.cli.main` only when
it runs), and :func:`bench`, the same run from Python (``make bench``, the tests).

Every scenario takes the common options (endpoints, ``--target``, ``--procs``, ``--json``,
``--seed``, ...) and its own. It prints a table (or one JSON object with ``--json``) and
exits 0 when every message arrived exactly once, 1 when some were lost or duplicated or
the run could not be made (endpoint unreachable, a worker failed), 2 for bad options.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

import trio

from gateway.bench.endpoints import (
    DEFAULT_FIGG,
    DEFAULT_KAFKA,
    DEFAULT_TANK,
    new_run_id,
    use_tls,
)
from gateway.bench.procs import WorkerFailed, run_workers
from gateway.bench.report import Report
from gateway.bench.scenario import Params
from gateway.bench.scenarios import SCENARIOS, get_scenario
from gateway.client.errors import ClientError
from gateway.client.tls import client_context
from gateway.core.config import parse_address
from gateway.core.logs import configure_logging


class BenchError(Exception):
    """The run could not be made; the message says why."""


def address(text: str) -> str:
    try:
        host, port = parse_address(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return f"{host}:{port}"


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _add_common(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("common options")
    group.add_argument("--tank", type=address, default=DEFAULT_TANK,
                       help="Tank endpoint HOST:PORT")
    group.add_argument("--figg", type=address, default=DEFAULT_FIGG,
                       help="Figg endpoint HOST:PORT")
    group.add_argument("--kafka", type=address, default=DEFAULT_KAFKA,
                       help="Kafka endpoint HOST:PORT (the kafka-* scenarios)")
    group.add_argument("--target", default="figtank",
                       help="which broker this is, recorded in the report "
                            "(e.g. figtank-embedded-fsync, tank-4.0, figg)")
    group.add_argument("--procs", type=_positive, default=1,
                       help="spread the load over this many processes")
    group.add_argument("--seed", type=int, default=1, help="seed of the random payloads")
    group.add_argument("--compressible", action="store_true",
                       help="payloads of text that compresses (default: random bytes)")
    group.add_argument("--topic", default=None,
                       help="topic to use (default: a new one named after the scenario)")
    group.add_argument("--server-pid", type=int, default=None,
                       help="also report the CPU this local server process used")
    group.add_argument("--timeout", type=float, default=600.0,
                       help="seconds the workers get to finish")
    group.add_argument("--json", action="store_true", help="print one JSON object")
    group.add_argument("--tls", action="store_true",
                       help="connect over TLS (--ca, --cert imply it)")
    group.add_argument("--ca", default=None, metavar="FILE",
                       help="CA certificates (PEM) to verify the server with")
    group.add_argument("--cert", default=None, metavar="FILE",
                       help="client certificate (PEM), for a mutual-TLS listener")
    group.add_argument("--tls-key", default=None, metavar="FILE",
                       help="private key (PEM) of --cert")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the scenario subcommands to ``figtank bench``'s parser."""
    sub = parser.add_subparsers(dest="scenario", required=True, metavar="SCENARIO")
    for name, scenario in SCENARIOS.items():
        command = sub.add_parser(name, help=scenario.help, description=scenario.help,
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
        scenario.add_arguments(command)
        _add_common(command)


def params_from_args(args: argparse.Namespace) -> Params:
    """The parameters of a run: the common options, then the scenario's own."""
    scenario = get_scenario(args.scenario)
    common = {"scenario": args.scenario, "target": args.target, "tank": args.tank,
              "figg": args.figg, "kafka": args.kafka, "procs": args.procs, "seed": args.seed,
              "compressible": args.compressible, "topic": args.topic,
              "server_pid": args.server_pid, "timeout": args.timeout, "run": new_run_id(),
              "tls": _tls_params(args)}
    own = scenario.params(args)
    for key in ("messages", "size", "bundle", "in_flight", "window", "publishers"):
        if key in own and own[key] < (0 if key == "messages" else 1):
            raise BenchError(f"--{key.replace('_', '-')} must be positive")
    return {**common, **own}


def _tls_params(args: argparse.Namespace) -> dict[str, Any] | None:
    """``params["tls"]``: the client TLS files (checked now: ValueError), or None."""
    files = {"ca": args.ca, "cert": args.cert, "key": args.tls_key}
    if not (args.tls or any(files.values())):
        return None
    client_context(**files)  # a file that does not load is a usage mistake
    return files


def run_scenario(params: Params) -> Report:
    """Prepare, run the workers, and report; raises :class:`BenchError`."""
    scenario = get_scenario(params["scenario"])
    use_tls(params.get("tls"))
    try:
        params = trio.run(scenario.prepare, params)
        results = run_workers(scenario.name, scenario.work, params, params["procs"],
                              params["timeout"])
        return trio.run(scenario.finish, params, results)
    except BaseException as exc:  # groups from nurseries hold the interesting one
        reason = _leaf(exc)
        if isinstance(reason, ClientError | ConnectionError | OSError | WorkerFailed
                      | ValueError | TimeoutError):
            raise BenchError(f"{type(reason).__name__}: {reason}") from exc
        raise


def _leaf(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def bench(argv: Sequence[str]) -> Report:
    """Run ``figtank bench`` with ``argv`` (``["tank-produce", "--messages", "10"]``)."""
    parser = argparse.ArgumentParser(prog="figtank bench")
    add_arguments(parser)
    args = parser.parse_args(list(argv))
    try:
        return run_scenario(params_from_args(args))
    except ValueError as exc:
        raise BenchError(str(exc)) from None


def run(args: argparse.Namespace) -> int:
    """Run the scenario the parsed ``args`` name; print its report; the exit code."""
    configure_logging("warning")  # on stderr: stdout holds the report
    get_scenario(args.scenario).check_requirements()
    try:
        params = params_from_args(args)
    except (BenchError, ValueError) as exc:
        print(f"figtank bench: {exc}", file=sys.stderr)
        return 2
    try:
        report = run_scenario(params)
    except (BenchError, ValueError) as exc:
        print(f"figtank bench: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(report.to_dict()) if args.json else report.table(), flush=True)
    if not report.ok:
        print("figtank bench: messages were lost or duplicated (see the checks)",
              file=sys.stderr)
        return 1
    return 0


#: ``figtank bench``: (add arguments, run), as :mod:`gateway.cli.main` loads a command.
COMMAND = (add_arguments, run)

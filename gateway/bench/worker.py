"""A worker process of ``figtank bench --procs N`` (started by :mod:`gateway.bench.procs`).

Reads ``(scenario, params, index, count)`` as a pickle on stdin, runs the scenario's work
for that share, and writes pickled events to stdout: "ready" at each barrier, then
"result" or "error".
"""

from __future__ import annotations

import os
import pickle
import sys
import traceback

import trio

from gateway.bench.endpoints import use_tls
from gateway.bench.procs import PipeBarrier, Share, send_event
from gateway.bench.scenarios import get_scenario
from gateway.core.logs import configure_logging


def main() -> None:
    into = sys.stdin.buffer
    # Events go out on a copy of stdout; whatever else writes to stdout (a print, a log
    # line) lands on stderr instead of in the event stream.
    sys.stdout.flush()
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    configure_logging("warning")
    scenario, params, index, count = pickle.load(into)
    use_tls(params.get("tls"))
    share = Share(index, count, PipeBarrier(into, out), params.get("server_pid"))
    try:
        result = trio.run(get_scenario(scenario).work, params, share)
    except BaseException:
        send_event(out, ("error", traceback.format_exc()))
        return
    send_event(out, ("result", result))


if __name__ == "__main__":
    main()

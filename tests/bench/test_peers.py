"""Comparing figtank with a peer: the suite's ``--peer`` mode (medians, ratios, the table,
and a run against a second figtank) and ``gateway/bench/peers.py`` (parsing the
peers' clients, its tables, and a run with stand-in clients)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gateway.bench import peers as cp
from gateway.bench.serving import Served
from gateway.bench.suite import _for_protocols, compare, comparison_markdown, main

pytestmark = pytest.mark.slow

# ------------------------------------------------------------------ suite: medians, table


def _run(side: str, round_: int, figures: dict[str, float] | None, ok: bool = True,
         case: str = "tank-produce 100 B", mode: str = "os") -> dict[str, Any]:
    run: dict[str, Any] = {"case": case, "durability": mode, "side": side, "round": round_,
                           "argv": []}
    if figures is None:
        run["error"] = run["reason"] = "ConnectError: refused"
    else:
        run["report"] = {"ok": ok, "rows": [{"label": label, "msgs_per_s": value}
                                            for label, value in figures.items()]}
    return run


def test_compare_takes_medians_and_the_ratio() -> None:
    runs = [_run("figtank", 1, {"produce": 100}), _run("peer", 1, {"produce": 400}),
            _run("peer", 2, {"produce": 200}), _run("figtank", 2, {"produce": 300}),
            _run("figtank", 3, {"produce": 200}), _run("peer", 3, {"produce": 250})]
    [entry] = compare(runs)
    assert (entry["case"], entry["durability"], entry["what"]) == \
        ("tank-produce 100 B", "os", "produce")
    assert entry["figtank"]["msgs_per_s"] == 200 and entry["peer"]["msgs_per_s"] == 250
    assert entry["figtank"]["values"] == [100, 300, 200]
    assert entry["ratio"] == pytest.approx(0.8)
    assert entry["figtank"]["failed"] == entry["peer"]["failed"] == 0


def test_compare_leaves_failed_rounds_out() -> None:
    runs = [_run("figtank", 1, {"publish": 10, "live": 20}),
            _run("peer", 1, {"publish": 1000, "live": 5}, ok=False),
            _run("peer", 2, None),
            _run("figtank", 2, {"publish": 30, "live": 40}, ok=False),
            _run("figtank", 3, None), _run("peer", 3, {"publish": 3000, "live": 7}, ok=False)]
    publish, live = compare(runs)
    assert [publish["what"], live["what"]] == ["publish", "live"]
    # figtank: the round that passed only; the peer never passed: every figure, no ratio
    assert publish["figtank"] == {"msgs_per_s": 10, "passed": True, "values": [10, 30],
                                  "failed": 2, "runs": 3}
    assert publish["peer"]["msgs_per_s"] == 2000 and not publish["peer"]["passed"]
    assert publish["peer"]["failed"] == 3
    assert publish["ratio"] is None and live["ratio"] is None


def test_compare_with_a_side_that_never_ran() -> None:
    [entry] = compare([_run("figtank", 1, None), _run("peer", 1, None)])
    assert entry["what"] == "-"
    assert entry["figtank"]["msgs_per_s"] is None and entry["ratio"] is None


def test_e2e_runs_only_the_paths_of_the_peer() -> None:
    argv = ["e2e", "--rate", "10"]
    assert _for_protocols(argv, {"tank"}) == [*argv, "--paths", "tank-tank"]
    assert _for_protocols(argv, {"figg", "tank"})[-4:] == \
        ["figg-tank", "tank-figg", "figg-figg", "tank-tank"]
    assert _for_protocols(["figg-publish"], {"tank"}) is None
    assert _for_protocols(["tank-produce"], {"tank"}) == ["tank-produce"]


def test_comparison_markdown() -> None:
    runs = [_run("figtank", 1, {"produce": 123_456}), _run("peer", 1, {"produce": 61_728}),
            _run("figtank", 1, {"publish": 5}, case="figg-publish x1"),
            _run("peer", 1, {"publish": 9}, ok=False, case="figg-publish x1")]
    results = {"figtank_version": "0.1.0", "started_at": "2026-01-01T00:00:00+00:00",
               "machine": {"cpus": 2, "cpu": "cpu", "memory_gib": 1, "system": "Linux",
                           "python": "3.11"},
               "seconds": 12.0, "rounds": 1, "skipped": ["tank-consume 1 KB"],
               "peer": {"name": "tank-4.0", "tank": "127.0.0.1:11311", "figg": None},
               "comparison": compare(runs)}
    table = comparison_markdown(results)
    assert "| case | durability | what | figtank msgs/s | tank-4.0 msgs/s | ratio |" in table
    assert "| tank-produce 100 B | os | produce | 123,456 | 61,728 | 2.00 |" in table
    assert "| figg-publish x1 | os | publish | 5 | 9 (failed 1/1) |  |" in table
    assert "page cache" in table and "Go Figg" not in table  # the peer has no Figg
    assert "Not run (tank-4.0 lacks the protocol): tank-consume 1 KB." in table


def test_suite_peer_options_are_checked(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["--peer", "x"], ["--peer", "x", "--peer-tank", "127.0.0.1:1",
                                   "--target", "y", "--tank", "127.0.0.1:2"],
                 ["--peer-tank", "127.0.0.1:1"], ["--rounds", "2"],
                 ["--peer", "x", "--peer-figg", "127.0.0.1:1", "--rounds", "0"]):
        with pytest.raises(SystemExit):
            main(argv)
    capsys.readouterr()


def test_the_suite_beside_a_second_figtank(figtank: Served, tmp_path: Path) -> None:
    """The peer is the package's figtank; the suite starts its own figtank as usual."""
    code = main(["--peer", "figtank-peer", "--peer-tank", figtank.tank, "--peer-figg",
                 figtank.figg, "--scale", "0.002", "--modes", "os", "--rounds", "2",
                 "--out-dir", str(tmp_path)])
    assert code == 0
    results = json.loads((tmp_path / "bench-results.json").read_text())
    assert results["peer"] == {"name": "figtank-peer", "tank": figtank.tank,
                               "figg": figtank.figg}
    # The peer speaks Tank and Figg: the Kafka cases are skipped (and say so).
    assert results["rounds"] == 2
    assert results["skipped"] == ["kafka-produce 100 B", "kafka-consume 1 KB"]
    produce = [(r["side"], r["round"]) for r in results["runs"]
               if r["case"] == "tank-produce 100 B"]
    assert produce == [("figtank", 1), ("peer", 1), ("peer", 2), ("figtank", 2)]
    peer_targets = {r["report"]["target"] for r in results["runs"] if r["side"] == "peer"}
    assert peer_targets == {"figtank-peer"}
    assert all(r["report"]["ok"] for r in results["runs"])
    whats = {(e["case"], e["what"]) for e in results["comparison"]}
    assert ("e2e 1000/s", "tank->figg") in whats and ("figg-subscribe", "publish") in whats
    for entry in results["comparison"]:
        assert len(entry["figtank"]["values"]) == len(entry["peer"]["values"]) == 2
        assert entry["ratio"] is not None and entry["ratio"] > 0
    table = (tmp_path / "bench-results.md").read_text()
    assert "| figtank msgs/s | figtank-peer msgs/s | ratio |" in table
    assert "| tank-produce 100 B | os | produce |" in table


# ------------------------------------------------------------------ gateway.bench.peers

FIGG_BENCH_OUTPUT = """\
starting benchmark [run=1] [msgs=20,000 msg-size=128B topic=bench-16886 addr=127.0.0.1:1]
  sub stats: 350,508 msgs/sec ~ 42.79 MB/sec
  pub stats: 351,513 msgs/sec ~ 42.91 MB/sec
  resume stats: 1,561,777 msgs/sec ~ 190.65 MB/sec
"""


def test_parse_figg_bench() -> None:
    assert cp.parse_figg_bench(FIGG_BENCH_OUTPUT) == {"sub": 350_508, "pub": 351_513,
                                                     "resume": 1_561_777}
    assert cp.parse_figg_bench("  pub stats: 421,119 msgs/sec ~ 51.41 MB/sec\n") == \
        {"pub": 421_119}
    assert cp.parse_figg_bench("failed to parse config\n") == {}


@pytest.mark.parametrize(("text", "seconds"), [
    ("850us", 850e-6), ("12ms", 0.012), ("0.156s", 0.156), ("0.007s", 0.007), ("1s", 1.0),
    ("59.5s", 59.5), ("2m", 120.0), ("2m3s", 123.0), ("1h", 3600.0), ("1h3m", 3780.0),
])
def test_parse_duration(text: str, seconds: float) -> None:
    assert cp.parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "fast", "1.5", "3x", "s"])
def test_parse_duration_refuses(text: str) -> None:
    with pytest.raises(ValueError):
        cp.parse_duration(text)


def test_parse_p2b() -> None:
    output = ("Will publish 500,000 messages, in batches of 1,000 messages (500 batch(es)), "
              "each message content is 100b\n"
              "Got ACK after publishing 500,000 message(s) of size 100b (47.68mb), "
              "took 0.156s\n")
    assert cp.parse_p2b(output) == (500_000, pytest.approx(0.156))
    assert cp.parse_p2b("Got ACK after publishing 20,000 message(s) of size 128b "
                        "(2.44mb), took 850us") == (20_000, pytest.approx(850e-6))
    with pytest.raises(ValueError):
        cp.parse_p2b("Failed to publish\n")


def test_parse_consume_counts_the_per_response_lines() -> None:
    output = ("\x1b[1m>> 60,000 messages\x1b[0m\n>> 60,000 messages\n"
              "240,000 messages consumed in 0.069s, 12.89mb consumed\n")
    assert cp.parse_consume(output) == (120_000, pytest.approx(0.069))
    assert cp.parse_consume(">> 5 messages\n") == (5, None)


def test_strip_ansi() -> None:
    assert cp.strip_ansi("Created topic \x1b[1mbench\x1b[0m") == "Created topic bench"


def test_measures_ratio_and_table() -> None:
    rate = cp.Measure("figg", "pub stats", "msgs/s",
                      {"peer": [300.0, 100.0, 200.0], "figtank": [150.0, 100.0, 50.0]},
                      {"peer": [], "figtank": ["round 2: timed out"]})
    time_ = cp.Measure("tank", "consume", "s", {"peer": [0.2], "figtank": [0.1]})
    assert rate.median("peer") == 200 and rate.median("figtank") == 100
    assert rate.ratio() == pytest.approx(0.5)
    assert time_.ratio() == pytest.approx(2.0)  # half the time: twice as fast
    assert cp.ratio(None, 1.0, "s") is None and cp.ratio(1.0, 0.0, "msgs/s") is None
    never = cp.Measure("tank", "p2b", "msgs/s", {"peer": [5.0], "figtank": []},
                       {"peer": [], "figtank": ["round 1: refused"]})
    table = cp.markdown_table([rate, time_, never], "tank-4.0").splitlines()
    assert table[0] == "| measure (same client, same run) | tank-4.0 | figtank | ratio |"
    assert table[2] == ("| pub stats | 200 msgs/s | 100 msgs/s (failed 1/4) | 0.50 |")
    assert table[3] == "| consume | 0.200 s | 0.100 s | 2.00 |"
    assert table[4] == "| p2b | 5 msgs/s | failed 1/1 |  |"
    data = rate.to_dict()
    assert data["peer"]["median"] == 200 and data["ratio"] == pytest.approx(0.5)
    assert data["figtank"]["failures"] == ["round 2: timed out"]


def test_cpu_bound_is_the_shared_cores_or_the_busiest_process() -> None:
    # Straight: the figtank's one core is the bound (3 µs/msg), not the two cores.
    assert cp.cpu_bound({"client": 1.0, "upstream": 3.0}, 2) == pytest.approx(1e6 / 3)
    # Through a gateway: 10 µs/msg shared by the two cores.
    assert cp.cpu_bound({"client": 1.0, "upstream": 4.0, "gateway": 5.0}, 2) == \
        pytest.approx(2e6 / 10)
    assert cp.cpu_bound({"client": 0.0}, 2) is None
    pub = cp.Measure("figg", "pub stats", "msgs/s",
                     {"peer": [300_000.0], "figtank": [150_000.0]})
    pub.cpu["peer"].append({"client": 1.0, "upstream": 3.0, "gateway": 0.0})
    pub.cpu["figtank"] += [{"client": 1.0, "upstream": 4.0, "gateway": 5.0},
                           {"client": 1.0, "upstream": 4.0, "gateway": 7.0},
                           {"client": 1.0, "upstream": 4.0, "gateway": 6.0}]
    untimed = cp.Measure("tank", "consume", "s", {"peer": [0.2], "figtank": [0.1]})
    table = cp.cpu_table([pub, untimed], {"peer": "straight", "figtank": "through"},
                         2).splitlines()
    assert table[0] == ("| measure | side | client µs/msg | upstream µs/msg | gateway µs/msg "
                        "| all µs/msg | CPU allows (2 cores) | measured | measured / allowed |")
    assert table[2] == ("| pub stats | straight | 1.00 | 3.00 | 0.00 | 4.00 "
                        "| 333,333 msgs/s | 300,000 msgs/s | 0.90 |")
    # (the gateway's 6 µs on one core allow less than 11 µs shared by two)
    assert table[3] == ("| pub stats | through | 1.00 | 4.00 | 6.00 | 11.00 "
                        "| 166,667 msgs/s | 150,000 msgs/s | 0.90 |")
    assert len(table) == 4  # a measure without CPU figures has no row
    assert pub.to_dict()["figtank"]["cpu_us_per_msg"][1]["gateway"] == 7.0


def test_cpu_meter_reads_the_servers_and_the_client(tmp_path: Path) -> None:
    spin = "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass\n"
    server = subprocess.Popen([sys.executable, "-c", spin + "time.sleep(30)"])
    try:
        time.sleep(0.05)
        meter = cp.CpuMeter({"server": server.pid})
        meter.start()
        subprocess.run([sys.executable, "-c", spin], check=True)  # the client
        time.sleep(0.4)  # the server's spin ends meanwhile
        got = meter.per_message(1000)
    finally:
        server.kill()
        server.wait()
    # 0.3 s of CPU each over 1,000 messages: 300 µs/msg (less what ran before start()).
    assert got["client"] >= 250 and 100 <= got["server"] <= 400


def test_sides_alternate() -> None:
    assert [cp.sides_in_order(r) for r in (1, 2, 3)] == \
        [("peer", "figtank"), ("figtank", "peer"), ("peer", "figtank")]


def test_only_loopback_endpoints() -> None:
    parser = cp.parser()
    assert parser.parse_args(["--peer-tank", "127.0.0.1:11311"]).peer_tank == \
        "127.0.0.1:11311"
    with pytest.raises(SystemExit):
        parser.parse_args(["--peer-tank", "192.0.2.1:11311"])


def test_run_client_is_time_bound() -> None:
    with pytest.raises(cp.RunFailed, match="timed out"):
        cp.run_client([sys.executable, "-c", "import time; time.sleep(30)"], 0.5)
    with pytest.raises(cp.RunFailed, match="exited with 3: bad"):
        cp.run_client([sys.executable, "-c", "print('bad'); raise SystemExit(3)"], 10)


def _stand_in(path: Path, body: str) -> str:
    """An executable Python script standing in for a peer's client."""
    path.write_text(f"#!{sys.executable}\nimport sys\nargs = sys.argv[1:]\n{body}")
    path.chmod(0o755)
    return str(path)


def test_compare_peers_with_stand_in_clients(figtank: Served, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """Both sides are the package's figtank under two names; the stand-in figg-bench
    prints no resume line for the "peer", the stand-in tank-cli prints canned figures
    (the 1 KiB produce between them is a real ``figtank bench`` run)."""
    port = figtank.tank.rsplit(":", 1)[1]
    figg_bench = _stand_in(tmp_path / "figg-bench", f"""
addr = args[args.index("--addr") + 1]
print({FIGG_BENCH_OUTPUT!r}.replace("resume", "x" if addr.startswith("localhost") else "resume"))
""")
    tank_cli = _stand_in(tmp_path / "tank-cli", """
if "create_topic" in args:
    print("Created topic \\x1b[1mt\\x1b[0m")
elif "bm" in args:
    count = int(args[args.index("-c") + 1])
    print(f"Got ACK after publishing {count:,} message(s) of size 100b (1mb), took 2ms")
elif "consume" in args:
    print(">> 60 messages\\n>> 40 messages\\n200 messages consumed in 850us, 0.1mb consumed")
else:
    raise SystemExit(1)
""")
    code = cp.main(["--figg-bench", figg_bench, "--tank-cli", tank_cli,
                    "--peer-figg", f"localhost:{figtank.figg.rsplit(':', 1)[1]}",
                    "--figtank-figg", figtank.figg, "--peer-tank", f"localhost:{port}",
                    "--figtank-tank", figtank.tank, "--rounds", "2", "--scale", "0.0001",
                    "--json", "--timeout", "60"])
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    measures = {m["label"]: m for m in data["measures"]}
    assert len(measures) == 10
    pub = measures["figg-bench 20 x 128 B, 1 pub, 1 sub: pub stats"]
    assert pub["peer"]["values"] == pub["figtank"]["values"] == [351_513, 351_513]
    assert pub["ratio"] == 1.0
    resume = measures["figg-bench 20 x 128 B, 4 pubs, 4 subs: resume stats"]
    assert resume["peer"]["values"] == [] and len(resume["peer"]["failures"]) == 2
    assert resume["ratio"] is None
    p2b = measures["tank-cli bm p2b: 50 x 100 B in bundles of 50, one request"]
    assert p2b["peer"]["median"] == pytest.approx(25_000)  # 50 messages in 2 ms
    produce = next(m for label, m in measures.items() if label.startswith("produce 100 x"))
    assert len(produce["figtank"]["values"]) == 2 and produce["figtank"]["median"] > 0
    own = measures["tank-cli consume of that topic, its \"consumed in\""]
    assert own["figtank"]["values"] == [pytest.approx(850e-6)] * 2
    wall = measures["tank-cli consume of that topic, wall clock around the process"]
    assert wall["peer"]["failures"] == [] and len(wall["peer"]["values"]) == 2


def test_start_figtank_takes_one_durability_or_both() -> None:
    parser = cp.parser()
    assert parser.parse_args(["--start-figtank", "fsync,os"]).start_figtank == ["fsync", "os"]
    assert parser.parse_args(["--start-figtank", "os"]).start_figtank == ["os"]
    for bad in ("", "fsync,fsync", "sync", "os,none"):
        with pytest.raises(SystemExit):
            parser.parse_args(["--start-figtank", bad])
    assert cp.tank_mode(["fsync", "os"]) == "os"
    assert cp.tank_mode(["fsync"]) == "fsync"


def test_both_durabilities_in_one_run(figtank: Served, tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    """``--start-figtank fsync,os`` (what ``make bench-peers`` runs): the Figg measures
    against a figtank started in each mode, labelled with it, the Tank ones against the
    ``os`` one only; the "peer" is the package's figtank, the clients stand-ins."""
    figg_bench = _stand_in(tmp_path / "figg-bench", f"print({FIGG_BENCH_OUTPUT!r})")
    tank_cli = _stand_in(tmp_path / "tank-cli", f"""
with open({str(tmp_path / "calls")!r}, "a") as calls:
    calls.write(args[1] + "\\n")
if "bm" in args:
    print("Got ACK after publishing 50 message(s) of size 100b (1mb), took 2ms")
elif "consume" in args:
    print(">> 100 messages\\n100 messages consumed in 850us, 0.1mb consumed")
""")
    code = cp.main(["--figg-bench", figg_bench, "--tank-cli", tank_cli,
                    "--peer-figg", figtank.figg, "--peer-tank", figtank.tank,
                    "--start-figtank", "fsync,os", "--rounds", "1", "--scale", "0.0001",
                    "--json", "--timeout", "60"])
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert data["figtank_durability"] == "fsync,os"
    labels = [m["label"] for m in data["measures"]]
    for mode in ("fsync", "os"):
        assert sum(label.endswith(f", figtank `{mode}`") for label in labels
                   if label.startswith("figg-bench")) == 6
    tank = [label for label in labels if not label.startswith("figg-bench")]
    assert len(tank) == 4 and all(label.endswith(", figtank `os`") for label in tank)
    # tank-cli ran against the peer and one figtank (not two): its endpoints.
    endpoints = set((tmp_path / "calls").read_text().split())
    assert figtank.tank in endpoints and len(endpoints) == 2


def test_a_gateway_against_the_figtank_behind_it(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """``--gateway`` (``make bench-gateway``): the peer columns are a started figtank, the
    figtank columns a gateway in front of its Kafka listener; the stand-in clients note
    where they were pointed."""
    log = tmp_path / "addresses"
    figg_bench = _stand_in(tmp_path / "figg-bench", f"""
open({str(log)!r}, "a").write("figg " + args[args.index("--addr") + 1] + "\\n")
print({FIGG_BENCH_OUTPUT!r})
""")
    tank_cli = _stand_in(tmp_path / "tank-cli", f"""
open({str(log)!r}, "a").write("tank " + args[args.index("-b") + 1] + "\\n")
if "bm" in args:
    count = int(args[args.index("-c") + 1])
    print(f"Got ACK after publishing {{count:,}} message(s) of size 100b (1mb), took 2ms")
elif "consume" in args:
    print(">> 60 messages\\n>> 40 messages\\n200 messages consumed in 850us, 0.1mb consumed")
""")
    code = cp.main(["--start-figtank", "os", "--gateway", "--figg-bench", figg_bench,
                    "--tank-cli", tank_cli, "--rounds", "1", "--scale", "0.0001",
                    "--timeout", "60"])
    assert code == 0
    out = capsys.readouterr().out
    assert "a gateway (figtank serve --upstream-kafka) in front of a figtank (os)" in out
    assert "figg-bench 20 x 128 B, 1 pub, 1 sub: pub stats | 351,513 msgs/s | 351,513" in out
    cpu_rows = [line for line in out.splitlines() if line.startswith("| ") and " µs/msg" not in
                line and line.count("|") == 10]
    sides = {(row.split(" | ")[0][2:].split(":")[0], row.split(" | ")[1]) for row in cpu_rows}
    assert sides == {(label, side) for label in ("figg-bench 20 x 128 B, 1 pub, 1 sub",
                                                 "tank-cli bm p2b")
                     for side in ("straight", "through the gateway")}
    lines = log.read_text().split("\n")
    figg = {line.split()[1] for line in lines if line.startswith("figg")}
    tank = {line.split()[1] for line in lines if line.startswith("tank")}
    assert len(figg) == len(tank) == 2  # the figtank's listeners and the gateway's


def test_gateway_needs_one_started_figtank() -> None:
    with pytest.raises(SystemExit):
        cp.main(["--gateway", "--figg-bench", "x"])
    with pytest.raises(SystemExit):
        cp.main(["--gateway", "--start-figtank", "fsync,os", "--figg-bench", "x"])

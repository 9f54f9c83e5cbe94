"""``python -m gateway.bench.quota`` runs its four clients and none of them gets more than
its quota allows (a bound from the token arithmetic, not a timing); how close to the rate
they get is what the script reports."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.bench.quota import MIB, main, run_bench

RATE = 4 * MIB
SECONDS = 0.4
SIZE = 16 * 1024


async def test_each_client_is_held_to_its_quota(tmp_path: Path) -> None:
    results = await run_bench(RATE, SECONDS, SIZE, 64, tmp_path / "data", pause=0.3)
    assert [(r.client, r.direction) for r in results] == [
        ("figg publisher", "in"), ("tank producer", "in"), ("tank consumer", "out"),
        ("figg subscriber", "out")]
    for result in results:
        assert result.bytes > 0, result
        # The burst (a second's worth), the rate, and one read or fetch taken on credit.
        assert result.bytes <= RATE + RATE * result.seconds + 512 * 1024, result


def test_bad_arguments_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--rate", "0"])
    assert exited.value.code == 2
    assert "must be positive" in capsys.readouterr().err

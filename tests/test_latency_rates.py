"""``bench.latency_rates``: each subscriber's latency read from the nodes' traces."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.latency_rates import hop_latency, main


def _trace(path: Path, lines: list[str]) -> None:
    path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")


def test_each_subscriber_is_timed_from_the_publish_fastest_first(tmp_path: Path) -> None:
    _trace(tmp_path / "n0.trace", ["10.000 publish 7 1", "10.010 publish 7 2", "1.0 subscribe - -"])
    # node 1 is two hops away, node 2 one; node 2 also delivers a seq never published
    _trace(tmp_path / "n1.trace", ["10.004 deliver 7 1", "10.014 deliver 7 2"])
    _trace(tmp_path / "n2.trace", ["10.001 deliver 7 1", "10.012 deliver 7 2", "11 deliver 7 9"])
    hops = hop_latency(tmp_path, 3)
    assert [h["n"] for h in hops] == [2, 2]
    assert hops[0]["p50"] == pytest.approx(1.0)
    assert hops[0]["p99"] == pytest.approx(2.0)
    assert hops[1]["p50"] == pytest.approx(4.0)


def test_bad_rates_are_refused_with_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--rates", "100,fast"]) == 2
    assert main(["--rates", "0"]) == 2
    assert "--rates" in capsys.readouterr().err
    assert main(["--seconds", "1"]) == 2  # all of it warm-up: nothing would be measured
    assert "warm-up" in capsys.readouterr().err


def test_unknown_systems_are_refused_with_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--systems", "ours,florr"]) == 2
    assert "florr" in capsys.readouterr().err

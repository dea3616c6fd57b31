"""``bench._floor_worker``: the fan-out over trio and TCP alone, on our tree.

Real processes on 127.0.0.1, driven by ``bench.runtime`` as every system is.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from bench.latency_rates import depth
from bench.runtime import NODES, Bench, Settings, source_tree
from vcube import Hypercube


def test_the_tree_is_our_nodes_tree_from_node_0(tmp_path: Path) -> None:
    from p2p.fleet import node_info

    bench = Bench(Settings(), tmp_path, verbose=False)
    tree = bench.tree
    ids = [node_info(d).node_id for d in bench.node_dirs]
    below = [c for kids in tree.values() for c in kids]
    assert sorted(below) == list(range(1, NODES))  # every node but the root, once
    cube = Hypercube(ids)
    for i, kids in tree.items():
        assert [ids[c] for c in kids] == list(cube.children(ids[i], ids[0]))
    assert 1 <= depth(tree) <= NODES - 1
    assert source_tree(bench.node_dirs) == tree


def test_depth_counts_hops_to_the_farthest_node() -> None:
    assert depth({0: ()}) == 0
    assert depth({0: (1, 2), 1: (), 2: (3,), 3: ()}) == 2
    assert depth({0: (1,), 1: (2,), 2: (3,), 3: ()}) == 3


@pytest.mark.slow
@pytest.mark.parametrize("system", ["floor", "stream"])
def test_the_floor_delivers_everything_in_order(system: str, tmp_path: Path) -> None:
    settings = replace(
        Settings(), latency_rate=400.0, latency_s=3.0, warmup_s=1.0, drain_s=1.0, settle_s=0.2
    )
    _, summary = Bench(settings, tmp_path, verbose=False).latency(system, idle=False)
    assert summary["published"] >= 1000  # 400 msg/s for 3 s
    assert summary["undelivered"] == 0
    assert summary["order_violations"] == 0
    assert len(summary["per_subscriber_ms"]) == NODES - 1
    assert summary["latency_ms"]["samples"] >= (NODES - 1) * 700  # the 2 s after warm-up

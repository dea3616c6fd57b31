"""Start-up of two checkouts, paired in one run: import time and spawn to first delivery.

Run from this checkout's root (needs the ``bench`` extra)::

    mkdir /tmp/base && git archive BASE_COMMIT | tar -x -C /tmp/base
    python -m bench.startup_pair --base /tmp/base --base-commit BASE_COMMIT \\
        --pairs 6 --out bench/results/startup_pair.json

``--base`` is another checkout of the library (the baseline: a ``git
archive`` of a commit stays put while others commit, a worktree need not).
Each *pair* measures both checkouts one right after the other, the order
alternating from pair to pair (base first, then this one first, ...), so a
load that drifts during the run weighs on both sides alike.  Per checkout and
pair:

``import``  the fastest of ``--import-repeat`` wall times of ``python -c CODE``
            for every code of :data:`IMPORT_CODES`, minus ``python -c pass``
            (bytecode compiled once per checkout before anything is
            measured, as ``bench.runtime --bytecode cached`` does).
``cold``    that checkout's own ``python -m bench.runtime --only cold
            --systems ours`` (5 nodes spawned at once, mDNS, then static
            seeds): spawn to each subscriber's first delivery, and the steps.

Both checkouts run with this interpreter (the same environment and
dependencies); ``PYTHONPATH`` and the working directory select the code.  The
JSON has every pair's numbers, the medians over the pairs, the ratios this /
base of each pair, and the issue-22 targets checked on this checkout's medians.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench._common import ROOT

IMPORT_CODES = {
    "python": "pass",
    "trio": "import trio",
    "open_node": "from p2p import open_node",
    "open_node_zeroconf": "from p2p import open_node; import zeroconf",
    "blocking": "from p2p import BlockingNode",
    "p2p": "import p2p",
}
"""What ``import`` times.  ``from p2p import open_node`` is what a trio
application writes (before issue 22 it loaded the whole of ``p2p.runtime``,
which ``bench.runtime`` timed as ``import p2p.runtime``); ``trio`` is the floor
every trio application pays."""

TARGETS = {"first_delivery_mdns_s": 1.5, "first_delivery_seeds_s": 1.0, "import_s": 0.1}
"""Issue 22's start-up goals."""


def _env(root: Path, cache: Path) -> dict[str, str]:
    env = dict(os.environ, PYTHONPATH=str(root), PYTHONPYCACHEPREFIX=str(cache))
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def _run_code(root: Path, env: dict[str, str], code: str) -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], cwd=root, env=env, check=True)
    return time.perf_counter() - t0


def import_times(root: Path, cache: Path, repeat: int) -> dict[str, Any]:
    """Fastest of ``repeat`` wall times per code (interleaved), and net of ``pass``."""
    env = _env(root, cache)
    best: dict[str, float] = {}
    for _ in range(repeat):
        for key, code in IMPORT_CODES.items():
            best[key] = min(best.get(key, float("inf")), _run_code(root, env, code))
    return {
        "wall_s": best,
        "net_s": {k: v - best["python"] for k, v in best.items() if k != "python"},
    }


def cold(root: Path, out: Path) -> dict[str, Any]:
    """That checkout's ``bench.runtime --only cold --systems ours``: its cold results."""
    cmd = [sys.executable, "-m", "bench.runtime", "--only", "cold", "--systems", "ours"]
    env = dict(os.environ, PYTHONPATH=str(root))
    subprocess.run([*cmd, "--out", str(out)], cwd=root, env=env, check=True,
                   stdout=subprocess.DEVNULL)  # fmt: skip
    ours = json.loads(out.read_text())["results"]["ours"]
    return {"mdns": ours["cold"], "seeds": ours.get("cold_seeds"), "loadavg": ours["loadavg"]}


def describe(root: Path, label: str = "") -> dict[str, Any]:
    """Commit (``label`` for a tree outside git, e.g. a ``git archive``), uncommitted
    files and where ``p2p`` loads from, for one checkout."""

    def git(*args: str) -> str:
        res = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True)
        return res.stdout.strip() if res.returncode == 0 else ""

    probe = "import p2p; print(p2p.__file__)"
    env = dict(os.environ, PYTHONPATH=str(root), PYTHONDONTWRITEBYTECODE="1")
    loads = subprocess.run([sys.executable, "-c", probe], cwd=root, env=env,
                           capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    return {
        "root": str(root),
        "commit": git("rev-parse", "HEAD") or label,
        "uncommitted": git("status", "--porcelain", "--untracked-files=no").splitlines(),
        "p2p_loads_from": loads,
    }


def summarise(pairs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over the pairs per side, and the median of the per-pair ratios."""

    def pick(side: str, path: tuple[str, ...]) -> list[float]:
        values = []
        for p in pairs:
            x: Any = p[side]
            for key in path:
                x = x[key]
            values.append(float(x))
        return values

    rows: dict[str, tuple[str, ...]] = {
        f"import_{k}_s": ("import", "net_s", k) for k in IMPORT_CODES if k != "python"
    }
    rows |= {
        "first_delivery_mdns_s": ("cold", "mdns", "first_delivery_s", "median"),
        "first_delivery_mdns_max_s": ("cold", "mdns", "first_delivery_s", "max"),
        "imported_mdns_s": ("cold", "mdns", "imported_s", "median"),
        "peers_found_mdns_s": ("cold", "mdns", "up_s", "median"),
        "first_delivery_seeds_s": ("cold", "seeds", "first_delivery_s", "median"),
        "peers_found_seeds_s": ("cold", "seeds", "up_s", "median"),
    }
    out: dict[str, Any] = {}
    for name, path in rows.items():
        base, head = pick("base", path), pick("head", path)
        out[name] = {
            "base": statistics.median(base),
            "head": statistics.median(head),
            "ratio_head_over_base": statistics.median(
                h / b for h, b in zip(head, base, strict=True) if b
            ),
            "base_each": base,
            "head_each": head,
        }
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Measure, print one line per quantity, write the JSON."""
    p = argparse.ArgumentParser(prog="python -m bench.startup_pair", description=__doc__)
    p.add_argument("--base", type=Path, required=True, help="the baseline checkout's root")
    p.add_argument(
        "--base-commit", default="", help="the base's commit, if it is not a git checkout"
    )
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--import-repeat", type=int, default=7)
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "startup_pair.json")
    args = p.parse_args(argv)
    trees = {"base": args.base.resolve(), "head": ROOT}
    info = {"base": describe(trees["base"], args.base_commit), "head": describe(ROOT)}
    pairs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as tmp:
        caches = {side: Path(tmp) / f"pyc-{side}" for side in trees}
        for side, root in trees.items():  # bytecode once, before anything is measured
            _run_code(root, _env(root, caches[side]), "from p2p import BlockingNode, open_node")
        for i in range(args.pairs):
            order = ("base", "head") if i % 2 == 0 else ("head", "base")
            pair: dict[str, Any] = {"order": order, "loadavg": os.getloadavg()[0]}
            for side in order:
                print(f"pair {i + 1}/{args.pairs}: {side} ...", file=sys.stderr, flush=True)
                root = trees[side]
                pair[side] = {
                    "import": import_times(root, caches[side], args.import_repeat),
                    "cold": cold(root, Path(tmp) / f"cold-{side}-{i}.json"),
                }
            pairs.append(pair)
    summary = summarise(pairs)
    for name, row in summary.items():
        print(
            f"{name:<28} base {row['base']:7.3f}  head {row['head']:7.3f}  "
            f"head/base {row['ratio_head_over_base']:.2f}"
        )
    targets = {
        "first_delivery_mdns_s": summary["first_delivery_mdns_s"]["head"],
        "first_delivery_seeds_s": summary["first_delivery_seeds_s"]["head"],
        "import_s": summary["import_open_node_s"]["head"],
    }
    met = {k: {"goal": TARGETS[k], "value": v, "met": v <= TARGETS[k]} for k, v in targets.items()}
    for k, row in met.items():
        verdict = "met" if row["met"] else "NOT met"
        print(f"target {k}: {row['value']:.3f} <= {row['goal']}: {verdict}")
    doc = {
        "command": " ".join(["python -m bench.startup_pair", *(argv or sys.argv[1:])]),
        "python": sys.version,
        "nproc": os.cpu_count(),
        "checkouts": info,
        "import_codes": IMPORT_CODES,
        "pairs": pairs,
        "summary": summary,
        "targets": met,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

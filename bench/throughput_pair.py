"""Fan-out throughput and CPU per message of two checkouts, paired in one run.

Run from this checkout's root (needs the ``bench`` extra)::

    mkdir /tmp/base && git archive BASE_COMMIT | tar -x -C /tmp/base
    python -m bench.throughput_pair --base /tmp/base --base-commit BASE_COMMIT \\
        --pairs 5 --out bench/results/throughput_pair.json

Each *pair* runs ``python -m bench.runtime --quick --only throughput
--systems ours`` in both checkouts one right after the other, the order
alternating from pair to pair, so a load that drifts during the run weighs
on both sides alike (``bench.startup_pair`` does the same for start-up).
Per run: the slowest subscriber's delivery rate of the 1 -> 4 fan-out, the
publisher's and the subscribers' CPU per message, and the lost and
out-of-order counts (which must be 0).  The JSON has every pair, the
medians per side and the median of the per-pair ratios head / base.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench._common import ROOT
from bench.startup_pair import describe


def throughput(root: Path, out: Path) -> dict[str, float]:
    """That checkout's quick fan-out run: the figures this benchmark pairs."""
    cmd = [sys.executable, "-m", "bench.runtime", "--quick", "--only", "throughput"]
    env = dict(os.environ, PYTHONPATH=str(root))
    subprocess.run([*cmd, "--systems", "ours", "--out", str(out)], cwd=root, env=env,
                   check=True, stdout=subprocess.DEVNULL)  # fmt: skip
    t = json.loads(out.read_text())["results"]["ours"]["throughput"]
    return {
        "fanout_msg_s": t["delivered_rate_min"],
        "pub_cpu_us": t["cpu_us_per_msg"]["publisher"],
        "sub_cpu_us": t["cpu_us_per_msg"]["subscriber"],
        "undelivered": t["undelivered"],
        "order_violations": t["order_violations"],
    }


def summarise(pairs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians per side and the median per-pair ratio, per figure."""
    out: dict[str, Any] = {}
    for name in pairs[0]["base"]:
        base = [float(p["base"][name]) for p in pairs]
        head = [float(p["head"][name]) for p in pairs]
        ratios = [h / b for h, b in zip(head, base, strict=True) if b]
        out[name] = {
            "base": statistics.median(base),
            "head": statistics.median(head),
            "ratio_head_over_base": statistics.median(ratios) if ratios else None,
            "base_each": base,
            "head_each": head,
        }
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Measure, print one line per figure, write the JSON; exit 1 if a run lost
    a message or broke FIFO order."""
    p = argparse.ArgumentParser(prog="python -m bench.throughput_pair", description=__doc__)
    p.add_argument("--base", type=Path, required=True, help="the baseline checkout's root")
    p.add_argument(
        "--base-commit", default="", help="the base's commit, if it is not a git checkout"
    )
    p.add_argument("--pairs", type=int, default=5)
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "throughput_pair.json")
    args = p.parse_args(argv)
    trees = {"base": args.base.resolve(), "head": ROOT}
    info = {"base": describe(trees["base"], args.base_commit), "head": describe(ROOT)}
    pairs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="bench-throughput-") as tmp:
        for i in range(args.pairs):
            order = ("base", "head") if i % 2 == 0 else ("head", "base")
            pair: dict[str, Any] = {"order": order, "loadavg": os.getloadavg()[0]}
            for side in order:
                print(f"pair {i + 1}/{args.pairs}: {side} ...", file=sys.stderr, flush=True)
                pair[side] = throughput(trees[side], Path(tmp) / f"{side}-{i}.json")
            pairs.append(pair)
    summary = summarise(pairs)
    for name, row in summary.items():
        ratio = row["ratio_head_over_base"]
        shown = "-" if ratio is None else f"{ratio:.2f}"
        print(f"{name:<18} base {row['base']:10.2f}  head {row['head']:10.2f}  head/base {shown}")
    doc = {"benchmark": "throughput_pair", "checkouts": info, "pairs": pairs, "summary": summary}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {args.out}")
    broken = any(p[s]["undelivered"] or p[s]["order_violations"] for p in pairs for s in trees)
    return 1 if broken else 0


if __name__ == "__main__":
    raise SystemExit(main())

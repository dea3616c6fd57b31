"""Pieces shared by the reproduction scripts: the task runner, machine info, formatting."""

from __future__ import annotations

import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any, Protocol, TypeVar

from p2p._build import build_kind

ROOT = Path(__file__).resolve().parents[1]


class Runnable(Protocol):
    """A unit of work: its expected cost (to run the longest first) and a label."""

    def cost(self) -> float: ...
    def label(self) -> str: ...


T = TypeVar("T", bound=Runnable)


def execute(tasks: list[T], jobs: int, run: Callable[[T], dict[str, Any]]) -> list[dict[str, Any]]:
    """Run ``tasks`` on ``jobs`` processes, longest first; progress on stderr.

    ``run`` must be a module-level function (it is pickled for the pool); each
    result needs a ``wall_s`` entry.
    """
    ordered = sorted(tasks, key=lambda t: -t.cost())
    started = time.perf_counter()
    results: list[dict[str, Any]] = []

    def report(res: dict[str, Any], task: T) -> None:
        results.append(res)
        print(
            f"[{time.perf_counter() - started:7.1f} s] {len(results):4d}/{len(tasks)} "
            f"{task.label()}: {res['wall_s']:.1f} s",
            file=sys.stderr,
            flush=True,
        )

    print(f"{len(tasks)} runs on {jobs} process(es)", file=sys.stderr, flush=True)
    if jobs <= 1:
        for task in ordered:
            report(run(task), task)
        return results
    with ProcessPoolExecutor(max_workers=jobs) as pool:
        futures: dict[Future[dict[str, Any]], T] = {pool.submit(run, t): t for t in ordered}
        for fut in as_completed(futures):
            report(fut.result(), futures[fut])
    return results


def sizes_ok(seeds: int, min_nodes: int, max_nodes: int) -> bool:
    """Whether a sweep's sizes make sense; if not, say so on stderr."""
    if seeds < 1 or min_nodes < 2 or max_nodes < min_nodes:
        print("need --seeds >= 1 and 2 <= --min-nodes <= --max-nodes", file=sys.stderr)
        return False
    return True


def run_measured(
    tasks: list[T], jobs: int, run: Callable[[T], dict[str, Any]]
) -> tuple[dict[str, Any], list[dict[str, Any]], float]:
    """The machine (described before running: the code the runs import is this one),
    the results of :func:`execute` and its wall time in seconds."""
    host = machine()
    started = time.perf_counter()
    results = execute(tasks, jobs, run)
    return host, results, time.perf_counter() - started


def machine() -> dict[str, Any]:
    """Python, CPU count, git HEAD and the uncommitted files of the cores."""

    def git(*cmd: str) -> str:
        try:
            return subprocess.run(
                ["git", *cmd], cwd=ROOT, capture_output=True, text=True, check=False
            ).stdout
        except OSError:
            return ""

    dirty = git("status", "--short", "--", "p2p", "topics", "causal", "vcube").split("\n")
    return {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "git_head": git("rev-parse", "--short", "HEAD").strip() or None,
        "uncommitted_core_files": [line.strip() for line in dirty if line.strip()],
        "build": build_kind(),
    }


def powers(lo: int, hi: int) -> list[int]:
    """``lo, 2 lo, 4 lo, ...`` up to ``hi``."""
    out, n = [], lo
    while n <= hi:
        out.append(n)
        n *= 2
    return out


def mean(values: Sequence[float]) -> float:
    return statistics.fmean(values) if values else 0.0


def fmt(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{x:.{digits}f}"

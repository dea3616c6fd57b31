"""The README's shell snippets run as written, in order.

Every ```` ```sh ```` block of README.md is either

* run here, in order, with ``bash -eu``, in an empty directory that holds only
  what a fresh clone would give these snippets (``.venv`` -> this test's
  environment, ``p2p/`` for the example scenario), or
* a ``make`` block (``make demo``, ``make test``: they build ``.venv`` and would
  run this very suite), which ``.ci/run`` must run as written, with the
  variables the snippet sets.

Synopses with placeholders are fenced as ``text``, not ``sh``.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
CI_RUN = ROOT / ".ci" / "run"

_BLOCK = re.compile(r"^( *)```sh\n(.*?)^ *```", re.DOTALL | re.MULTILINE)


def sh_blocks(text: str) -> list[str]:
    """The ``sh`` blocks of a Markdown text, dedented, in order."""
    return [textwrap.dedent(m.group(2)) for m in _BLOCK.finditer(text)]


def commands(block: str) -> list[list[str]]:
    """Each line of ``block`` as words, comments dropped."""
    return [shlex.split(line, comments=True) for line in block.splitlines() if line.strip()]


def _make_call(words: list[str]) -> tuple[dict[str, str], list[str]] | None:
    """``VAR=value ... make TARGET...`` as (variables, make's arguments), else ``None``."""
    env: dict[str, str] = {}
    for i, word in enumerate(words):
        if word == "make":
            return env, words[i + 1 :]
        if "=" not in word:
            return None
        key, value = word.split("=", 1)
        env[key] = value
    return None


def is_make_block(block: str) -> bool:
    return any(_make_call(words) is not None for words in commands(block))


def test_the_readme_has_snippets_of_both_kinds() -> None:
    blocks = sh_blocks(README.read_text())
    assert sum(map(is_make_block, blocks)) >= 2
    assert sum(not is_make_block(b) for b in blocks) >= 2
    for block in blocks:  # a block is one kind or the other, never both
        calls = [_make_call(words) is not None for words in commands(block)]
        assert all(calls) or not any(calls), block


def test_ci_runs_every_make_snippet_as_written() -> None:
    ci = CI_RUN.read_text()
    scrubbed = re.search(r"scrubbed=\((.*?)\)", ci, re.DOTALL)
    assert scrubbed is not None, "`.ci/run` runs make in a scrubbed environment"
    ci_env = dict(
        w.split("=", 1) for w in shlex.split(scrubbed.group(1).replace("\n", " ")) if "=" in w
    )
    assert set(ci_env) == {"PATH", "HOME", "LANG", "CI", "HYPOTHESIS_PROFILE"}
    ran = re.findall(r'^"\$\{scrubbed\[@\]\}" make (.+)$', ci, re.MULTILINE)
    for block in filter(is_make_block, sh_blocks(README.read_text())):
        for words in commands(block):
            call = _make_call(words)
            assert call is not None
            env, args = call
            assert " ".join(args) in ran, f"`.ci/run` does not run `make {' '.join(args)}`"
            for key, value in env.items():
                assert ci_env.get(key) == value, f"the README sets {key}={value}; CI does not"


def test_the_other_snippets_run_in_order(tmp_path: Path) -> None:
    """From an empty directory, the way a new user pastes them after ``make demo``."""
    (tmp_path / ".venv").symlink_to(Path(sys.prefix))
    (tmp_path / "p2p").symlink_to(ROOT / "p2p")
    assert (tmp_path / ".venv" / "bin" / "p2p").exists(), "run the tests from the .venv"
    outputs: list[tuple[str, subprocess.CompletedProcess[str]]] = []
    for block in sh_blocks(README.read_text()):
        if is_make_block(block):
            continue
        run = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", block],
            cwd=tmp_path, capture_output=True, text=True, timeout=180, check=False,
        )  # fmt: skip
        assert run.returncode == 0, f"{block}\n{run.stdout}\n{run.stderr}"
        assert "Traceback" not in run.stderr, run.stderr
        outputs.append((block, run))
    sim = outputs[0][1]
    nodes = next(run for block, run in outputs if "p2p node" in block or "p2p sub" in block)
    crash = next(run for block, run in outputs if "CRASH" in block)
    assert "vcube-ps:" in sim.stdout
    assert "detector: 15 detections of crashed nodes" in crash.stdout
    assert (tmp_path / "m.json").exists()
    assert (tmp_path / "t.jsonl").exists()
    alice = nodes.stdout.splitlines()
    assert any(line.startswith("chat ") and line.endswith(" 1 hello") for line in alice), alice
    assert "each confirmed by 1 other subscriber" in nodes.stderr
    seqs = [int(line.split()[2]) for f in ("first.txt", "again.txt")
            for line in (tmp_path / f).read_text().splitlines()]  # fmt: skip
    assert len(seqs) == 25
    assert seqs == list(range(seqs[0], seqs[0] + 25)), seqs  # resumed: none missed, none twice
    # A normal exchange logs no warning: alice and bob leave at the same
    # moment, and each one's LEAVE dial to the other used to warn "cannot reach".
    assert "WARNING" not in nodes.stderr, nodes.stderr

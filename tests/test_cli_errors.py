"""Every everyday mistake ends in one ``p2p: error:`` line and an exit status, never a
traceback: real processes (``python -m p2p``), plus the handler's own rules."""

from __future__ import annotations

import errno
import resource
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from _cli import P2P, as_from_a_terminal, assert_one_error_line, in_log, make_fleet, start, wait_for
from _cli import stop as stop_process

from p2p._errors import CommandError, P2PError
from p2p._shutdown import run_cli


def _run(
    *args: str, preexec: Callable[[], object] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*P2P, *args], capture_output=True, text=True, timeout=60, check=False, input="",
        preexec_fn=preexec, cwd=cwd,
    )  # fmt: skip


@pytest.fixture
def fleet(tmp_path: Path) -> Path:
    make_fleet(tmp_path, ["a", "b"])
    return tmp_path


def _sub(node: Path, *extra: str) -> list[str]:
    return ["sub", "--identity", str(node), "t", "--settle", "0", "--duration", "5", "--quiet",
            *extra]  # fmt: skip


def test_interface_that_is_not_local(fleet: Path) -> None:
    result = _run(*_sub(fleet / "a", "--interface", "192.0.2.1"))  # TEST-NET-1
    assert_one_error_line(result, 2, "--interface 192.0.2.1", "not an address of this machine")


def test_port_in_use(fleet: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = _run(*_sub(fleet / "a", "--port", str(port)))
    assert_one_error_line(result, 1, f"--port {port}", "already in use")


def test_second_process_with_the_same_identity(fleet: Path) -> None:
    log = fleet / "first.log"
    first = start(["sub", "--identity", str(fleet / "a"), "t", "--settle", "0"], log)
    try:
        wait_for("the first process", in_log(log, "subscribed to 't'"), log=log)
        result = _run(*_sub(fleet / "a"))
    finally:
        stop_process(first)
    assert_one_error_line(result, 1, "already in use by process", str(first.pid))


@pytest.mark.parametrize(
    ("damage", "fragment"),
    [
        ("node.key", "corrupt or encrypted private key"),
        ("fleet.cbor", "corrupt fleet description"),
        ("node.key-dir", "node.key"),
        ("missing", "no such node directory"),
    ],
)
def test_corrupt_or_unreadable_identity(fleet: Path, damage: str, fragment: str) -> None:
    node = fleet / "a"
    if damage == "node.key-dir":  # unreadable as a key (root reads any mode bits)
        (node / "node.key").unlink()
        (node / "node.key").mkdir()
    elif damage == "missing":
        shutil.rmtree(node)
    else:
        (node / damage).write_bytes(b"\x00garbage\xff" * 8)
    result = _run(*_sub(node))
    assert_one_error_line(result, 2, fragment)


def test_corrupt_or_missing_fleet_directory(fleet: Path) -> None:
    (fleet / "fleet" / "fleet.cbor").write_bytes(b"not cbor at all")
    result = _run("fleet", "add-node", str(fleet / "fleet"), str(fleet / "c"))
    assert_one_error_line(result, 2, "fleet.cbor")
    result = _run("fleet", "add-node", str(fleet / "nowhere"), str(fleet / "c"))
    assert_one_error_line(result, 2, "nowhere")


def test_identity_of_another_fleet(fleet: Path, tmp_path: Path) -> None:
    other = tmp_path / "other"
    assert _run("fleet", "init", str(other)).returncode == 0
    result = _run("fleet", "add-node", str(other), str(fleet / "a"))
    assert_one_error_line(result, 2, "already belongs to fleet")
    shutil.copy(other / "fleet.cbor", fleet / "a" / "fleet.cbor")  # a's certificate: first fleet
    result = _run(*_sub(fleet / "a"))
    assert_one_error_line(result, 2, "another fleet")


def test_payload_over_the_limit(fleet: Path) -> None:
    result = _run("pub", "--identity", str(fleet / "a"), "t", "x" * 65537, "--quiet")
    assert_one_error_line(result, 2, "65537 bytes", "payload limit of 65536 bytes")


@pytest.mark.parametrize("limit", [8, 12])
def test_too_many_open_files(fleet: Path, limit: int) -> None:
    def few_files() -> None:
        as_from_a_terminal()
        resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

    result = _run(*_sub(fleet / "a"), preexec=few_files)
    assert_one_error_line(result, 1, "too many open files", f"may open {limit}", "ulimit -n")


def test_debug_shows_the_traceback(fleet: Path) -> None:
    result = _run("--debug", *_sub(fleet / "missing"))
    assert result.returncode == 2
    assert "Traceback" in result.stderr
    assert result.stderr.splitlines()[-1].startswith("p2p: error: ")


# ------------------------------------------------------------ the handler itself


def _one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    (line,) = err.splitlines()
    return line


def test_groups_are_unwrapped_into_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    def bind_fails() -> int:
        inner = ExceptionGroup("serve", [OSError(errno.EADDRINUSE, "Address already in use")])
        raise ExceptionGroup("nursery", [inner])

    assert run_cli(bind_fails) == 1
    assert "address already in use" in _one_line(capsys)

    def usage_and_runtime() -> int:
        raise ExceptionGroup("both", [P2PError("bad --flag"), CommandError("later")])

    assert run_cli(usage_and_runtime) == 2
    assert _one_line(capsys) == "p2p: error: bad --flag"

    def interrupted() -> int:
        raise BaseExceptionGroup("run", [KeyboardInterrupt(), OSError(errno.EPIPE, "x")])

    assert run_cli(interrupted) == 130
    assert _one_line(capsys) == "p2p: interrupted"


def test_out_of_files_behind_another_error(capsys: pytest.CaptureFixture[str]) -> None:
    def discovery_fails() -> int:
        try:
            try:
                raise OSError(errno.EMFILE, "Too many open files")
            except OSError as exc:
                raise P2PError(f"cannot start mDNS: {exc}") from exc
        except P2PError as err:
            raise ExceptionGroup("nursery", [err]) from None

    assert run_cli(discovery_fails) == 1
    assert "too many open files (this process may open" in _one_line(capsys)


def test_a_bug_keeps_its_traceback() -> None:
    def bug() -> int:
        raise ExceptionGroup("nursery", [ZeroDivisionError("bug")])

    with pytest.raises(ExceptionGroup):
        run_cli(bug)


@pytest.mark.parametrize(
    ("flag", "value", "fragment"),
    [
        ("--tpp-mean", "-5", "delay parameter tpp_mean must be a finite non-negative"),
        ("--tpp-stdev", "nan", "argument --tpp-stdev: must be a finite number"),
        ("--tt", "inf", "argument --tt: must be a finite number"),
    ],
)
def test_sim_delay_that_is_negative_or_not_finite(
    tmp_path: Path, flag: str, value: str, fragment: str
) -> None:
    """A negative delay raised a traceback; NaN ran with nonsense latencies and
    infinity never ended: each is an error, exit 2, now."""
    scenario = tmp_path / "s.txt"
    scenario.write_text("0;SUB;1;t\n10;PUB;1;t;x\n")
    result = _run("sim", str(scenario), "--nodes", "4", flag, value)
    assert result.returncode == 2, result.stderr
    assert fragment in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["status", "--identity", "NODE", "--wait", "nan"],
        ["node", "--identity", "NODE", "--duration", "nan"],
        ["node", "--identity", "NODE", "--settle", "nan", "--duration", "1"],
        ["node", "--identity", "NODE", "--rate", "inf", "--publish", "t", "--count", "1"],
        ["telemetry", "collect", "land", "--identity", "NODE", "--duration", "nan"],
    ],
)
def test_a_number_that_is_not_finite_is_refused(fleet: Path, args: list[str]) -> None:
    """``nan`` passed every ``<= 0`` check and reached trio as a deadline (a
    traceback); ``--rate nan`` published nothing and exited 0."""
    result = _run(*[str(fleet / "a") if a == "NODE" else a for a in args])
    assert result.returncode == 2, result.stderr
    assert "must be a finite number" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("command", [["fleet", "init"], ["fleet", "add-node", "FLEET"]])
def test_an_empty_directory_argument_writes_nothing_here(
    tmp_path: Path, fleet: Path, command: list[str]
) -> None:
    """``Path("")`` is the current directory: ``p2p fleet add-node FLEET ""``
    wrote a node's key, certificate and fleet file there."""
    here = tmp_path / "here"
    here.mkdir()
    args = [str(fleet) if a == "FLEET" else a for a in command]
    result = _run(*args, "", cwd=here)
    assert result.returncode == 2, result.stderr
    assert "must not be empty" in result.stderr
    assert "Traceback" not in result.stderr
    assert list(here.iterdir()) == []


@pytest.mark.parametrize("flag", ["--metrics", "--trace"])
def test_an_output_path_that_cannot_be_written_fails_before_the_run(
    tmp_path: Path, flag: str
) -> None:
    """The simulator wrote its outputs at the end: a bad path lost the whole run."""
    scenario = tmp_path / "s.txt"
    scenario.write_text("0;SUB;1;t\n10;PUB;1;t;x\n")
    missing = tmp_path / "no-such-dir" / "out.json"
    result = _run("sim", str(scenario), "--nodes", "4", flag, str(missing))
    assert_one_error_line(result, 2, f"{flag} {missing}", "no directory")
    assert "publications" not in result.stdout  # nothing ran
    result = _run("sim", str(scenario), "--nodes", "4", flag, str(tmp_path))
    assert_one_error_line(result, 2, "is a directory")
    result = _run("demo", "--metrics", str(missing))
    assert_one_error_line(result, 2, "no directory")
    assert "Simulating" not in result.stdout


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["telemetry", "collect", "", "--identity", "NODE"], "LANDING_DIR: must not be empty"),
        (["telemetry", "aggregate", "", "--out", "o"], "LANDING_DIR: must not be empty"),
        (["telemetry", "generate", "--out", "", "--hours", "1", "--devices", "1"], "--out: must"),
        (["telemetry", "collect", "land", "--identity", "NODE", "--duration", "-1"], "positive"),
    ],
)
def test_telemetry_paths_and_durations_that_mean_nothing(
    tmp_path: Path, fleet: Path, args: list[str], fragment: str
) -> None:
    """An empty LANDING_DIR collected into the current directory, and a
    negative --duration ran nothing and exited 0."""
    here = tmp_path / "here"
    here.mkdir()
    argv = [str(fleet / "a") if a == "NODE" else a for a in args]
    result = _run(*argv, cwd=here)
    assert result.returncode == 2, result.stderr
    assert fragment in result.stderr
    assert "Traceback" not in result.stderr
    assert list(here.iterdir()) == []


@pytest.mark.parametrize(
    "args",
    [
        ["edge_examples.sensor", "run", "--identity", "NODE", "--interval", "nan"],
        ["edge_examples.telemetry_demo", "--duration", "nan"],
        ["edge_examples.game", "--headless", "--rate", "inf"],
    ],
)
def test_the_examples_refuse_numbers_that_are_not_finite(fleet: Path, args: list[str]) -> None:
    """The sensor ran on with ``--interval nan`` publishing nothing; the
    telemetry demo died with a trio traceback."""
    argv = [str(fleet / "a") if a == "NODE" else a for a in args]
    result = subprocess.run(
        [sys.executable, "-m", *argv], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 2, result.stderr
    assert "must be a finite number" in result.stderr
    assert "Traceback" not in result.stderr

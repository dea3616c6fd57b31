"""A real Spark standalone cluster on this host, for tests and benchmarks.

:func:`standalone_cluster` starts a master and ``workers`` workers as local
processes with the ``spark-class`` launcher that PySpark's pip package
ships, all bound to 127.0.0.1 on free ports chosen by the kernel, and kills
their whole process groups (executors and their Python workers included)
when the block ends, however it ends.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from p2p.telemetry._schema import TelemetryError
from p2p.telemetry._spark import LOOPBACK, require_pyspark

_MASTER_URL = re.compile(r"Starting Spark master at (spark://\S+)")
_REGISTERED = re.compile(r"Registering worker ")


@dataclass(slots=True)
class _Daemon:
    """One launched JVM and the lines it logged (read by a thread)."""

    proc: subprocess.Popen[str]
    lines: list[str] = field(default_factory=list)
    changed: threading.Condition = field(default_factory=threading.Condition)

    def pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self.changed:
                self.lines.append(line.rstrip())
                self.changed.notify_all()

    def wait_for(self, pattern: re.Pattern[str], count: int, timeout: float) -> list[str]:
        """The first ``count`` matches of ``pattern`` in the log, waiting up to ``timeout``."""
        deadline = time.monotonic() + timeout
        with self.changed:
            while True:
                found = [m.group(0) for m in map(pattern.search, self.lines) if m]
                if len(found) >= count:
                    return found
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None:
                    tail = "\n".join(self.lines[-15:])
                    raise TelemetryError(f"standalone Spark did not start:\n{tail}")
                self.changed.wait(min(left, 0.5))


def _spark_home() -> Path:
    require_pyspark()
    from pyspark.find_spark_home import _find_spark_home

    return Path(_find_spark_home())


def _launch(cls: str, args: list[str], work: Path) -> _Daemon:
    home = _spark_home()
    env = {
        **os.environ,
        "SPARK_HOME": str(home),
        "SPARK_LOCAL_IP": LOOPBACK,
        "SPARK_LOG_DIR": str(work / "logs"),
        "SPARK_NO_DAEMONIZE": "1",
    }
    proc = subprocess.Popen(
        [str(home / "bin" / "spark-class"), cls, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        env=env,
        cwd=work,
        start_new_session=True,  # its own process group: executors die with it
    )
    daemon = _Daemon(proc)
    name = f"spark-{cls.rsplit('.', 1)[-1]}"
    threading.Thread(target=daemon.pump, name=name, daemon=True).start()
    return daemon


def _kill(daemon: _Daemon) -> None:
    """SIGTERM to the daemon's process group, SIGKILL after 10 s."""
    for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(daemon.proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            daemon.proc.wait(timeout=wait)
            break
        except subprocess.TimeoutExpired:
            continue
    with contextlib.suppress(ProcessLookupError):  # the group may outlive its leader
        os.killpg(daemon.proc.pid, signal.SIGKILL)


@dataclass(frozen=True, slots=True)
class Cluster:
    url: str
    """``spark://127.0.0.1:PORT``"""
    pids: tuple[int, ...]
    """The master's and the workers' processes (executors are their children)."""


@contextmanager
def standalone_cluster(
    workers: int = 1, cores: int = 1, memory: str = "1g", timeout: float = 90.0
) -> Iterator[Cluster]:
    """Yields the cluster once every worker registered with the master."""
    work = Path(tempfile.mkdtemp(prefix="p2p-spark-standalone-"))
    daemons: list[_Daemon] = []
    try:
        master = _launch(
            "org.apache.spark.deploy.master.Master",
            ["--host", LOOPBACK, "--port", "0", "--webui-port", "0"],
            work,
        )
        daemons.append(master)
        url = _MASTER_URL.search(master.wait_for(_MASTER_URL, 1, timeout)[0])
        assert url is not None
        for i in range(workers):
            folder = work / f"worker{i}"
            folder.mkdir()
            args = ["--host", LOOPBACK, "--port", "0", "--webui-port", "0", "--cores", str(cores)]
            args += ["--memory", memory, "--work-dir", str(folder), url.group(1)]
            daemons.append(_launch("org.apache.spark.deploy.worker.Worker", args, folder))
        master.wait_for(_REGISTERED, workers, timeout)
        yield Cluster(url.group(1), tuple(d.proc.pid for d in daemons))
    finally:
        for daemon in reversed(daemons):
            _kill(daemon)
        shutil.rmtree(work, ignore_errors=True)


__all__ = ["Cluster", "standalone_cluster"]

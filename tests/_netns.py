"""Throw-away network namespaces joined by a bridge, for system tests (Linux, root).

:class:`Lan` builds, per run, one *hub* namespace holding a Linux bridge and
``count`` host namespaces, each with ``lo`` up and one veth end addressed in
``10.213.<octet>.0/24`` (plus a 224.0.0.0/4 route, so mDNS leaves through it);
the other end of each veth is a port of the bridge in the hub.  Veth pairs
are created directly inside their namespaces, so nothing ever appears in (or
sends through) the root namespace.  Every name carries a random suffix, so
concurrent runs cannot collide.

Teardown (:meth:`Lan.close`, also on ``with`` exit and on a failed build)
kills the processes started with :meth:`Lan.spawn` (their whole process
group), then whatever else still runs in the namespaces (``ip netns pids``),
then deletes the namespaces, which destroys their veth ends and the bridge.
:func:`leftovers` reports any namespace or root-namespace link of a run that
survived; :attr:`Lan.killed` lists every pid teardown signalled.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType, TracebackType
from typing import IO

PREFIX = "p2pt"
"""Start of every namespace name this module creates."""


class NetnsError(RuntimeError):
    """An ``ip`` command failed while building or tearing down namespaces."""


@dataclass(frozen=True, slots=True)
class Host:
    """One host namespace: its name, veth interface and IPv4 address."""

    netns: str
    interface: str
    address: str


def unavailable() -> str | None:
    """Why namespaces cannot be built here (``None`` when they can)."""
    if os.geteuid() != 0:
        return "the netns system test must run as root (it creates network namespaces)"
    if shutil.which("ip") is None:
        return "the netns system test needs the `ip` command (iproute2)"
    return None


def ip(*args: str, check: bool = True) -> str:
    """Run ``ip ARGS``; return its stdout, raise :class:`NetnsError` on failure."""
    proc = subprocess.run(
        ["ip", *args], capture_output=True, text=True, timeout=30, check=False
    )  # fmt: skip
    if check and proc.returncode != 0:
        raise NetnsError(f"ip {' '.join(args)}: {proc.stderr.strip() or proc.returncode}")
    return proc.stdout


def namespaces() -> list[str]:
    """Names of every named network namespace (``ip netns list``)."""
    return [line.split()[0] for line in ip("netns", "list").splitlines() if line.strip()]


def netns_pids(netns: str) -> list[int]:
    """Processes running in ``netns`` (empty when it does not exist)."""
    out = ip("netns", "pids", netns, check=False)
    return [int(p) for p in out.split() if p.isdigit()]


def alive(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def leftovers(suffix: str) -> list[str]:
    """Namespaces and root-namespace links of run ``suffix`` that still exist."""
    found = [f"netns {name}" for name in namespaces() if suffix in name]
    links = [line.split(":")[1].strip().split("@")[0] for line in ip("-o", "link").splitlines()]
    found += [f"link {name}" for name in links if suffix in name]
    return found


class Lan:
    """``count`` host namespaces on one bridge; use as ``with Lan(8) as lan: ...``."""

    def __init__(self, count: int, *, octet: int | None = None) -> None:
        if not 1 <= count <= 250:
            raise ValueError(f"a Lan has 1..250 hosts, got {count}")
        self.suffix = secrets.token_hex(3)
        self.octet = octet if octet is not None else 1 + secrets.randbelow(254)
        self.hub = f"{PREFIX}-{self.suffix}-hub"
        self.bridge = f"br{self.suffix}"
        self.hosts = [self._host(i) for i in range(count)]
        self.procs: list[subprocess.Popen[bytes]] = []
        self.killed: set[int] = set()
        """Every pid teardown signalled (so a test can check they are all gone)."""
        self._made: list[str] = []

    def __enter__(self) -> Lan:
        try:
            self.build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _host(self, i: int) -> Host:
        name = f"{PREFIX}-{self.suffix}-n{i}"
        return Host(name, f"v{self.suffix}n{i}", f"10.213.{self.octet}.{i + 1}")

    # ----------------------------------------------------------------- build

    def build(self) -> None:
        """Create the hub with its bridge, then every host and its veth pair."""
        self._add_netns(self.hub)
        ip("-n", self.hub, "link", "add", self.bridge, "type", "bridge", "mcast_snooping", "0")
        ip("-n", self.hub, "link", "set", self.bridge, "up")
        for i, host in enumerate(self.hosts):
            self._add_host(i, host)

    def _add_netns(self, name: str) -> None:
        ip("netns", "add", name)
        self._made.append(name)
        ip("-n", name, "link", "set", "lo", "up")

    def _add_host(self, i: int, host: Host) -> None:
        port = f"p{self.suffix}n{i}"
        self._add_netns(host.netns)
        ip(
            "link", "add", host.interface, "netns", host.netns, "type", "veth",
            "peer", "name", port, "netns", self.hub,
        )  # fmt: skip
        ip("-n", self.hub, "link", "set", port, "master", self.bridge)
        ip("-n", self.hub, "link", "set", port, "up")
        ip("-n", host.netns, "addr", "add", f"{host.address}/24", "dev", host.interface)
        ip("-n", host.netns, "link", "set", host.interface, "up")
        ip("-n", host.netns, "route", "add", "224.0.0.0/4", "dev", host.interface)

    # ------------------------------------------------------------- processes

    def spawn(
        self, host: Host, argv: Sequence[str], *, stdout: IO[bytes], stderr: IO[bytes]
    ) -> subprocess.Popen[bytes]:
        """Start ``argv`` inside ``host``'s namespace, in a process group of its own."""
        proc = subprocess.Popen(
            ["ip", "netns", "exec", host.netns, *argv],
            stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr, start_new_session=True,
        )  # fmt: skip
        self.procs.append(proc)
        return proc

    # -------------------------------------------------------------- teardown

    def close(self) -> None:
        """Kill every process of the run, then delete every namespace (idempotent)."""
        try:
            self._stop_spawned()
            for name in self._made:
                self._kill_netns_pids(name)
        finally:
            errors = [err for name in reversed(self._made) if (err := _delete(name))]
            self._made.clear()
            if errors:
                raise NetnsError("; ".join(errors))

    def _stop_spawned(self, grace: float = 2.0) -> None:
        """SIGTERM each spawned process group, SIGKILL what is left after ``grace``."""
        running = [p for p in self.procs if p.poll() is None]
        for p in running:
            self._signal_group(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace
        for p in running:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(max(0.0, deadline - time.monotonic()))
        for p in self.procs:
            self._signal_group(p.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(5)

    def _signal_group(self, pgid: int, sig: signal.Signals) -> None:
        self.killed.add(pgid)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)

    def _kill_netns_pids(self, name: str) -> None:
        """SIGKILL whatever still runs in ``name`` (escaped its process group)."""
        for _ in range(50):
            pids = netns_pids(name)
            if not pids:
                return
            for pid in pids:
                self.killed.add(pid)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.05)
        raise NetnsError(f"processes {netns_pids(name)} in {name} survive SIGKILL")


def _delete(name: str) -> str | None:
    """Delete namespace ``name`` (and so its interfaces); an error message or ``None``."""
    try:
        ip("netns", "del", name)
    except NetnsError as exc:
        if name in namespaces():
            return str(exc)
    return None


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    """Turn SIGTERM into :class:`KeyboardInterrupt` inside the block, so that
    ``finally`` clauses (namespace teardown) still run when CI kills the job."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def raise_interrupt(signum: int, frame: FrameType | None) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, raise_interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)

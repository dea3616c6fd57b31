"""A node on arm64, emulated, beside native nodes on a namespace LAN: ``make arm64-check``.

Root only (it builds network namespaces and a chroot).  Steps:

1. **An aarch64 Debian root** (bookworm, ``--variant=minbase`` with
   ``python3``) made with ``debootstrap --foreign`` and completed by
   unpacking every downloaded package with ``dpkg-deb -x``: debootstrap's
   second stage runs the root's own programs, which needs a binfmt_misc
   handler for qemu; this check needs none, because it starts the emulator
   itself (``chroot ROOT /usr/bin/qemu-aarch64-static /usr/bin/python3``),
   so it runs where binfmt_misc cannot be mounted (containers).  The root is
   kept in ``--root`` and reused by the next run.
2. **The library from wheels only**: a wheel of this checkout (pure Python),
   installed with its dependencies into ``ROOT/opt/p2p`` by
   ``pip install --only-binary=:all: --platform manylinux..._aarch64``
   (pip runs on the host and picks the aarch64 wheels; no compiler, no sdist).
3. **A LAN of three namespaces** (``tests/_netns.py``): a native subscriber
   ``x1``; the emulated ``p2p node`` ``arm`` that subscribes and publishes
   ``--messages``; then a native publisher ``x2`` once ``arm`` has
   subscribed.  Every node writes a trace; ``p2p check`` must pass on the
   three, ``x1`` must deliver every message of ``arm`` and ``x2``, and ``arm``
   every message of ``x2`` (both ways).

It reports the installed size, the emulated node's start-up time (spawn to
listening), its largest RSS (the qemu process, emulator included), the time
``from p2p import open_node`` takes under emulation, and writes them as JSON
(``--out``).  Everything it starts is stopped and every namespace deleted,
also on failure.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO / "tests"))

from _netns import Lan, unavailable  # noqa: E402

PLATFORMS = [
    "manylinux2014_aarch64",
    *(f"manylinux_2_{minor}_aarch64" for minor in (17, 24, 26, 27, 28, 31, 34, 35, 36)),
    "linux_aarch64",
]
"""What a bookworm arm64 root (glibc 2.36) accepts, for ``pip --platform``."""

QEMU = "/usr/bin/qemu-aarch64-static"


class CheckError(Exception):
    """A step failed; the message says which and why."""


def run(*argv: str, **kw: Any) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(list(argv), capture_output=True, text=True, check=False, **kw)
    if proc.returncode != 0:
        raise CheckError(f"{' '.join(argv[:4])} ...: {(proc.stderr or proc.stdout)[-1500:]}")
    return proc


def emulated(root: Path, *argv: str) -> list[str]:
    """The command that runs ``argv`` (a path inside the root) under qemu in the root,
    with the library on the path."""
    return ["chroot", str(root), QEMU, "-E", "PYTHONPATH=/opt/p2p", *argv]


def build_root(root: Path, mirror: str, suite: str) -> float:
    """The aarch64 root (made once, then reused); seconds it took (0 when reused)."""
    stamp = root / ".p2p-root-ready"
    if stamp.exists():
        return 0.0
    started = time.monotonic()
    if root.exists():
        shutil.rmtree(root)
    run(
        "debootstrap",
        "--foreign",
        "--arch=arm64",
        "--variant=minbase",
        "--include=python3",
        suite,
        str(root),
        mirror,
    )
    for deb in sorted((root / "var/cache/apt/archives").glob("*.deb")):
        run("dpkg-deb", "-x", str(deb), str(root))
    shutil.copy2(QEMU, root / QEMU.lstrip("/"))
    probe = subprocess.run(
        emulated(root, "/usr/bin/python3", "-c", "import platform; print(platform.machine())"),
        capture_output=True,
        text=True,
        check=False,
    )
    if probe.stdout.strip() != "aarch64":
        raise CheckError(f"the emulated python does not run: {probe.stderr[-500:]}")
    stamp.write_text("ok\n")
    return time.monotonic() - started


def install(root: Path, work: Path) -> int:
    """The library and its dependencies from wheels into ``ROOT/opt/p2p``; its size in bytes."""
    target = root / "opt/p2p"
    if target.exists():
        shutil.rmtree(target)
    dist = work / "dist"
    run(sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(dist), str(REPO))
    (wheel,) = dist.glob("vcube_ps-*.whl")
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    run(
        sys.executable,
        "-m",
        "pip",
        "install",
        "--quiet",
        "--only-binary=:all:",
        *platforms,
        "--python-version",
        "3.11",
        "--implementation",
        "cp",
        "--abi",
        "cp311",
        "--abi",
        "abi3",
        "--abi",
        "none",
        "--target",
        str(target),
        str(wheel),
    )
    return sum(f.stat().st_size for f in target.rglob("*") if f.is_file())


def import_time(root: Path) -> float:
    """Seconds ``from p2p import open_node`` takes in the emulated interpreter."""
    code = (
        "import time; t = time.perf_counter(); from p2p import open_node; "
        "print(time.perf_counter() - t)"
    )
    out = run(*emulated(root, "/usr/bin/python3", "-c", code))
    return float(out.stdout.strip())


def rss_of(pid: int) -> int:
    """Resident bytes of ``pid`` (0 once it is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return 0


def trace_counts(path: Path, me: str) -> dict[str, int]:
    """Deliveries per source (other than ``me``) in a ``p2p node --trace`` file."""
    counts: dict[str, int] = {}
    for line in path.read_text().splitlines():
        event = json.loads(line)
        if event["event"] == "deliver" and event["source"] != me:
            counts[event["source"]] = counts.get(event["source"], 0) + 1
    return counts


def lan_run(root: Path, work: Path, messages: int, rate: float) -> dict[str, Any]:
    """The three nodes on a namespace LAN; what was delivered and measured."""
    from p2p import fleet

    fleet.init_fleet(work / "fleet", psk=True)
    dirs = {"x1": work / "x1", "arm": root / "work/arm", "x2": work / "x2"}
    if dirs["arm"].parent.exists():
        shutil.rmtree(dirs["arm"].parent)
    ids = {name: fleet.add_node(work / "fleet", d).node_id for name, d in dirs.items()}
    hexid = {name: f"{i:016x}" for name, i in ids.items()}
    logs: dict[str, IO[bytes]] = {}
    with Lan(3) as lan:
        x1_host, arm_host, x2_host = lan.hosts
        seed = f"{arm_host.address}:7411"
        # what both publishers (arm and x2) send
        publish = ("--publish", "chat", "--count", str(messages), "--rate", str(rate))

        def node(name: str, host: Any, *args: str, inside: bool = False) -> Any:
            logs[name] = open(work / f"{name}.log", "wb")  # noqa: SIM115 (closed below)
            trace = f"/work/{name}.jsonl" if inside else str(work / f"{name}.jsonl")
            ident = "/work/arm" if inside else str(dirs[name])
            argv = [
                "node",
                "--identity",
                ident,
                "--interface",
                host.address,
                "--trace",
                trace,
                *args,
            ]
            command = (
                emulated(root, "/usr/bin/python3", "-m", "p2p", *argv)
                if inside
                else [sys.executable, "-m", "p2p", *argv]
            )
            return lan.spawn(host, command, stdout=logs[name], stderr=logs[name])

        try:
            x1 = node(
                "x1",
                x1_host,
                "--port",
                "7411",
                "--seed",
                seed,
                "--subscribe",
                "chat",
                "--settle",
                "1",
            )
            _wait(work / "x1.log", "listening on", 60, x1, lambda: None)
            # arm settles 5 s (finds x1) before it subscribes and publishes; mDNS cannot
            # run under qemu-user (it does not emulate IP_PKTINFO and IP_MULTICAST_IF)
            arm = node(
                "arm",
                arm_host,
                "--no-mdns",
                "--seed",
                f"{x1_host.address}:7411",
                "--port",
                "7411",
                *publish,
                "--settle",
                "5",
                inside=True,
            )
            peak = 0

            def sample() -> None:
                nonlocal peak
                peak = max(peak, rss_of(arm.pid))

            startup = _wait(work / "arm.log", "listening on", 120, arm, sample)
            _wait(work / "arm.log", "subscribed to 'chat'", 120, arm, sample)
            _wait(work / "x1.log", "subscribed to 'chat'", 60, x1, sample)
            x2 = node(
                "x2",
                x2_host,
                "--seed",
                seed,
                *publish,
                "--settle",
                "3",
            )
            _wait(work / "x2.log", f"published {messages}", 120, x2, sample)
            _wait(work / "arm.log", f"published {messages}", 120, arm, sample)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:  # until arm and x1 have every message
                sample()
                got_arm = trace_counts(root / "work/arm.jsonl", hexid["arm"])
                got_x1 = trace_counts(work / "x1.jsonl", hexid["x1"])
                if (
                    got_arm.get(hexid["x2"], 0) >= messages
                    and min(got_x1.get(hexid["arm"], 0), got_x1.get(hexid["x2"], 0)) >= messages
                ):
                    break
                time.sleep(0.2)
            for proc in (x2, arm, x1):
                proc.send_signal(signal.SIGTERM)
            for name, proc in (("x2", x2), ("arm", arm), ("x1", x1)):
                if proc.wait(60) != 0:
                    raise CheckError(
                        f"{name} ended with {proc.returncode}:\n"
                        f"{(work / f'{name}.log').read_text()[-1500:]}"
                    )
        finally:
            for fh in logs.values():
                fh.close()
    traces = [str(work / "x1.jsonl"), str(root / "work/arm.jsonl"), str(work / "x2.jsonl")]
    check = subprocess.run(
        [sys.executable, "-m", "p2p", "check", *traces], capture_output=True, text=True, check=False
    )
    got_arm = trace_counts(root / "work/arm.jsonl", hexid["arm"])
    got_x1 = trace_counts(work / "x1.jsonl", hexid["x1"])
    return {
        "messages": messages,
        "arm_delivered_from_x2": got_arm.get(hexid["x2"], 0),
        "x1_delivered_from_arm": got_x1.get(hexid["arm"], 0),
        "x1_delivered_from_x2": got_x1.get(hexid["x2"], 0),
        "trace_check": check.returncode,
        "trace_check_output": (check.stdout + check.stderr).strip()[-1000:],
        "startup_s": round(startup, 2),
        "max_rss_mb": round(peak / 1e6, 1),
    }


def _wait(log: Path, text: str, timeout: float, proc: subprocess.Popen[bytes], tick: Any) -> float:
    started = time.monotonic()
    while text not in log.read_text(errors="replace"):
        tick()
        if proc.poll() is not None or time.monotonic() - started > timeout:
            raise CheckError(f"no {text!r} in {log.name}:\n{log.read_text()[-1500:]}")
        time.sleep(0.05)
    return time.monotonic() - started


_SBIN = ("/usr/local/sbin", "/usr/sbin", "/sbin")


def apt_mirror() -> str | None:
    """The first Debian archive this machine's apt sources name (``None``: none)."""
    found: list[Path] = [Path("/etc/apt/sources.list")]
    found += sorted(Path("/etc/apt/sources.list.d").glob("*.sources"))
    found += sorted(Path("/etc/apt/sources.list.d").glob("*.list"))
    for path in found:
        try:
            text = path.read_text()
        except OSError:
            continue
        for line in text.splitlines():
            words = line.split("#", 1)[0].split()
            head = words[:1]
            uris = words[1:] if head == ["URIs:"] else words[1:2] if head == ["deb"] else []
            for uri in uris:
                if uri.rstrip("/").endswith("/debian"):
                    return uri.rstrip("/")
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.arm64_check",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--root",
        type=Path,
        default=Path("/var/tmp/p2p-arm64-root"),
        help="where the aarch64 root is built and kept",
    )
    parser.add_argument(
        "--mirror", default=None, help="Debian mirror (default: this machine's apt source)"
    )
    parser.add_argument("--suite", default="bookworm")
    parser.add_argument("--messages", type=int, default=50, help="publications per publisher")
    parser.add_argument("--rate", type=float, default=10.0, help="publications per second")
    parser.add_argument("--out", type=Path, help="write the result as JSON here")
    args = parser.parse_args(argv)
    # Root's tools (debootstrap, chroot) live in sbin, which a scrubbed PATH lacks.
    os.environ["PATH"] = os.pathsep.join([os.environ.get("PATH", ""), *_SBIN])
    args.mirror = args.mirror or apt_mirror()
    why = unavailable()
    if args.mirror is None:
        why = why or "no Debian mirror in /etc/apt/sources.list* (give --mirror)"
    missing = [t for t in ("debootstrap", "dpkg-deb", "chroot") if shutil.which(t) is None]
    if not Path(QEMU).exists():
        missing.append(QEMU)
    if why or missing:
        print(
            f"arm64_check: error: {why or 'missing ' + ', '.join(missing)} "
            "(apt-get install qemu-user-static debootstrap)",
            file=sys.stderr,
        )
        return 2
    import tempfile

    started = time.monotonic()
    try:
        with tempfile.TemporaryDirectory(prefix="p2p-arm64-") as tmp:
            work = Path(tmp)
            root_s = build_root(args.root, args.mirror, args.suite)
            size = install(args.root, work)
            result: dict[str, Any] = {
                "root_build_s": round(root_s, 1),
                "installed_mb": round(size / 1e6, 1),
                "import_s": round(import_time(args.root), 2),
                **lan_run(args.root, work, args.messages, args.rate),
            }
    except CheckError as exc:
        print(f"arm64_check: error: {exc}", file=sys.stderr)
        return 1
    result["wall_s"] = round(time.monotonic() - started, 1)
    ok = (
        result["trace_check"] == 0
        and result["arm_delivered_from_x2"] == args.messages
        and result["x1_delivered_from_arm"] == args.messages
        and result["x1_delivered_from_x2"] == args.messages
    )
    result["ok"] = ok
    print(json.dumps(result, indent=2))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""Certificates that end and a revocation list that spreads (issue 20, part).

Units: certificate lifetimes (expired and version-1 certificates are refused),
revocation lists (signed by the fleet key or the psk, serials, forgeries), the
``p2p fleet revoke`` command.  Real nodes on loopback (cert fleet, static
seeds, real TCP): a list copied into one member's directory spreads over the
overlay; every member drops the revoked node, refuses it afterwards, and
delivers nothing more from it, while the others lose nothing; a node whose
certificate expired never gets in.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import cbor2
import pytest
import trio

from p2p._errors import AuthenticationError, HandshakeError, SecurityError
from p2p._identity import (
    Certificate,
    add_node,
    init_fleet,
    load_fleet,
    load_fleet_authority,
    load_node,
    verify_certificate,
)
from p2p._revocation import REVOKED_FILE, RevocationList, load_revocations, revoke
from p2p._secure import SecureSession
from p2p.runtime import Delivery, Node, NodeConfig, open_node

DAY = 86400.0


def test_certificate_lifetime(tmp_path: Path) -> None:
    init_fleet(tmp_path / "f")
    now = time.time()
    ident = add_node(tmp_path / "f", tmp_path / "n", valid_days=2, now=now - DAY)
    cert = ident.certificate
    assert cert is not None
    assert cert.not_after == int(now - DAY) + 2 * 86400
    assert Certificate.decode(cert.encode()) == cert
    fleet = load_fleet(tmp_path / "f")
    verify_certificate(fleet, cert, now=now)
    with pytest.raises(AuthenticationError, match="expired at"):
        verify_certificate(fleet, cert, now=now + 2 * DAY)
    old = add_node(tmp_path / "f", tmp_path / "old", valid_days=1, now=now - 3 * DAY)
    with pytest.raises(Exception, match=r"expired at .*renew it with add-node"):
        load_node(tmp_path / "old")  # a node does not start with an expired certificate
    assert old.certificate is not None
    add_node(tmp_path / "f", tmp_path / "old")  # renewal: same key, new certificate
    assert load_node(tmp_path / "old")[0].node_id == old.node_id


def test_version_1_certificate_is_refused(tmp_path: Path) -> None:
    init_fleet(tmp_path / "f")
    authority = load_fleet_authority(tmp_path / "f")
    ident = add_node(tmp_path / "f", tmp_path / "n")
    assert authority.signing_key is not None
    v1 = Certificate(authority.fleet.fleet_id, ident.public_key, "n", 1, b"", None)
    v1 = Certificate(v1.fleet_id, v1.node_public_key, "n", 1, authority.signing_key.sign(
        v1._signed_part()))  # fmt: skip
    assert cbor2.loads(v1.encode())[0] == 1
    assert Certificate.decode(v1.encode()) == v1
    with pytest.raises(AuthenticationError, match="no expiry"):
        verify_certificate(authority.fleet, v1)


@pytest.mark.parametrize("psk", [False, True])
def test_revocation_lists_are_issued_by_the_fleet_only(tmp_path: Path, psk: bool) -> None:
    init_fleet(tmp_path / "f", psk=psk)
    init_fleet(tmp_path / "other", psk=psk)
    authority = load_fleet_authority(tmp_path / "f")
    first = revoke(authority, None, {5})
    second = revoke(authority, first, {7})
    assert (first.serial, second.serial, second.nodes) == (1, 2, frozenset({5, 7}))
    back = RevocationList.decode(second.encode())
    back.verify(authority.fleet)
    with pytest.raises(SecurityError, match="another fleet"):
        back.verify(load_fleet(tmp_path / "other"))
    forged = revoke(load_fleet_authority(tmp_path / "other"), None, {5})
    forged = RevocationList(authority.fleet.fleet_id, 9, forged.nodes, forged.proof)
    with pytest.raises(SecurityError, match=r"psk|signature"):
        forged.verify(authority.fleet)
    tampered = RevocationList(back.fleet_id, back.serial, frozenset({5}), back.proof)
    with pytest.raises(SecurityError):
        tampered.verify(authority.fleet)
    for bad in (b"\x80", cbor2.dumps([1, b"x" * 16, 1, [-1], b"y" * 64]), b"\xff" * 10):
        with pytest.raises(SecurityError):
            RevocationList.decode(bad)


def test_handshake_refuses_a_revoked_peer(tmp_path: Path) -> None:
    init_fleet(tmp_path / "f")
    a = add_node(tmp_path / "f", tmp_path / "a")
    b = add_node(tmp_path / "f", tmp_path / "b")
    fleet = load_fleet(tmp_path / "f")
    i = SecureSession.initiator(a, fleet)
    r = SecureSession.responder(b, fleet, revoked={a.node_id})
    r.start()
    msg2, _ = r.receive_handshake(i.start())
    msg3, _ = i.receive_handshake(msg2)
    with pytest.raises(HandshakeError, match="revoked"):
        r.receive_handshake(msg3)


def test_fleet_revoke_command(tmp_path: Path) -> None:
    init_fleet(tmp_path / "f")
    ident = add_node(tmp_path / "f", tmp_path / "n")
    add_node(tmp_path / "f", tmp_path / "m")
    run = [sys.executable, "-m", "p2p", "fleet", "revoke", str(tmp_path / "f")]
    done = subprocess.run(
        [*run, str(tmp_path / "n"), "00000000000000ab", "--to", str(tmp_path / "m")],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "revocation list 1: 2 nodes revoked" in done.stdout
    fleet = load_fleet(tmp_path / "f")
    rl = load_revocations(tmp_path / "m" / REVOKED_FILE, fleet)
    assert rl is not None
    assert rl.nodes == {ident.node_id, 0xAB}
    bad = subprocess.run([*run, "nonsense"], capture_output=True, text=True, check=False)
    assert bad.returncode != 0
    assert len(bad.stderr.strip().splitlines()) == 1, bad.stderr
    assert "Traceback" not in bad.stderr


# ----------------------------------------------------------------- real nodes


async def _until(cond: Callable[[], bool], timeout: float, what: str) -> None:
    with trio.move_on_after(timeout):
        while not cond():
            await trio.sleep(0.05)
        return
    raise AssertionError(f"timed out after {timeout} s waiting until {what}")


async def _collect(sub: object, out: list[Delivery]) -> None:
    async for d in sub:  # type: ignore[attr-defined]
        out.append(d)


def _cfg(seed: int | None, **kw: object) -> NodeConfig:
    seeds = () if seed is None else (f"127.0.0.1:{seed}",)
    return NodeConfig(discovery=False, seeds=seeds, seed_interval=1.0, drain_timeout=0.5, **kw)  # type: ignore[arg-type]


@pytest.mark.slow
def test_revoked_node_is_dropped_everywhere_and_refused(tmp_path: Path) -> None:
    init_fleet(tmp_path / "f")
    dirs = [tmp_path / f"n{i}" for i in range(4)]
    for d in dirs:
        add_node(tmp_path / "f", d)
    authority = load_fleet_authority(tmp_path / "f")
    follow = tmp_path / "n0-revoked.cbor"  # node 0 follows this file; the others hear it

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            nodes: list[Node] = []

            async def run(i: int, cfg: NodeConfig, task_status: trio.TaskStatus[Node]) -> None:
                async with open_node(load_node(dirs[i]), cfg) as node:
                    task_status.started(node)
                    await trio.sleep_forever()

            nodes.append(await nursery.start(run, 0, _cfg(None, revocation_file=follow)))
            for i in range(1, 4):
                nodes.append(await nursery.start(run, i, _cfg(nodes[0].port)))
            ids = {n.id for n in nodes}
            await _until(lambda: all(n.members() == ids for n in nodes), 20, "all know all")
            got: dict[int, list[Delivery]] = {n.id: [] for n in nodes}
            for n in nodes:
                nursery.start_soon(_collect, await n.subscribe("t"), got[n.id])
            rogue = nodes[3]
            await rogue.publish("t", b"before", wait_acked=True)
            honest = nodes[:3]
            await _until(lambda: all(len(got[n.id]) == 1 for n in honest), 10, "'before'")
            follow.write_bytes(revoke(authority, None, {rogue.id}).encode())
            gone = ids - {rogue.id}
            await _until(lambda: all(n.members() == gone for n in honest), 10, "rogue dropped")
            await rogue.publish("t", b"after")
            for i, n in enumerate(honest):
                await n.publish("t", f"honest{i}".encode(), wait_acked=True)
            await trio.sleep(2)  # time for the rogue's publication, were it to get through
            for n in honest:
                payloads = sorted(d.payload for d in got[n.id])
                assert payloads == [b"before", b"honest0", b"honest1", b"honest2"], payloads
                assert n.stats["refused_connections"] >= 0
            assert all(rogue.id not in n.members() for n in honest)
            nursery.cancel_scope.cancel()

    trio.run(main)


@pytest.mark.slow
def test_node_with_an_expired_certificate_never_gets_in(tmp_path: Path) -> None:
    init_fleet(tmp_path / "f")
    add_node(tmp_path / "f", tmp_path / "a")
    expired = add_node(tmp_path / "f", tmp_path / "e", valid_days=1, now=time.time() - 2 * DAY)
    fleet = load_fleet(tmp_path / "f")

    async def main() -> None:
        async with open_node(load_node(tmp_path / "a"), _cfg(None)) as a:
            sub = await a.subscribe("t")
            async with open_node((expired, fleet), _cfg(a.port)) as e:
                await e.subscribe("t")
                await e.publish("t", b"from an expired node")
                await trio.sleep(3)
                assert a.members() == {a.id}
                assert e.id not in a.peers
                assert a.stats["rejected_connections"] >= 1
                with trio.move_on_after(1):
                    got = await sub.receive()
                    raise AssertionError(f"delivered {got!r}")

    trio.run(main)

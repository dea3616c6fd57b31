"""The public fleet API (``p2p.fleet``, issue 44): create, add, load, renew, revoke,
and one-line errors for a wrong or corrupt directory."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import trio

from p2p import P2PError, fleet
from p2p.runtime import NodeConfig, open_node


@pytest.mark.parametrize("psk", [False, True])
def test_create_add_load(tmp_path: Path, psk: bool) -> None:
    made = fleet.init_fleet(tmp_path / "f", psk=psk, name="lab")
    assert (made.name, made.mode) == ("lab", "psk" if psk else "cert")
    ident = fleet.add_node(tmp_path / "f", str(tmp_path / "a"), name="alpha")
    loaded, fl = fleet.load_node(tmp_path / "a")
    assert loaded.node_id == ident.node_id
    assert fl.fleet_id == made.fleet_id == fleet.load_fleet(tmp_path / "a").fleet_id
    info = fleet.node_info(tmp_path / "a")
    assert info.node_id == ident.node_id
    assert info.hex_id == f"{ident.node_id:016x}"
    assert (info.fleet_name, info.mode) == ("lab", made.mode)
    assert info.name == (None if psk else "alpha")
    for secret in ("node.key", "fleet.psk" if psk else "node.cert"):
        assert (tmp_path / "a" / secret).stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "a").stat().st_mode & 0o777 == 0o700
    with pytest.raises(fleet.FleetError, match="already holds a fleet"):
        fleet.init_fleet(tmp_path / "f")


def test_renew_keeps_id_and_name_and_extends(tmp_path: Path) -> None:
    fleet.init_fleet(tmp_path / "f")
    first = fleet.add_node(tmp_path / "f", tmp_path / "n", name="sensor-1", valid_days=1)
    left = fleet.expires_in(tmp_path / "n")
    assert left is not None
    assert 0 < left <= 86400
    renewed = fleet.renew(tmp_path / "f", tmp_path / "n", valid_days=30)
    assert renewed.node_id == first.node_id
    assert renewed.certificate is not None
    assert renewed.certificate.name == "sensor-1"
    left = fleet.expires_in(tmp_path / "n")
    assert left is not None
    assert 29 * 86400 < left <= 30 * 86400
    later = fleet.expires_in(tmp_path / "n", now=time.time() + 31 * 86400)
    assert later is not None
    assert later < 0
    with pytest.raises(fleet.FleetError, match="no such directory"):
        fleet.renew(tmp_path / "f", tmp_path / "new")


def test_renew_psk_and_expires_in_psk(tmp_path: Path) -> None:
    fleet.init_fleet(tmp_path / "f", psk=True)
    ident = fleet.add_node(tmp_path / "f", tmp_path / "n")
    assert fleet.renew(tmp_path / "f", tmp_path / "n").node_id == ident.node_id
    assert fleet.expires_in(tmp_path / "n") is None


@pytest.mark.parametrize("psk", [False, True])
def test_revoke_accumulates(tmp_path: Path, psk: bool) -> None:
    fleet.init_fleet(tmp_path / "f", psk=psk)
    a = fleet.add_node(tmp_path / "f", tmp_path / "a")
    b = fleet.add_node(tmp_path / "f", tmp_path / "b")
    first = fleet.revoke(tmp_path / "f", [tmp_path / "b"], to=[tmp_path / "a"])
    assert first.serial == 1
    assert first.nodes == {b.node_id}
    assert fleet.revoked(tmp_path / "a") == {b.node_id}
    second = fleet.revoke(tmp_path / "f", [f"{123:016x}", 7])
    assert second.serial == 2
    assert second.nodes == {b.node_id, 123, 7}
    assert fleet.revoked(tmp_path / "f") == second.nodes
    assert fleet.revoked(tmp_path / "a") == {b.node_id}  # not copied there this time
    assert a.node_id not in second.nodes
    with pytest.raises(fleet.FleetError, match="neither a node id"):
        fleet.revoke(tmp_path / "f", ["zz"])
    with pytest.raises(fleet.FleetError, match="does not fit 64 bits"):
        fleet.revoke(tmp_path / "f", [1 << 64])
    with pytest.raises(fleet.FleetError, match="no node given"):
        fleet.revoke(tmp_path / "f", [])


def _corrupt(path: Path) -> Path:
    path.write_bytes(b"\x00garbage")
    return path


def _another_fleet(t: Path) -> Path:
    fleet.init_fleet(t / "g")
    return t / "g"


def _expired(t: Path) -> object:
    fleet.add_node(t / "f", t / "old", valid_days=1e-6)
    time.sleep(0.2)
    return fleet.load_node(t / "old")


def _open(t: Path) -> object:
    os.chmod(t / "a" / "node.key", 0o644)
    return fleet.load_node(t / "a")


MISTAKES: dict[str, tuple[Callable[[Path], object], str]] = {
    "add to a missing fleet": (
        lambda t: fleet.add_node(t / "nope", t / "x"),
        "nope: no such directory",
    ),
    "add with a node directory as the fleet": (
        lambda t: fleet.add_node(t / "a", t / "x"),
        "is a node directory, not a fleet directory",
    ),
    "load a fleet directory as a node": (
        lambda t: fleet.load_node(t / "f"),
        "is a fleet directory, not a node directory",
    ),
    "load a file": (lambda t: fleet.load_node(t / "file"), "not a directory"),
    "load an empty directory": (lambda t: fleet.load_node(t / "empty"), "node.key missing"),
    "init over a file": (lambda t: fleet.init_fleet(t / "file"), "not a directory"),
    "corrupt fleet description": (
        lambda t: fleet.load_node(_corrupt(t / "a" / "fleet.cbor").parent),
        "fleet.cbor: corrupt fleet description",
    ),
    "corrupt node key": (
        lambda t: fleet.load_node(_corrupt(t / "a" / "node.key").parent),
        "node.key: corrupt or encrypted private key",
    ),
    "corrupt certificate": (
        lambda t: fleet.load_node(_corrupt(t / "a" / "node.cert").parent),
        "node.cert: ",
    ),
    "key readable by others": (_open, "permissions 0644 are too open"),
    "corrupt fleet key": (
        lambda t: fleet.add_node(_corrupt(t / "f" / "fleet.key").parent, t / "x"),
        "fleet.key: corrupt",
    ),
    "node of another fleet": (
        lambda t: fleet.add_node(_another_fleet(t), t / "a"),
        "already belongs to fleet",
    ),
    "corrupt revocation list": (
        lambda t: fleet.revoked(_corrupt(t / "f" / "revoked.cbor").parent),
        "revoked.cbor: ",
    ),
    "expired certificate": (_expired, "expired at"),
}


@pytest.mark.parametrize("case", sorted(MISTAKES))
def test_mistakes_are_one_line_errors(tmp_path: Path, case: str) -> None:
    fleet.init_fleet(tmp_path / "f")
    fleet.add_node(tmp_path / "f", tmp_path / "a")
    (tmp_path / "file").write_text("x")
    (tmp_path / "empty").mkdir()
    action, fragment = MISTAKES[case]
    with pytest.raises(fleet.FleetError) as caught:
        action(tmp_path)
    message = str(caught.value)
    assert fragment in message
    assert "\n" not in message
    assert isinstance(caught.value, P2PError)
    assert caught.value.__cause__ is None  # no chained traceback for a user's mistake


def test_a_loaded_pair_starts_a_node(tmp_path: Path) -> None:
    """What ``load_node`` returns is what ``open_node`` takes in place of a directory."""
    fleet.init_fleet(tmp_path / "f", psk=True)
    fleet.add_node(tmp_path / "f", tmp_path / "a")
    pair = fleet.load_node(tmp_path / "a")

    async def main() -> int:
        async with open_node(pair, NodeConfig(discovery=False)) as node:
            return node.id

    assert trio.run(main) == pair[0].node_id


def test_the_cli_and_the_api_agree(tmp_path: Path) -> None:
    """A fleet made by ``p2p fleet`` loads here and the reverse (one on-disk format)."""
    from p2p.cli import main

    assert main(["fleet", "init", str(tmp_path / "f")]) == 0
    assert main(["fleet", "add-node", str(tmp_path / "f"), str(tmp_path / "a")]) == 0
    info = fleet.node_info(tmp_path / "a")
    fleet.add_node(tmp_path / "f", tmp_path / "b")
    assert main(["fleet", "revoke", str(tmp_path / "f"), str(tmp_path / "b")]) == 0
    assert fleet.revoked(tmp_path / "f") == {fleet.node_info(tmp_path / "b").node_id}
    assert fleet.revoke(tmp_path / "f", [info.node_id]).serial == 2

"""Fleet security: identities, the sans-IO secure channel, signed discovery records, CLI.

Real cryptography throughout, no mocks.
"""

from __future__ import annotations

import contextlib
import doctest
import hashlib
import os
import stat
import subprocess
import sys
from pathlib import Path

import cbor2
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import p2p._secure
from p2p._errors import (
    AuthenticationError,
    ForgedRecordError,
    HandshakeError,
    IdentityError,
    P2PError,
    ReplayError,
    SecurityError,
)
from p2p._identity import (
    Certificate,
    Fleet,
    FleetAuthority,
    NodeIdentity,
    add_node,
    init_fleet,
    issue_certificate,
    load_fleet,
    load_fleet_authority,
    load_node,
    load_or_create_identity,
    node_id_of,
    raw_public,
    verify_certificate,
)
from p2p._secure import SecureSession, sign_record, verify_record
from p2p.cli import main

# --------------------------------------------------------------------------- helpers


def cert_fleet() -> FleetAuthority:
    """An in-memory cert-mode fleet (its authority)."""
    key = Ed25519PrivateKey.generate()
    return FleetAuthority(Fleet("cert", "test", public_key=raw_public(key)), key)


def member(authority: FleetAuthority, name: str = "n") -> NodeIdentity:
    ident = NodeIdentity.generate()
    return NodeIdentity(ident.private_key, issue_certificate(authority, ident.public_key, name))


def psk_fleet(psk: bytes | None = None) -> Fleet:
    return Fleet("psk", "quick", psk=psk or os.urandom(32))


def handshake(
    a: NodeIdentity, fa: Fleet, b: NodeIdentity, fb: Fleet
) -> tuple[SecureSession, SecureSession]:
    """Run the three-message handshake; raises whatever a side raises."""
    ini, res = SecureSession.initiator(a, fa), SecureSession.responder(b, fb)
    assert res.start() == b""
    msg2, done = res.receive_handshake(ini.start())
    assert not done
    msg3, done = ini.receive_handshake(msg2)
    assert done
    out, done = res.receive_handshake(msg3)
    assert (out, done) == (b"", True)
    return ini, res


def cert_pair() -> tuple[SecureSession, SecureSession]:
    auth = cert_fleet()
    return handshake(member(auth, "a"), auth.fleet, member(auth, "b"), auth.fleet)


# --------------------------------------------------------------------------- handshake


def test_cert_handshake_both_learn_ids_and_talk() -> None:
    auth = cert_fleet()
    a, b = member(auth, "alpha"), member(auth, "beta")
    ini, res = handshake(a, auth.fleet, b, auth.fleet)
    assert ini.peer_id == b.node_id
    assert res.peer_id == a.node_id
    assert ini.peer_name == "beta"
    assert res.peer_name == "alpha"
    assert res.open(ini.seal(b"ping")) == b"ping"
    assert ini.open(res.seal(b"pong")) == b"pong"
    assert res.open(ini.seal(b"")) == b""


def test_psk_handshake_both_learn_ids() -> None:
    fleet = psk_fleet()
    a, b = NodeIdentity.generate(), NodeIdentity.generate()
    ini, res = handshake(a, fleet, b, fleet)
    assert (ini.peer_id, res.peer_id) == (b.node_id, a.node_id)
    assert ini.peer_name is None
    for i in range(5):
        assert res.open(ini.seal(b"x%d" % i)) == b"x%d" % i


def test_node_id_derives_from_public_key() -> None:
    ident = NodeIdentity.generate()
    digest = hashlib.sha256(ident.public_key).digest()
    assert ident.node_id == node_id_of(ident.public_key) == int.from_bytes(digest[:8], "big")


def test_other_fleet_cannot_join_either_way() -> None:
    ours, theirs = cert_fleet(), cert_fleet()
    me, stranger = member(ours), member(theirs)
    # A stranger dialling us is stopped at msg1 (fleet id) ...
    with pytest.raises(HandshakeError, match="another fleet"):
        handshake(stranger, theirs.fleet, me, ours.fleet)
    # ... and one that claims our fleet id is stopped by the certificate check.
    with pytest.raises(HandshakeError, match=r"another fleet|fleet key"):
        handshake(stranger, ours.fleet, me, ours.fleet)
    with pytest.raises(HandshakeError):
        handshake(me, ours.fleet, stranger, ours.fleet)


def test_self_signed_certificate_is_rejected() -> None:
    auth = cert_fleet()
    me = member(auth)
    rogue = NodeIdentity.generate()
    # A certificate with our fleet's id, signed by the rogue's own key.
    forged_auth = FleetAuthority(auth.fleet, rogue.private_key)
    rogue = NodeIdentity(rogue.private_key, issue_certificate(forged_auth, rogue.public_key, "r"))
    with pytest.raises(HandshakeError, match="does not verify"):
        handshake(rogue, auth.fleet, me, auth.fleet)
    with pytest.raises(HandshakeError, match="does not verify"):
        handshake(me, auth.fleet, rogue, auth.fleet)


def test_stolen_certificate_without_its_key_is_rejected() -> None:
    auth = cert_fleet()
    victim, me = member(auth, "victim"), member(auth)
    thief = NodeIdentity(NodeIdentity.generate().private_key)
    # Bypass the constructor check: the thief presents the victim's certificate.
    object.__setattr__(thief, "certificate", victim.certificate)
    with pytest.raises(HandshakeError, match="another key"):
        handshake(thief, auth.fleet, me, auth.fleet)


def test_wrong_psk_fails_both_ways() -> None:
    right, wrong = psk_fleet(), psk_fleet()
    a, b = NodeIdentity.generate(), NodeIdentity.generate()
    with pytest.raises(HandshakeError, match="another fleet"):
        handshake(a, wrong, b, right)
    # An attacker copying our fleet id still lacks the psk: msg2 does not decrypt.
    spoof = SecureSession.initiator(a, right)
    victim = SecureSession.responder(b, wrong)
    victim.start()
    hello = cbor2.loads(spoof.start())
    hello[2] = wrong.fleet_id
    msg2, _ = victim.receive_handshake(cbor2.dumps(hello))
    with pytest.raises(HandshakeError, match="authentication"):
        spoof.receive_handshake(msg2)


def test_failed_session_stays_failed() -> None:
    res = SecureSession.responder(NodeIdentity.generate(), psk_fleet())
    res.start()
    with pytest.raises(HandshakeError):
        res.receive_handshake(b"junk")
    with pytest.raises(HandshakeError):
        res.receive_handshake(b"junk")
    with pytest.raises(HandshakeError, match="failed"):
        res.seal(b"x")
    with pytest.raises(HandshakeError):
        _ = res.peer_id


def test_seal_before_handshake_and_cert_mode_without_certificate() -> None:
    auth = cert_fleet()
    ini = SecureSession.initiator(member(auth), auth.fleet)
    with pytest.raises(HandshakeError, match="cannot seal"):
        ini.seal(b"x")
    with pytest.raises(HandshakeError, match="no certificate"):
        SecureSession.initiator(NodeIdentity.generate(), auth.fleet)


def test_tampered_handshake_message_fails() -> None:
    auth = cert_fleet()
    ini = SecureSession.initiator(member(auth), auth.fleet)
    res = SecureSession.responder(member(auth), auth.fleet)
    res.start()
    msg2, _ = res.receive_handshake(ini.start())
    bad = bytearray(msg2)
    bad[-5] ^= 1
    with pytest.raises(HandshakeError):
        ini.receive_handshake(bytes(bad))


# --------------------------------------------------------------------------- records


def test_every_tampered_byte_fails_open() -> None:
    ini, res = cert_pair()
    record = ini.seal(b"sensor reading 42")
    assert res.open(record) == b"sensor reading 42"
    for i in range(len(record)):
        ini, res = cert_pair()  # a failed open ends its session, so one pair per byte
        bad = bytearray(ini.seal(b"sensor reading 42"))
        bad[i] ^= 0x40
        with pytest.raises(AuthenticationError):  # ReplayError when the counter is hit
            res.open(bytes(bad))


def test_truncated_or_empty_record_fails() -> None:
    for cut in (0, 5, 23):
        ini, res = cert_pair()
        with pytest.raises(AuthenticationError):
            res.open(ini.seal(b"hello")[:cut])


def test_replayed_record_fails() -> None:
    ini, res = cert_pair()
    record = ini.seal(b"once")
    assert res.open(record) == b"once"
    with pytest.raises(ReplayError, match="replayed"):
        res.open(record)
    with pytest.raises(HandshakeError, match="failed"):
        res.open(ini.seal(b"after"))  # a failed session is closed for good


def test_reordered_and_dropped_records_fail() -> None:
    ini, res = cert_pair()
    ini.seal(b"1")
    with pytest.raises(ReplayError, match="out of order"):
        res.open(ini.seal(b"2"))
    ini, res = cert_pair()
    ini.seal(b"lost")
    with pytest.raises(ReplayError):
        res.open(ini.seal(b"next"))


def test_record_reflected_to_its_sender_fails() -> None:
    ini, _res = cert_pair()
    with pytest.raises(AuthenticationError):
        ini.open(ini.seal(b"echo"))  # each direction has its own key


def test_record_from_another_session_fails() -> None:
    ini1, _ = cert_pair()
    _, res2 = cert_pair()
    with pytest.raises(AuthenticationError):
        res2.open(ini1.seal(b"cross"))


# --------------------------------------------------------------------------- discovery


def test_discovery_record_round_trip_cert_and_psk() -> None:
    auth = cert_fleet()
    node = member(auth, "cam-1")
    rec = verify_record(auth.fleet, sign_record(node, {"host": "10.0.0.7", "port": 7400, "v": 2}))
    assert (rec.node_id, rec.host, rec.port, rec.name) == (node.node_id, "10.0.0.7", 7400, "cam-1")
    assert rec.public_key == node.public_key
    assert rec.extra == {"v": 2}
    fleet = psk_fleet()
    plain = NodeIdentity.generate()
    rec = verify_record(fleet, sign_record(plain, {"host": "h", "port": 1}, fleet))
    assert rec.node_id == plain.node_id
    assert rec.name is None


def test_tampered_discovery_record_rejected() -> None:
    auth = cert_fleet()
    data = sign_record(member(auth), {"host": "10.0.0.7", "port": 7400})
    for i in range(len(data)):
        bad = bytearray(data)
        bad[i] ^= 0x01
        with pytest.raises(ForgedRecordError):
            verify_record(auth.fleet, bytes(bad))


def test_redirecting_record_rejected() -> None:
    """A stranger rewrites host/port and re-encodes the body: the signature breaks."""
    auth = cert_fleet()
    outer = cbor2.loads(sign_record(member(auth), {"host": "10.0.0.7", "port": 7400}))
    body = cbor2.loads(outer[1])
    body["host"] = "6.6.6.6"
    outer[1] = cbor2.dumps(body)
    with pytest.raises(ForgedRecordError, match="signature"):
        verify_record(auth.fleet, cbor2.dumps(outer))


def test_forged_discovery_records_rejected() -> None:
    auth, other = cert_fleet(), cert_fleet()
    # Signed by a member of another fleet.
    with pytest.raises(ForgedRecordError, match="another fleet"):
        verify_record(auth.fleet, sign_record(member(other), {"host": "h", "port": 1}))
    # Self-signed certificate claiming our fleet.
    rogue = NodeIdentity.generate()
    fake = issue_certificate(FleetAuthority(auth.fleet, rogue.private_key), rogue.public_key, "r")
    with pytest.raises(ForgedRecordError, match="does not verify"):
        verify_record(
            auth.fleet, sign_record(NodeIdentity(rogue.private_key, fake), {"host": "h", "port": 1})
        )
    # A member's certificate on a record signed by another key.
    victim, thief = member(auth), NodeIdentity.generate()
    outer = cbor2.loads(sign_record(member(auth), {"host": "h", "port": 1}))
    thief_rec = cbor2.loads(sign_record(thief, {"host": "h", "port": 1}, psk_fleet()))
    assert victim.certificate is not None
    forged = [1, thief_rec[1], victim.certificate.encode(), thief_rec[3], None]
    with pytest.raises(ForgedRecordError, match="another key"):
        verify_record(auth.fleet, cbor2.dumps(forged))
    # PSK mode: no MAC, or a MAC under another psk.
    fleet = psk_fleet()
    with pytest.raises(ForgedRecordError, match="MAC"):
        verify_record(fleet, sign_record(thief, {"host": "h", "port": 1}, psk_fleet()))
    outer[4] = None
    with pytest.raises(ForgedRecordError):
        verify_record(fleet, cbor2.dumps(outer))
    # Garbage.
    for junk in (b"", b"\xff", cbor2.dumps([1, 2, 3]), os.urandom(2000)):
        with pytest.raises(ForgedRecordError):
            verify_record(auth.fleet, junk)


def test_stale_discovery_record_rejected_with_max_age() -> None:
    auth = cert_fleet()
    data = sign_record(member(auth), {"host": "h", "port": 1, "t": 1000})
    assert verify_record(auth.fleet, data, now=1010, max_age=60).issued_at == 1000
    with pytest.raises(ForgedRecordError, match="ago"):
        verify_record(auth.fleet, data, now=5000, max_age=60)


def test_sign_record_validates_fields() -> None:
    auth = cert_fleet()
    node = member(auth)
    for fields in ({"port": 1}, {"host": "h", "port": 0}, {"host": "h", "port": 1, "x": 1.5}):
        with pytest.raises(SecurityError):
            sign_record(node, fields)
    with pytest.raises(SecurityError, match="psk"):
        sign_record(NodeIdentity.generate(), {"host": "h", "port": 1})


# --------------------------------------------------------------------------- fuzzing


_AUTH = cert_fleet()
_A, _B = member(_AUTH, "a"), member(_AUTH, "b")
_A_CERT = _A.certificate.encode() if _A.certificate else b""


def _valid_messages() -> tuple[bytes, bytes, bytes]:
    ini = SecureSession.initiator(_A, _AUTH.fleet)
    res = SecureSession.responder(_B, _AUTH.fleet)
    res.start()
    msg1 = ini.start()
    msg2, _ = res.receive_handshake(msg1)
    msg3, _ = ini.receive_handshake(msg2)
    return msg1, msg2, msg3


_MSGS = _valid_messages()


def _mutate(data: bytes, edits: list[tuple[int, int, int]]) -> bytes:
    """Apply (kind, position, byte) edits: 0 flip, 1 insert, 2 delete."""
    out = bytearray(data)
    for kind, pos, byte in edits:
        if not out:
            break
        pos %= len(out)
        if kind == 0:
            out[pos] ^= byte or 1
        elif kind == 1:
            out.insert(pos, byte)
        else:
            del out[pos]
    return bytes(out)


_EDITS = st.lists(
    st.tuples(st.integers(0, 2), st.integers(0, 1 << 16), st.integers(0, 255)), max_size=4
)
_CBORISH = st.recursive(
    st.none() | st.booleans() | st.integers() | st.binary(max_size=40) | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=5),
    max_leaves=10,
)


def _feed_responder(messages: list[bytes]) -> None:
    res = SecureSession.responder(_B, _AUTH.fleet)
    res.start()
    for m in messages:
        try:
            res.receive_handshake(m)
        except SecurityError:
            return


@settings(suppress_health_check=[HealthCheck.too_slow])
@given(
    step=st.integers(0, 2),
    edits=_EDITS,
    junk=st.binary(max_size=300),
    obj=_CBORISH,
    which=st.integers(0, 2),
)
def test_responder_only_raises_security_errors(
    step: int, edits: list[tuple[int, int, int]], junk: bytes, obj: object, which: int
) -> None:
    msg1, _, msg3 = _MSGS
    candidate = (junk, cbor2.dumps(obj), _mutate(msg1 if step < 2 else msg3, edits))[which]
    # Hostile bytes as the first message, or as msg3 after a valid msg1 ...
    _feed_responder([candidate])
    _feed_responder([msg1, candidate])
    # ... and at an initiator awaiting msg2.
    ini = SecureSession.initiator(_A, _AUTH.fleet)
    ini.start()
    with contextlib.suppress(SecurityError):
        ini.receive_handshake(_mutate(_MSGS[1], edits) if which == 2 else candidate)


class _EvilSession(SecureSession):
    """A peer that runs the key schedule honestly but sends an arbitrary identity payload."""

    payload = b""

    def _own_proof(self, role: bytes, th: bytes) -> bytes:
        return self.payload


_PAYLOADS = st.binary(max_size=200) | st.builds(
    lambda pk, cert, sig: cbor2.dumps([pk, cert, sig]),
    st.binary(min_size=31, max_size=33) | _CBORISH,
    st.none() | st.binary(max_size=200) | st.just(_A_CERT),
    st.binary(min_size=63, max_size=65) | _CBORISH,
)


@given(payload=_PAYLOADS)
def test_decrypted_hostile_payloads_only_raise_security_errors(payload: bytes) -> None:
    """Fuzz past the AEAD: the payload parser and membership checks see hostile input."""
    evil_res = _EvilSession.responder(_B, _AUTH.fleet)
    evil_res.payload = payload
    ini = SecureSession.initiator(_A, _AUTH.fleet)
    evil_res.start()
    msg2, _ = evil_res.receive_handshake(ini.start())
    with pytest.raises(HandshakeError):
        ini.receive_handshake(msg2)
    evil_ini = _EvilSession.initiator(_A, _AUTH.fleet)
    evil_ini.payload = payload
    res = SecureSession.responder(_B, _AUTH.fleet)
    res.start()
    msg2, _ = res.receive_handshake(evil_ini.start())
    msg3, _ = evil_ini.receive_handshake(msg2)
    with pytest.raises(HandshakeError):
        res.receive_handshake(msg3)


@given(edits=_EDITS, junk=st.binary(max_size=200))
def test_discovery_verifier_only_raises_forged_record(
    edits: list[tuple[int, int, int]], junk: bytes
) -> None:
    good = sign_record(_A, {"host": "10.1.1.1", "port": 9})
    for data in (junk, _mutate(good, edits)):
        try:
            rec = verify_record(_AUTH.fleet, data)
        except ForgedRecordError:
            continue
        assert rec.node_id == _A.node_id  # anything accepted is genuinely _A's


# --------------------------------------------------------------------------- identity files


def test_identity_created_on_first_use_with_private_modes(tmp_path: Path) -> None:
    node_dir = tmp_path / "new" / "node"
    key = load_or_create_identity(node_dir)
    assert stat.S_IMODE((node_dir / "node.key").stat().st_mode) == 0o600
    assert stat.S_IMODE(node_dir.stat().st_mode) == 0o700
    again = load_or_create_identity(node_dir)
    assert NodeIdentity(key).node_id == NodeIdentity(again).node_id


def test_loading_refuses_open_permissions_and_corruption(tmp_path: Path) -> None:
    init_fleet(tmp_path / "f")
    add_node(tmp_path / "f", tmp_path / "n")
    (tmp_path / "n" / "node.key").chmod(0o640)
    with pytest.raises(IdentityError, match="too open"):
        load_node(tmp_path / "n")
    (tmp_path / "n" / "node.key").chmod(0o600)
    (tmp_path / "n" / "node.key").write_bytes(b"not a key")
    with pytest.raises(IdentityError, match="corrupt"):
        load_node(tmp_path / "n")
    (tmp_path / "n" / "node.key").unlink()
    with pytest.raises(IdentityError, match="missing"):
        load_node(tmp_path / "n")
    (tmp_path / "f" / "fleet.cbor").write_bytes(b"\xa1garbage")
    with pytest.raises(IdentityError, match="corrupt"):
        load_fleet(tmp_path / "f")


def test_certificate_of_another_fleet_refused_on_load(tmp_path: Path) -> None:
    init_fleet(tmp_path / "f1")
    init_fleet(tmp_path / "f2")
    add_node(tmp_path / "f1", tmp_path / "n")
    with pytest.raises(IdentityError, match="already belongs"):
        add_node(tmp_path / "f2", tmp_path / "n")
    # Swapping in the other fleet's description makes the certificate fail to verify.
    (tmp_path / "n" / "fleet.cbor").write_bytes((tmp_path / "f2" / "fleet.cbor").read_bytes())
    with pytest.raises(IdentityError, match="another fleet"):
        load_node(tmp_path / "n")


def test_init_refuses_to_overwrite(tmp_path: Path) -> None:
    init_fleet(tmp_path / "f")
    with pytest.raises(IdentityError, match="refusing"):
        init_fleet(tmp_path / "f", psk=True)


def test_nodes_loaded_from_disk_handshake(tmp_path: Path) -> None:
    for psk in (False, True):
        fdir = tmp_path / f"fleet-{psk}"
        init_fleet(fdir, psk=psk)
        add_node(fdir, tmp_path / f"a{psk}")
        add_node(fdir, tmp_path / f"b{psk}")
        a_id, a_fleet = load_node(tmp_path / f"a{psk}")
        b_id, b_fleet = load_node(tmp_path / f"b{psk}")
        ini, res = handshake(a_id, a_fleet, b_id, b_fleet)
        assert (ini.peer_id, res.peer_id) == (b_id.node_id, a_id.node_id)
        assert load_fleet_authority(fdir).fleet == a_fleet


# --------------------------------------------------------------------------- CLI


def _modes(directory: Path) -> dict[str, int]:
    return {p.name: stat.S_IMODE(p.stat().st_mode) for p in directory.iterdir()}


def test_cli_fleet_init_add_node_show(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fdir, ndir = tmp_path / "fleet", tmp_path / "node"
    assert main(["fleet", "init", str(fdir)]) == 0
    assert main(["fleet", "add-node", str(fdir), str(ndir), "--name", "cam-1"]) == 0
    assert set(_modes(fdir).values()) == {0o600}
    assert set(_modes(ndir).values()) == {0o600}
    assert {"fleet.key", "fleet.cbor"} <= set(_modes(fdir))
    assert {"node.key", "node.cert", "fleet.cbor"} <= set(_modes(ndir))
    fleet = load_fleet(fdir)
    cert = Certificate.decode((ndir / "node.cert").read_bytes())
    verify_certificate(fleet, cert)
    assert cert.name == "cam-1"
    capsys.readouterr()
    assert main(["fleet", "show", str(ndir)]) == 0
    assert capsys.readouterr().out.split()[0] == f"{cert.node_id:016x}"


def test_cli_psk_fleet(tmp_path: Path) -> None:
    fdir, ndir = tmp_path / "fleet", tmp_path / "node"
    assert main(["fleet", "init", str(fdir), "--psk"]) == 0
    assert main(["fleet", "add-node", str(fdir), str(ndir)]) == 0
    assert set(_modes(ndir).values()) == {0o600}
    assert load_node(ndir)[1] == load_fleet(fdir)


def test_cli_add_node_missing_fleet_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["fleet", "add-node", str(tmp_path / "nope"), str(tmp_path / "n")]) == 2
    err = capsys.readouterr().err
    assert "nope" in err
    assert "no such directory" in err
    assert not (tmp_path / "n").exists()


def test_cli_subprocess_errors_are_p2p_errors(tmp_path: Path) -> None:
    assert issubclass(SecurityError, P2PError)
    proc = subprocess.run(
        [sys.executable, "-m", "p2p", "fleet", "show", str(tmp_path / "missing")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith("p2p: error:")
    assert "missing" in proc.stderr


def test_module_docstring_example_runs() -> None:
    result = doctest.testmod(p2p._secure)
    assert result.attempted > 0
    assert result.failed == 0

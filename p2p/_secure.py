"""A sans-IO secure channel between two fleet members, and signed discovery records.

No sockets, no trio, no clocks in the channel: the caller moves bytes (only
:func:`sign_record`/:func:`verify_record` read the wall clock, and only when
not given a time).  Every handshake
message and every record is one *message*; the transport frames them (e.g. a
4-byte length prefix) and must not pass more than :data:`MAX_HANDSHAKE_SIZE` /
:data:`MAX_RECORD_SIZE` bytes.  Any failure raises a
:class:`~p2p._errors.SecurityError` subclass and leaves the session *failed*
(every later call raises too): log it and close the connection.

Example (two sessions in one process)::

    >>> from p2p._identity import Fleet, NodeIdentity  # or: identity, fleet = load_node(DIR)
    >>> fleet = Fleet("psk", "demo", psk=bytes(32))
    >>> alice, bob = NodeIdentity.generate(), NodeIdentity.generate()
    >>> a = SecureSession.initiator(alice, fleet)
    >>> b = SecureSession.responder(bob, fleet)
    >>> msg1 = a.start(); _ = b.start()              # responder's start() is b""
    >>> msg2, done = b.receive_handshake(msg1)       # done is False
    >>> msg3, done = a.receive_handshake(msg2)       # done is True: a may seal
    >>> _, done = b.receive_handshake(msg3)          # done is True
    >>> b.open(a.seal(b"hello")), a.peer_id == bob.node_id
    (b'hello', True)
    >>> ad = sign_record(alice, {"host": "10.0.0.5", "port": 7400}, fleet)
    >>> verify_record(fleet, ad).node_id == alice.node_id    # check before dialling
    True

Handshake (three messages, CBOR arrays; ``H`` = SHA-256, ``||`` = concatenation)::

    msg1  I->R  [1, 1, fleet_id(16), e_i(32)]
    msg2  R->I  [1, 2, e_r(32), AEAD(k_r, nonce 0, payload_r, aad=th2)]
    msg3  I->R  [1, 3,          AEAD(k_i, nonce 0, payload_i, aad=th3)]

    payload = CBOR [public_key(32), certificate bytes | null, signature(64)]
    th2 = H(msg1 || e_r)      th3 = H(msg1 || msg2)      th4 = H(msg1 || msg2 || msg3)
    signature = Ed25519(identity, "p2p-hs-v1 <role>\\0" || th || H(public_key || cert))
    salt = fleet_id || psk (psk mode) or fleet_id (cert mode)
    k_r = HKDF(X25519(e_i, e_r), salt, "p2p-v1 hs r" || th2)   (k_i likewise with th3)
    k_i2r || k_r2i = HKDF(X25519(e_i, e_r), salt, "p2p-v1 app" || th4)

Membership: in cert mode the certificate must verify against the fleet key and
name the presented public key; in psk mode the psk is in the key schedule, so
a peer without it cannot produce or read msg2/msg3.  Both ways the signature
binds the identity key to this transcript, and the peer id is derived from it.

Record: ``counter(8, big-endian) || ChaCha20-Poly1305(key, nonce = 0(4) || counter,
plaintext, aad = counter)``.  Each direction has its own key and a counter that
starts at 0 and goes up by one per record; a record whose counter is not the
next expected one (replayed, reordered, dropped) raises :class:`ReplayError`.

Discovery record: CBOR ``[1, body, certificate | null, signature(64), mac(32) | null]``
where ``body`` is the CBOR map ``{"id", "pk", "host", "port", "t", ...extra}``,
``signature`` is the node key's over ``"p2p-disc-v1\\0" || body`` and, in psk
mode, ``mac`` is HMAC-SHA256 over the same bytes with a psk-derived key.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import time
from collections.abc import Container, Mapping
from dataclasses import astuple, dataclass
from typing import Any, ClassVar, Self

import cbor2
from cryptography.exceptions import InvalidSignature, InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from p2p._errors import (
    AuthenticationError,
    ForgedRecordError,
    HandshakeError,
    ReplayError,
    SecurityError,
)
from p2p._identity import (
    MAX_CERT_SIZE,
    Certificate,
    Fleet,
    NodeIdentity,
    decode_cbor,
    ed25519_public,
    node_id_of,
    verify_certificate,
)

__all__ = [
    "MAX_HANDSHAKE_SIZE",
    "MAX_PLAINTEXT",
    "MAX_RECORD_SIZE",
    "Finish",
    "Hello",
    "Proof",
    "Reply",
    "SecureSession",
    "VerifiedRecord",
    "sign_record",
    "verify_record",
]

MAX_HANDSHAKE_SIZE = 2048
MAX_PLAINTEXT = 1 << 20
_COUNTER = 8
_TAG = 16
MAX_RECORD_SIZE = _COUNTER + MAX_PLAINTEXT + _TAG
MAX_DISCOVERY_SIZE = 1200
_VERSION = 1
_HELLO, _REPLY, _FINISH = 1, 2, 3
_ZERO_NONCE = bytes(12)


class _State(enum.Enum):
    START = "start"
    WAIT_REPLY = "initiator awaits msg2"
    WAIT_HELLO = "responder awaits msg1"
    WAIT_FINISH = "responder awaits msg3"
    ESTABLISHED = "established"
    FAILED = "failed"


# --------------------------------------------------------------------------- key schedule


def _h(*parts: bytes) -> bytes:
    return hashlib.sha256(b"".join(parts)).digest()


def _kdf(shared: bytes, salt: bytes, label: bytes, th: bytes, length: int = 32) -> bytes:
    """HKDF-SHA256 of the DH secret; salt = fleet id (and psk), info = label and transcript."""
    hkdf = HKDF(algorithm=hashes.SHA256(), length=length, salt=salt, info=b"p2p-v1 " + label + th)
    return hkdf.derive(shared)


def _hs_context(role: bytes, th: bytes, public_key: bytes, cert: bytes | None) -> bytes:
    """What a handshake signature covers: role, transcript, and the identity it claims."""
    return b"p2p-hs-v1 " + role + b"\x00" + th + _h(public_key, cert or b"")


# --------------------------------------------------------------------------- messages


def _fields(data: bytes, kind: int, sizes: tuple[int | None, ...]) -> list[bytes]:
    """The byte-string fields of handshake message ``kind``, each of its exact size if given."""
    obj = decode_cbor(data, max_size=MAX_HANDSHAKE_SIZE, what="handshake", error=HandshakeError)
    if not (isinstance(obj, list) and len(obj) == 2 + len(sizes) and obj[:2] == [_VERSION, kind]):
        raise HandshakeError(f"expected handshake message {kind} (version {_VERSION})")
    fields = obj[2:]
    for value, size in zip(fields, sizes, strict=True):
        if not isinstance(value, bytes) or (size is not None and len(value) != size):
            raise HandshakeError(f"handshake message {kind}: malformed field")
    return fields


@dataclass(frozen=True)
class _Handshake:
    """A handshake message on the wire: ``[version, kind, field, ...]``, each field a
    byte string (of the exact size ``SIZES`` gives, where it gives one)."""

    KIND: ClassVar[int]
    SIZES: ClassVar[tuple[int | None, ...]]

    def encode(self) -> bytes:
        return cbor2.dumps([_VERSION, self.KIND, *astuple(self)])

    @classmethod
    def decode(cls, data: bytes) -> Self:
        return cls(*_fields(data, cls.KIND, cls.SIZES))


@dataclass(frozen=True)
class Hello(_Handshake):
    """msg1, initiator to responder: the fleet it wants, and its ephemeral X25519 key."""

    KIND = _HELLO
    SIZES = (16, 32)

    fleet_id: bytes
    ephemeral: bytes


@dataclass(frozen=True)
class Reply(_Handshake):
    """msg2, responder to initiator: its ephemeral key and its sealed :class:`Proof`."""

    KIND = _REPLY
    SIZES = (32, None)

    ephemeral: bytes
    sealed: bytes


@dataclass(frozen=True)
class Finish(_Handshake):
    """msg3, initiator to responder: its sealed :class:`Proof`."""

    KIND = _FINISH
    SIZES = (None,)

    sealed: bytes


@dataclass(frozen=True)
class Proof:
    """The sealed part of msg2/msg3: who I am, why I am a member, and that I hold the key."""

    public_key: bytes
    certificate: bytes | None
    signature: bytes

    def encode(self) -> bytes:
        return cbor2.dumps([self.public_key, self.certificate, self.signature])

    @classmethod
    def decode(cls, data: bytes) -> Proof:
        obj = decode_cbor(data, max_size=MAX_HANDSHAKE_SIZE, what="proof", error=HandshakeError)
        ok = (
            isinstance(obj, list)
            and len(obj) == 3
            and isinstance(obj[0], bytes)
            and len(obj[0]) == 32
            and (obj[1] is None or isinstance(obj[1], bytes))
            and isinstance(obj[2], bytes)
            and len(obj[2]) == 64
        )
        if not ok:
            raise HandshakeError("malformed identity proof")
        return cls(obj[0], obj[1], obj[2])


# --------------------------------------------------------------------------- session


class SecureSession:
    """One side of a mutually authenticated, encrypted channel (sans-IO).

    Invariants: ``seal``/``open`` work only once established; counters only
    move forward and a failed ``open`` does not move them (the session is
    failed instead); the peer id is known exactly when established.
    """

    def __init__(
        self,
        identity: NodeIdentity,
        fleet: Fleet,
        *,
        initiator: bool,
        revoked: Container[int] = frozenset(),
    ) -> None:
        if fleet.mode == "cert" and identity.certificate is None:
            raise HandshakeError("this node has no certificate for a cert-mode fleet")
        self._revoked = revoked
        """Node ids the fleet revoked (``p2p._revocation``): refused at the handshake."""
        self._identity = identity
        self._fleet = fleet
        self._initiator = initiator
        self._state = _State.START
        self._ephemeral = X25519PrivateKey.generate()
        self._e_pub = self._ephemeral.public_key().public_bytes_raw()
        self._salt = fleet.fleet_id + (fleet.psk or b"")
        self._transcript = b""
        self._shared = b""
        self._send: ChaCha20Poly1305 | None = None
        self._recv: ChaCha20Poly1305 | None = None
        self._send_counter = 0
        self._recv_counter = 0
        self._peer_public_key: bytes | None = None
        self._peer_certificate: Certificate | None = None

    @classmethod
    def initiator(
        cls, identity: NodeIdentity, fleet: Fleet, *, revoked: Container[int] = frozenset()
    ) -> Self:
        """The side that dialled: its :meth:`start` yields the first message."""
        return cls(identity, fleet, initiator=True, revoked=revoked)

    @classmethod
    def responder(
        cls, identity: NodeIdentity, fleet: Fleet, *, revoked: Container[int] = frozenset()
    ) -> Self:
        """The side that accepted: it speaks after the first message arrives."""
        return cls(identity, fleet, initiator=False, revoked=revoked)

    # ---- public state

    @property
    def established(self) -> bool:
        return self._state is _State.ESTABLISHED

    @property
    def peer_public_key(self) -> bytes:
        if self._peer_public_key is None or self._state is not _State.ESTABLISHED:
            raise HandshakeError("the handshake is not complete")
        return self._peer_public_key

    @property
    def peer_id(self) -> int:
        """The authenticated peer's 64-bit overlay id."""
        return node_id_of(self.peer_public_key)

    @property
    def peer_name(self) -> str | None:
        """The name in the peer's certificate (cert mode), else ``None``."""
        _ = self.peer_public_key
        return self._peer_certificate.name if self._peer_certificate else None

    # ---- handshake

    def start(self) -> bytes:
        """The first bytes to send: msg1 for an initiator, ``b""`` for a responder."""
        if self._state is not _State.START:
            raise self._fail(HandshakeError("start() called twice"))
        if not self._initiator:
            self._state = _State.WAIT_HELLO
            return b""
        msg1 = Hello(self._fleet.fleet_id, self._e_pub).encode()
        self._transcript = msg1
        self._state = _State.WAIT_REPLY
        return msg1

    def receive_handshake(self, data: bytes) -> tuple[bytes, bool]:
        """Consume one handshake message; return (bytes to send, maybe empty; established?)."""
        try:
            if self._state is _State.WAIT_HELLO:
                return self._on_hello(data), False
            if self._state is _State.WAIT_REPLY:
                return self._on_reply(data), True
            if self._state is _State.WAIT_FINISH:
                self._on_finish(data)
                return b"", True
            raise HandshakeError(f"unexpected handshake message in state {self._state.value}")
        except SecurityError as exc:
            raise self._fail(exc) from None

    def _on_hello(self, msg1: bytes) -> bytes:
        """Responder: check msg1, answer with msg2 (our encrypted, signed identity)."""
        hello = Hello.decode(msg1)
        if not hmac.compare_digest(hello.fleet_id, self._fleet.fleet_id):
            raise HandshakeError("peer belongs to another fleet (or has another psk)")
        self._shared = self._exchange(hello.ephemeral)
        th2 = _h(msg1, self._e_pub)
        sealed = self._seal_proof(b"hs r", b"responder", th2)
        msg2 = Reply(self._e_pub, sealed).encode()
        self._transcript = msg1 + msg2
        self._state = _State.WAIT_FINISH
        return msg2

    def _on_reply(self, msg2: bytes) -> bytes:
        """Initiator: authenticate the responder from msg2, answer with msg3, go live."""
        reply = Reply.decode(msg2)
        self._shared = self._exchange(reply.ephemeral)
        th2 = _h(self._transcript, reply.ephemeral)
        self._accept_peer(reply.sealed, b"hs r", b"responder", th2)
        self._transcript += msg2
        th3 = _h(self._transcript)
        msg3 = Finish(self._seal_proof(b"hs i", b"initiator", th3)).encode()
        self._transcript += msg3
        self._establish()
        return msg3

    def _on_finish(self, msg3: bytes) -> None:
        """Responder: authenticate the initiator from msg3, go live."""
        finish = Finish.decode(msg3)
        self._accept_peer(finish.sealed, b"hs i", b"initiator", _h(self._transcript))
        self._transcript += msg3
        self._establish()

    def _exchange(self, peer_ephemeral: bytes) -> bytes:
        """X25519 with the peer's ephemeral key; low-order points are rejected."""
        try:
            return self._ephemeral.exchange(X25519PublicKey.from_public_bytes(peer_ephemeral))
        except ValueError:
            raise HandshakeError("invalid ephemeral key") from None

    def _own_proof(self, role: bytes, th: bytes) -> bytes:
        """Our :class:`Proof` for transcript hash ``th`` (overridable by fuzz tests)."""
        cert = self._identity.certificate.encode() if self._identity.certificate else None
        pk = self._identity.public_key
        return Proof(pk, cert, self._identity.sign(_hs_context(role, th, pk, cert))).encode()

    def _seal_proof(self, label: bytes, role: bytes, th: bytes) -> bytes:
        key = _kdf(self._shared, self._salt, label, th)
        return ChaCha20Poly1305(key).encrypt(_ZERO_NONCE, self._own_proof(role, th), th)

    def _accept_peer(self, sealed: bytes, label: bytes, role: bytes, th: bytes) -> None:
        """Check the peer is a fleet member holding its identity key; remember it.

        A decryption failure means a tampered message or a peer without our psk.
        """
        key = _kdf(self._shared, self._salt, label, th)
        try:
            plain = ChaCha20Poly1305(key).decrypt(_ZERO_NONCE, sealed, th)
        except InvalidTag:
            raise HandshakeError(
                "handshake payload failed authentication (tampered, or not our fleet)"
            ) from None
        proof = Proof.decode(plain)
        public = ed25519_public(proof.public_key, HandshakeError, "peer identity")
        cert = self._check_membership(proof.public_key, proof.certificate)
        try:
            public.verify(
                proof.signature, _hs_context(role, th, proof.public_key, proof.certificate)
            )
        except InvalidSignature:
            raise HandshakeError("peer signature over the handshake does not verify") from None
        self._peer_public_key, self._peer_certificate = proof.public_key, cert

    def _check_membership(self, pk: bytes, cert_bytes: bytes | None) -> Certificate | None:
        if node_id_of(pk) in self._revoked:
            raise HandshakeError(f"peer {node_id_of(pk):016x} was revoked by the fleet")
        if self._fleet.mode == "psk":
            if cert_bytes is not None:
                raise HandshakeError("unexpected certificate in a psk fleet")
            return None  # the psk in the key schedule already proved membership
        if cert_bytes is None:
            raise HandshakeError("peer sent no certificate")
        cert = Certificate.decode(cert_bytes, HandshakeError)
        verify_certificate(self._fleet, cert, HandshakeError)
        if cert.node_public_key != pk:
            raise HandshakeError("peer certificate is for another key")
        return cert

    def _establish(self) -> None:
        keys = _kdf(self._shared, self._salt, b"app", _h(self._transcript), 64)
        i2r, r2i = ChaCha20Poly1305(keys[:32]), ChaCha20Poly1305(keys[32:])
        self._send, self._recv = (i2r, r2i) if self._initiator else (r2i, i2r)
        self._shared = b""  # handshake secrets are no longer needed
        self._state = _State.ESTABLISHED

    def _fail(self, exc: SecurityError) -> SecurityError:
        self._state = _State.FAILED
        self._send = self._recv = None
        return exc

    # ---- records

    def seal(self, plaintext: bytes) -> bytes:
        """Encrypt and authenticate one record for the peer (next send counter)."""
        if self._send is None:
            raise HandshakeError(f"cannot seal: session is {self._state.value}")
        if len(plaintext) > MAX_PLAINTEXT:
            raise SecurityError(f"record plaintext over {MAX_PLAINTEXT} bytes")
        if self._send_counter >= (1 << 64) - 1:
            raise self._fail(SecurityError("send counter exhausted; reconnect"))
        header = self._send_counter.to_bytes(_COUNTER, "big")
        self._send_counter += 1
        return header + self._send.encrypt(bytes(4) + header, bytes(plaintext), header)

    def open(self, record: bytes) -> bytes:
        """Authenticate and decrypt the peer's next record, or fail the session."""
        if self._recv is None:
            raise HandshakeError(f"cannot open: session is {self._state.value}")
        if not isinstance(record, bytes | bytearray) or not (
            _COUNTER + _TAG <= len(record) <= MAX_RECORD_SIZE
        ):
            raise self._fail(AuthenticationError("record has an impossible length"))
        header = bytes(record[:_COUNTER])
        counter = int.from_bytes(header, "big")
        if counter != self._recv_counter:
            kind = "replayed" if counter < self._recv_counter else "out of order"
            raise self._fail(
                ReplayError(f"{kind} record: counter {counter}, expected {self._recv_counter}")
            )
        try:
            plain = self._recv.decrypt(bytes(4) + header, bytes(record[_COUNTER:]), header)
        except InvalidTag:
            raise self._fail(
                AuthenticationError("record failed authentication (tampered)")
            ) from None
        self._recv_counter += 1
        return plain


# --------------------------------------------------------------------------- discovery records

_DISC_CONTEXT = b"p2p-disc-v1\x00"
_RESERVED = frozenset({"id", "pk", "host", "port", "t"})


@dataclass(frozen=True)
class VerifiedRecord:
    """A discovery record whose signature and fleet membership were checked."""

    node_id: int
    public_key: bytes
    host: str
    port: int
    issued_at: int
    name: str | None
    extra: Mapping[str, object]


def sign_record(
    identity: NodeIdentity, fields: Mapping[str, object], fleet: Fleet | None = None
) -> bytes:
    """A signed discovery record for ``fields`` (``host``, ``port``; optional ``t`` and extras).

    ``id``/``pk`` come from the identity; ``t`` defaults to now (whole seconds);
    extras must be str, int, bytes, bool or None.  A psk-mode node (no
    certificate) must pass ``fleet``: the record then carries the psk MAC
    without which no member accepts it.
    """
    if identity.certificate is None and (fleet is None or fleet.psk is None):
        raise SecurityError("a node without a certificate must pass its psk fleet to sign_record")
    body = _record_body(identity, fields)
    signed = _DISC_CONTEXT + body
    cert = identity.certificate.encode() if identity.certificate else None
    mac = None
    if fleet is not None and fleet.psk is not None:
        mac = hmac.new(fleet.mac_key(b"discovery"), signed, hashlib.sha256).digest()
    record = cbor2.dumps([_VERSION, body, cert, identity.sign(signed), mac])
    if len(record) > MAX_DISCOVERY_SIZE:
        raise SecurityError(f"discovery record over {MAX_DISCOVERY_SIZE} bytes")
    return record


def _record_body(identity: NodeIdentity, fields: Mapping[str, object]) -> bytes:
    host, port = fields.get("host"), fields.get("port")
    if not isinstance(host, str) or not 0 < len(host) <= 255:
        raise SecurityError("discovery record needs a host string")
    if not _is_port(port):
        raise SecurityError("discovery record needs a port in 1..65535")
    t = fields.get("t", int(time.time()))
    if not isinstance(t, int) or isinstance(t, bool):
        raise SecurityError("discovery record time 't' must be an int (seconds)")
    extra = {k: v for k, v in fields.items() if k not in _RESERVED}
    body: dict[str, object] = {
        "id": identity.node_id,
        "pk": identity.public_key,
        "host": host,
        "port": port,
        "t": t,
        **extra,
    }
    encoded = cbor2.dumps(body)
    # Round-trip through the verifier's decoder so a record we sign is one we accept.
    decode_cbor(encoded, max_size=MAX_DISCOVERY_SIZE, what="record fields", error=SecurityError)
    return encoded


def _is_port(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and 0 < x < 65536


def verify_record(
    fleet: Fleet, data: bytes, *, now: float | None = None, max_age: float | None = None
) -> VerifiedRecord:
    """Check a discovery record before dialling the node it names.

    Returns only if the record is well formed, signed by the key whose id it
    names, and that key is a fleet member (certificate in cert mode, psk MAC
    in psk mode); with ``max_age`` also if it is no older than that (and not
    from the future beyond the same margin).  Otherwise raises
    :class:`ForgedRecordError`.
    """
    obj = decode_cbor(
        data, max_size=MAX_DISCOVERY_SIZE, what="discovery record", error=ForgedRecordError
    )
    if not (isinstance(obj, list) and len(obj) == 5 and obj[0] == _VERSION):
        raise ForgedRecordError("discovery record: wrong shape")
    _, body_bytes, cert_bytes, signature, mac = obj
    if not isinstance(body_bytes, bytes) or not (
        isinstance(signature, bytes) and len(signature) == 64
    ):
        raise ForgedRecordError("discovery record: wrong shape")
    body = _parse_body(body_bytes)
    signed = _DISC_CONTEXT + body_bytes
    name = _record_membership(fleet, body["pk"], cert_bytes, mac, signed)
    try:
        ed25519_public(body["pk"], ForgedRecordError, "record key").verify(signature, signed)
    except InvalidSignature:
        raise ForgedRecordError("discovery record: signature does not verify") from None
    if max_age is not None:
        age = (time.time() if now is None else now) - body["t"]
        if not -max_age <= age <= max_age:
            raise ForgedRecordError(
                f"discovery record: issued {age:.0f} s ago, outside {max_age} s"
            )
    extra = {k: v for k, v in body.items() if k not in _RESERVED}
    return VerifiedRecord(
        body["id"], body["pk"], body["host"], body["port"], body["t"], name, extra
    )


def _parse_body(body_bytes: bytes) -> dict[str, Any]:
    body = decode_cbor(
        body_bytes, max_size=MAX_DISCOVERY_SIZE, what="record body", error=ForgedRecordError
    )
    if not isinstance(body, dict):
        raise ForgedRecordError("discovery record: body is not a map")
    ok = (
        isinstance(body.get("pk"), bytes)
        and len(body["pk"]) == 32
        and isinstance(body.get("host"), str)
        and _is_port(body.get("port"))
        and isinstance(body.get("t"), int)
        and not isinstance(body.get("t"), bool)
        and type(body.get("id")) is int
        and body["id"] == node_id_of(body["pk"])
    )
    if not ok:
        raise ForgedRecordError("discovery record: bad body (fields, types or id/key mismatch)")
    return body


def _record_membership(
    fleet: Fleet, pk: bytes, cert_bytes: object, mac: object, signed: bytes
) -> str | None:
    """Prove the record's key belongs to ``fleet``; return its certificate name if any."""
    if fleet.mode == "psk":
        expected = hmac.new(fleet.mac_key(b"discovery"), signed, hashlib.sha256).digest()
        if not (isinstance(mac, bytes) and hmac.compare_digest(mac, expected)):
            raise ForgedRecordError("discovery record: missing or wrong fleet MAC")
        return None
    if not isinstance(cert_bytes, bytes) or len(cert_bytes) > MAX_CERT_SIZE:
        raise ForgedRecordError("discovery record: no certificate")
    cert = Certificate.decode(cert_bytes, ForgedRecordError)
    verify_certificate(fleet, cert, ForgedRecordError)
    if cert.node_public_key != pk:
        raise ForgedRecordError("discovery record: certificate is for another key")
    return cert.name

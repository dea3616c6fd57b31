"""Node identities and fleets: keys, member certificates and their on-disk layout.

A *node* has an Ed25519 identity key; its 64-bit overlay id is the first 8
bytes (big-endian) of SHA-256 over the raw 32-byte public key, so an id can
never be claimed without the key.  A *fleet* is the set of nodes allowed to
talk, in one of two modes:

``cert``
    A fleet Ed25519 key signs a :class:`Certificate` for each member's public
    key.  Members hold only the fleet's *public* key and verify each other.
``psk``
    A 32-byte pre-shared key, for quick starts: knowing it is membership.
    Members hold the key itself (so every member can admit new members).

On-disk layout (every file 0600, every directory this module creates 0700)::

    FLEET_DIR/fleet.cbor   public fleet description {"v", "mode", "name", "key"?}
    FLEET_DIR/fleet.key    fleet signing key, PKCS#8 PEM          (cert mode)
    FLEET_DIR/fleet.psk    pre-shared key, 64 hex digits          (psk mode)
    NODE_DIR/node.key      node identity key, PKCS#8 PEM (created on first use)
    NODE_DIR/node.cert     the node's certificate, CBOR           (cert mode)
    NODE_DIR/fleet.cbor    copy of the fleet description
    NODE_DIR/fleet.psk     copy of the pre-shared key             (psk mode)
    NODE_DIR/node.lock     pid of the process running the node (``lock_identity``)

Secret files (``*.key``, ``*.psk``) that group or others can read are refused.
Every loader raises :class:`~p2p._errors.IdentityError` naming the file and the
reason; nothing here raises a bare ``OSError`` or ``ValueError``.
"""

from __future__ import annotations

import binascii
import contextlib
import errno
import fcntl
import hashlib
import hmac
import os
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import cbor2
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from p2p._errors import AuthenticationError, IdentityError, IdentityInUseError, SecurityError

__all__ = [
    "Certificate",
    "Fleet",
    "FleetAuthority",
    "NodeIdentity",
    "add_node",
    "decode_cbor",
    "init_fleet",
    "issue_certificate",
    "load_fleet",
    "load_fleet_authority",
    "load_node",
    "load_or_create_identity",
    "lock_identity",
    "node_id_of",
    "verify_certificate",
    "write_atomic",
]

FleetMode = Literal["cert", "psk"]

FLEET_FILE = "fleet.cbor"
FLEET_KEY_FILE = "fleet.key"
PSK_FILE = "fleet.psk"
NODE_KEY_FILE = "node.key"
NODE_CERT_FILE = "node.cert"
LOCK_FILE = "node.lock"

MAX_NAME = 64
MAX_CERT_SIZE = 512
_MAX_FILE = 4096
_CERT_CONTEXT = b"p2p-cert-v1\x00"


# --------------------------------------------------------------------------- encoding


def decode_cbor(data: bytes, *, max_size: int, what: str, error: type[SecurityError]) -> Any:
    """Decode ``data`` as one CBOR item of plain types, or raise ``error``.

    Invariant: the result re-encodes to exactly ``data`` (no trailing bytes, no
    alternative encodings, no semantic tags), so whatever was signed is what
    was read.  Callers still check the shape of the result.
    """
    if not isinstance(data, bytes | bytearray) or len(data) > max_size:
        raise error(f"{what}: not bytes or longer than {max_size} bytes")
    data = bytes(data)
    try:
        obj = cbor2.loads(data, max_depth=4, allow_indefinite=False, allow_duplicate_keys=False)
        canonical = cbor2.dumps(obj)
    except Exception as exc:  # cbor2 raises many types on hostile input
        raise error(f"{what}: malformed CBOR ({exc.__class__.__name__})") from None
    if canonical != data or not _plain(obj):
        raise error(f"{what}: non-canonical CBOR or unexpected types")
    return obj


def _plain(obj: object) -> bool:
    """True when ``obj`` holds only int, str, bytes, None, bool, list and str-keyed dict."""
    if obj is None or isinstance(obj, int | str | bytes):
        return True
    if isinstance(obj, list):
        return all(_plain(x) for x in obj)
    if isinstance(obj, dict):
        return all(isinstance(k, str) and _plain(v) for k, v in obj.items())
    return False


def node_id_of(public_key: bytes) -> int:
    """The 64-bit overlay id of a raw Ed25519 public key (first 8 bytes of its SHA-256)."""
    return int.from_bytes(hashlib.sha256(public_key).digest()[:8], "big")


def raw_public(key: Ed25519PrivateKey | Ed25519PublicKey) -> bytes:
    """The raw 32-byte encoding of an Ed25519 public key."""
    pub = key.public_key() if isinstance(key, Ed25519PrivateKey) else key
    return pub.public_bytes_raw()


def ed25519_public(raw: bytes, error: type[SecurityError], what: str) -> Ed25519PublicKey:
    """Parse a raw Ed25519 public key, raising ``error`` (never ``ValueError``)."""
    if not isinstance(raw, bytes) or len(raw) != 32:
        raise error(f"{what}: public key must be 32 bytes")
    try:
        return Ed25519PublicKey.from_public_bytes(raw)
    except ValueError:
        raise error(f"{what}: invalid Ed25519 public key") from None


# --------------------------------------------------------------------------- fleet


@dataclass(frozen=True)
class Fleet:
    """What a member needs to recognise other members.

    Invariant: ``public_key`` is set iff ``mode == "cert"``, ``psk`` (32 bytes)
    iff ``mode == "psk"``.  ``fleet_id`` (16 bytes) names the fleet on the wire;
    in psk mode it is a hash of the key, which does not reveal it.
    """

    mode: FleetMode
    name: str
    public_key: bytes | None = None
    psk: bytes | None = None

    def __post_init__(self) -> None:
        ok = (self.mode == "cert" and isinstance(self.public_key, bytes) and self.psk is None) or (
            self.mode == "psk" and isinstance(self.psk, bytes) and self.public_key is None
        )
        if not ok or len(self.public_key or self.psk or b"") != 32:
            raise IdentityError("a fleet has either a 32-byte public key or a 32-byte psk")

    @property
    def fleet_id(self) -> bytes:
        if self.mode == "cert":
            assert self.public_key is not None
            return hashlib.sha256(b"p2p-fleet-cert\x00" + self.public_key).digest()[:16]
        assert self.psk is not None
        return hashlib.sha256(b"p2p-fleet-psk\x00" + self.psk).digest()[:16]

    def describe(self) -> bytes:
        """The public ``fleet.cbor`` content (never contains the psk)."""
        desc: dict[str, object] = {"v": 1, "mode": self.mode, "name": self.name}
        if self.public_key is not None:
            desc["key"] = self.public_key
        return cbor2.dumps(desc)

    def mac_key(self, label: bytes) -> bytes:
        """A psk-derived key for ``label`` (psk mode only): keeps the raw psk single-use."""
        assert self.psk is not None
        return hmac.new(self.psk, b"p2p-v1 " + label, hashlib.sha256).digest()


@dataclass(frozen=True)
class FleetAuthority:
    """A fleet plus the secret that admits members (the signing key or the psk)."""

    fleet: Fleet
    signing_key: Ed25519PrivateKey | None = None


# --------------------------------------------------------------------------- certificates


@dataclass(frozen=True)
class Certificate:
    """A fleet's statement "``node_public_key`` (named ``name``) is a member
    until ``not_after``".

    Wire form: CBOR ``[2, fleet_id(16), node_public_key(32), name, issued_at,
    not_after, signature(64)]``; the signature is Ed25519 by the fleet key over
    ``"p2p-cert-v1\\0" || CBOR(the first six)``.  A version-1 certificate (no
    ``not_after``) still decodes, with ``not_after`` ``None``, and
    :func:`verify_certificate` refuses it: a certificate must end.
    """

    fleet_id: bytes
    node_public_key: bytes
    name: str
    issued_at: int
    signature: bytes
    not_after: int | None = None
    """Unix time after which the certificate is refused (``None``: a version-1 one)."""

    def _fields(self) -> list[object]:
        if self.not_after is None:
            return [1, self.fleet_id, self.node_public_key, self.name, self.issued_at]
        return [2, self.fleet_id, self.node_public_key, self.name, self.issued_at, self.not_after]

    def _signed_part(self) -> bytes:
        return _CERT_CONTEXT + cbor2.dumps(self._fields())

    def encode(self) -> bytes:
        return cbor2.dumps([*self._fields(), self.signature])

    @property
    def node_id(self) -> int:
        return node_id_of(self.node_public_key)

    @classmethod
    def decode(cls, data: bytes, error: type[SecurityError] = AuthenticationError) -> Certificate:
        """Parse a certificate's shape (not its signature: see :func:`verify_certificate`)."""
        obj = decode_cbor(data, max_size=MAX_CERT_SIZE, what="certificate", error=error)
        version = obj[0] if isinstance(obj, list) and obj else None
        shape_ok = (
            isinstance(obj, list)
            and (version, len(obj)) in ((1, 6), (2, 7))
            and _is_bytes(obj[1], 16)
            and _is_bytes(obj[2], 32)
            and isinstance(obj[3], str)
            and len(obj[3]) <= MAX_NAME
            and _is_uint(obj[4])
            and (version == 1 or _is_uint(obj[5]))
            and _is_bytes(obj[-1], 64)
        )
        if not shape_ok:
            raise error("certificate: wrong shape")
        not_after = obj[5] if version == 2 else None
        return cls(obj[1], obj[2], obj[3], obj[4], obj[-1], not_after)


def _is_bytes(x: object, n: int) -> bool:
    return isinstance(x, bytes) and len(x) == n


def _is_uint(x: object, limit: int = 1 << 63) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and 0 <= x < limit


DEFAULT_VALID_DAYS = 365
"""A certificate's default lifetime; renew by running ``p2p fleet add-node`` again."""


def issue_certificate(
    authority: FleetAuthority,
    node_public_key: bytes,
    name: str,
    *,
    valid_days: float = DEFAULT_VALID_DAYS,
    now: float | None = None,
) -> Certificate:
    """Sign a membership certificate valid for ``valid_days`` from ``now`` (cert-mode fleets)."""
    if authority.signing_key is None:
        raise IdentityError("a psk fleet issues no certificates")
    _check_name(name)
    if not 0 < valid_days <= 100 * 365:
        raise IdentityError(f"valid days must be in (0, 36500], got {valid_days}")
    issued = int(time.time() if now is None else now)
    not_after = issued + int(valid_days * 86400)
    fleet_id = authority.fleet.fleet_id
    unsigned = Certificate(fleet_id, node_public_key, name, issued, b"", not_after)
    sig = authority.signing_key.sign(unsigned._signed_part())
    return Certificate(fleet_id, node_public_key, name, issued, sig, not_after)


def verify_certificate(
    fleet: Fleet,
    cert: Certificate,
    error: type[SecurityError] = AuthenticationError,
    *,
    now: float | None = None,
) -> None:
    """Return only if ``fleet``'s key signed ``cert`` for this fleet and, at ``now``
    (default: the wall clock), it has not expired; else raise ``error``."""
    if fleet.public_key is None:
        raise error("certificate presented to a psk fleet")
    if not hmac.compare_digest(cert.fleet_id, fleet.fleet_id):
        raise error("certificate belongs to another fleet")
    if cert.not_after is None:
        raise error("certificate has no expiry (issued before 0.2): re-issue it with add-node")
    if (time.time() if now is None else now) > cert.not_after:
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(cert.not_after))
        raise error(f"certificate of {cert.name!r} expired at {when}: renew it with add-node")
    key = ed25519_public(fleet.public_key, error, "fleet key")
    try:
        key.verify(cert.signature, cert._signed_part())
    except InvalidSignature:
        raise error("certificate signature does not verify against the fleet key") from None


def _check_name(name: str) -> None:
    if not name or len(name) > MAX_NAME or not name.isprintable():
        raise IdentityError(f"name must be 1..{MAX_NAME} printable characters, got {name!r}")


# --------------------------------------------------------------------------- node identity


@dataclass(frozen=True)
class NodeIdentity:
    """A node's private identity key and (cert mode) its membership certificate.

    Invariant: when ``certificate`` is set it is for this key's public key.
    """

    private_key: Ed25519PrivateKey
    certificate: Certificate | None = None

    def __post_init__(self) -> None:
        if self.certificate is not None and self.certificate.node_public_key != self.public_key:
            raise IdentityError("certificate is for another key")

    @property
    def public_key(self) -> bytes:
        return raw_public(self.private_key)

    @property
    def node_id(self) -> int:
        return node_id_of(self.public_key)

    @classmethod
    def generate(cls) -> NodeIdentity:
        """A fresh, fleetless identity (tests, tools)."""
        return cls(Ed25519PrivateKey.generate())

    def sign(self, message: bytes) -> bytes:
        return self.private_key.sign(message)


# --------------------------------------------------------------------------- files


def _write_private(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` with mode 0600 from the first byte on, atomically.

    The temporary file is created 0600 with O_EXCL so the secret is never
    readable by others, and renamed so a crash leaves the old file or none.
    """
    tmp = path.with_name(f".{path.name}.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.fchmod(fd, 0o600)  # umask can only narrow; this pins the exact mode
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically (mode 0600, like everything here);
    :class:`IdentityError` naming the file on failure."""
    try:
        _write_private(path, data)
    except OSError as exc:
        raise IdentityError(f"{path}: cannot write ({exc.strerror})") from None


def _make_dir(path: Path) -> None:
    """Create ``path`` (and parents) with mode 0700; leave an existing directory alone."""
    if path.exists() and not path.is_dir():
        raise IdentityError(f"{path}: exists and is not a directory")
    if not path.exists():
        path.mkdir(parents=True, mode=0o700)
        path.chmod(0o700)


def _read(path: Path, *, secret: bool) -> bytes:
    """Read a small key file; refuse a secret one that group or others can read."""
    try:
        st = path.stat()
    except FileNotFoundError:
        raise IdentityError(f"{path}: missing") from None
    except OSError as exc:
        raise IdentityError(f"{path}: cannot read ({exc.strerror})") from None
    if not stat.S_ISREG(st.st_mode):
        raise IdentityError(f"{path}: not a regular file")
    if secret and st.st_mode & 0o077:
        raise IdentityError(
            f"{path}: permissions {stat.S_IMODE(st.st_mode):04o} are too open; "
            f"a private key must be readable by its owner only (chmod 600 {path})"
        )
    if st.st_size > _MAX_FILE:
        raise IdentityError(f"{path}: too large ({st.st_size} bytes) to be a key file")
    try:
        return path.read_bytes()
    except OSError as exc:
        raise IdentityError(f"{path}: cannot read ({exc.strerror})") from None


_PKCS8_ED25519 = bytes.fromhex("302e020100300506032b657004220420")
"""DER of an Ed25519 PKCS#8 private key up to its 32-byte seed (RFC 8410): what
:func:`_pem` writes, read back without cryptography's serialization module."""


def _load_private_key(path: Path) -> Ed25519PrivateKey:
    data = _read(path, secret=True)
    fast = _ed25519_pem_seed(data)
    if fast is not None:
        return fast
    # Anything else (or anything odd) goes to cryptography's parser, which is
    # imported only here: it costs ~10 ms of import (its SSH and PKCS#12 code).
    from cryptography.hazmat.primitives import serialization

    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError):
        raise IdentityError(f"{path}: corrupt or encrypted private key (expected PEM)") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise IdentityError(f"{path}: not an Ed25519 private key")
    return key


def _ed25519_pem_seed(data: bytes) -> Ed25519PrivateKey | None:
    """The key of a PEM file exactly as :func:`_pem` writes it, else ``None``."""
    lines = data.strip().split(b"\n")
    if len(lines) != 3 or lines[0] != b"-----BEGIN PRIVATE KEY-----":
        return None
    if lines[2] != b"-----END PRIVATE KEY-----":
        return None
    try:
        der = binascii.a2b_base64(lines[1], strict_mode=True)
    except binascii.Error:
        return None
    if len(der) != len(_PKCS8_ED25519) + 32 or not der.startswith(_PKCS8_ED25519):
        return None
    return Ed25519PrivateKey.from_private_bytes(der[len(_PKCS8_ED25519) :])


def _pem(key: Ed25519PrivateKey) -> bytes:
    from cryptography.hazmat.primitives import serialization  # see _load_private_key

    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _load_psk(path: Path) -> bytes:
    text = _read(path, secret=True).strip()
    try:
        psk = bytes.fromhex(text.decode("ascii"))
    except (UnicodeDecodeError, ValueError):
        psk = b""
    if len(psk) != 32:
        raise IdentityError(f"{path}: corrupt pre-shared key (expected 64 hex digits)")
    return psk


def _load_fleet_description(directory: Path) -> tuple[FleetMode, str, bytes | None]:
    path = directory / FLEET_FILE
    data = _read(path, secret=False)
    try:
        obj = decode_cbor(data, max_size=_MAX_FILE, what=str(path), error=IdentityError)
    except IdentityError as exc:
        raise IdentityError(f"{path}: corrupt fleet description ({exc})") from None
    if not (isinstance(obj, dict) and obj.get("v") == 1 and obj.get("mode") in ("cert", "psk")):
        raise IdentityError(f"{path}: not a version-1 fleet description")
    name, key = obj.get("name"), obj.get("key")
    if not isinstance(name, str) or (key is not None and not _is_bytes(key, 32)):
        raise IdentityError(f"{path}: corrupt fleet description")
    mode: FleetMode = "cert" if obj["mode"] == "cert" else "psk"
    return mode, name, key


def load_fleet(directory: Path | str) -> Fleet:
    """The fleet described in ``directory`` (a fleet or a node directory)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise IdentityError(
            f"{directory}: no such directory (create a fleet with `p2p fleet init`)"
        )
    mode, name, key = _load_fleet_description(directory)
    if mode == "psk":
        return Fleet("psk", name, psk=_load_psk(directory / PSK_FILE))
    return Fleet("cert", name, public_key=key)


def load_fleet_authority(fleet_dir: Path | str) -> FleetAuthority:
    """The fleet in ``fleet_dir`` with its admitting secret; checks key and description agree."""
    fleet_dir = Path(fleet_dir)
    fleet = load_fleet(fleet_dir)
    if fleet.mode == "psk":
        return FleetAuthority(fleet)
    key = _load_private_key(fleet_dir / FLEET_KEY_FILE)
    if raw_public(key) != fleet.public_key:
        raise IdentityError(f"{fleet_dir}: {FLEET_KEY_FILE} does not match {FLEET_FILE}")
    return FleetAuthority(fleet, key)


def init_fleet(fleet_dir: Path | str, *, psk: bool = False, name: str | None = None) -> Fleet:
    """Create a new fleet in ``fleet_dir``; refuse to overwrite an existing one."""
    fleet_dir = Path(fleet_dir)
    name = name or fleet_dir.resolve().name[:MAX_NAME] or "fleet"
    _check_name(name)
    if (fleet_dir / FLEET_FILE).exists():
        raise IdentityError(f"{fleet_dir}: already holds a fleet; refusing to overwrite it")
    _make_dir(fleet_dir)
    if psk:
        fleet = Fleet("psk", name, psk=os.urandom(32))
        assert fleet.psk is not None
        _write_private(fleet_dir / PSK_FILE, fleet.psk.hex().encode() + b"\n")
    else:
        key = Ed25519PrivateKey.generate()
        fleet = Fleet("cert", name, public_key=raw_public(key))
        _write_private(fleet_dir / FLEET_KEY_FILE, _pem(key))
    _write_private(fleet_dir / FLEET_FILE, fleet.describe())  # last: marks the fleet complete
    return fleet


def load_or_create_identity(node_dir: Path | str) -> Ed25519PrivateKey:
    """The node's identity key, generated (0600) on first use."""
    node_dir = Path(node_dir)
    path = node_dir / NODE_KEY_FILE
    if path.exists():
        return _load_private_key(path)
    _make_dir(node_dir)
    key = Ed25519PrivateKey.generate()
    _write_private(path, _pem(key))
    return key


def add_node(
    fleet_dir: Path | str,
    node_dir: Path | str,
    *,
    name: str | None = None,
    valid_days: float = DEFAULT_VALID_DAYS,
    now: float | None = None,
) -> NodeIdentity:
    """Make ``node_dir`` a member of the fleet in ``fleet_dir`` and return its identity.

    Reuses an existing node key (re-issuing the certificate: this is how a
    certificate is renewed); refuses a node directory that already belongs to
    a different fleet.  Cert mode: the certificate is valid ``valid_days``.
    """
    authority = load_fleet_authority(fleet_dir)
    node_dir = Path(node_dir)
    name = name or node_dir.resolve().name[:MAX_NAME] or "node"
    _check_name(name)
    if (node_dir / FLEET_FILE).exists():
        current = load_fleet(node_dir)
        if current.fleet_id != authority.fleet.fleet_id:
            raise IdentityError(f"{node_dir}: already belongs to fleet {current.name!r}")
    key = load_or_create_identity(node_dir)
    cert = None
    if authority.signing_key is not None:
        cert = issue_certificate(authority, raw_public(key), name, valid_days=valid_days, now=now)
        _write_private(node_dir / NODE_CERT_FILE, cert.encode())
    if authority.fleet.psk is not None:
        _write_private(node_dir / PSK_FILE, authority.fleet.psk.hex().encode() + b"\n")
    _write_private(node_dir / FLEET_FILE, authority.fleet.describe())
    return NodeIdentity(key, cert)


def load_node(node_dir: Path | str) -> tuple[NodeIdentity, Fleet]:
    """A member node's identity and fleet, with its certificate checked against the fleet."""
    node_dir = Path(node_dir)
    if not node_dir.is_dir():
        raise IdentityError(
            f"{node_dir}: no such node directory (create it with `p2p fleet add-node`)"
        )
    fleet = load_fleet(node_dir)
    key = _load_private_key(node_dir / NODE_KEY_FILE)
    if fleet.mode == "psk":
        return NodeIdentity(key), fleet
    cert_path = node_dir / NODE_CERT_FILE
    try:
        cert = Certificate.decode(_read(cert_path, secret=False), IdentityError)
        verify_certificate(fleet, cert, IdentityError)
    except IdentityError as exc:
        raise IdentityError(f"{cert_path}: {exc}") from None
    if cert.node_public_key != raw_public(key):
        raise IdentityError(f"{cert_path}: certificate is for another key than {NODE_KEY_FILE}")
    return NodeIdentity(key, cert), fleet


@contextlib.contextmanager
def lock_identity(node_dir: Path | str) -> Iterator[None]:
    """Hold ``NODE_DIR/node.lock`` (``flock``, released when the process dies) for
    the block, so one identity runs in one process at a time: two incarnations of
    one id would fight over membership.  Raises :class:`IdentityInUseError`
    naming the holder's pid.  A directory where the lock cannot be created
    (read-only media) runs unlocked."""
    path = Path(node_dir) / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        if exc.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise IdentityError(f"{path}: cannot create the lock ({exc.strerror})") from None
        fd = -1
    if fd < 0:
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
            raise IdentityInUseError(
                f"{node_dir}: identity already in use by process {holder} "
                "(one process per identity; stop it or use another NODE_DIR)"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        yield
    finally:
        os.close(fd)

"""Provisioning a fleet from Python: what ``p2p fleet ...`` does, as functions.

A *fleet* is the set of nodes allowed to talk to each other; a *node
directory* holds one member's identity (DESIGN.md §6).  A provisioning script
needs nothing else than this module::

    from p2p import fleet

    fleet.init_fleet("fleet/")                      # or psk=True: a pre-shared key
    for name in ("gateway", "sensor-1"):
        fleet.add_node("fleet/", name + "/")        # key 0600, certificate, fleet copy
    info = fleet.node_info("sensor-1/")             # id, name, expiry
    fleet.renew("fleet/", "sensor-1/", valid_days=90)
    fleet.revoke("fleet/", ["sensor-1/"], to=["gateway/"])

What holds:

* Every function takes ``str`` or :class:`~pathlib.Path` directories and
  creates what it writes with mode 0600 (files) and 0700 (directories).
* A wrong, missing or corrupt directory raises :class:`FleetError`, whose
  message is one line naming the file and the reason (a fleet directory given
  where a node directory is expected and the reverse are named as such);
  nothing here raises a bare ``OSError`` or ``ValueError``.  :class:`FleetError`
  is a :class:`~p2p.P2PError` and is the :class:`IdentityError` the node
  raises on start for the same directory.
* Secrets never leave their files except into the node directories this
  module writes: a cert fleet's signing key stays in ``FLEET_DIR``; a psk
  fleet's key is copied into each of its node directories (in that mode,
  every member can admit members).

A psk fleet issues no certificates: its nodes do not expire, :func:`renew`
only refreshes the fleet files of the node directory, and a revoked node that
kept the psk can still make itself a new identity (rotate to a new fleet to
lock it out for good).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from p2p import _identity as _id
from p2p._errors import IdentityError
from p2p._identity import Certificate, Fleet, FleetMode, NodeIdentity
from p2p._revocation import REVOKED_FILE, RevocationList, load_revocations
from p2p._revocation import revoke as _revoke_list

FleetError = IdentityError
"""What every function here raises for a wrong, missing or corrupt directory
(one line naming the file): the runtime's :class:`~p2p.P2PError` for identity
files, under a name that says what it is about."""

DEFAULT_VALID_DAYS: float = _id.DEFAULT_VALID_DAYS
"""A certificate's lifetime unless told otherwise (365 days)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeInfo:
    """What a node directory says about its member (``p2p fleet show``)."""

    node_id: int
    """The 64-bit overlay id (first 8 bytes of SHA-256 over the public key)."""
    name: str | None
    """The name in the certificate; ``None`` in a psk fleet (no certificate)."""
    fleet_name: str
    """The fleet's name."""
    mode: FleetMode
    """``cert`` (the fleet key signs certificates) or ``psk`` (a pre-shared key)."""
    not_after: int | None
    """Unix time the certificate expires; ``None`` in a psk fleet."""

    @property
    def hex_id(self) -> str:
        """The id as the command line prints it (16 hex digits)."""
        return f"{self.node_id:016x}"


def _describe(path: Path, expect: str) -> str:
    """Why ``path`` is not the ``expect`` directory (fleet or node), in words."""
    if not path.exists():
        return f"{path}: no such directory"
    if not path.is_dir():
        return f"{path}: not a directory"
    has_key = (path / _id.FLEET_KEY_FILE).exists()
    is_node = (path / _id.NODE_KEY_FILE).exists()
    if expect == "fleet" and is_node and not has_key:
        return f"{path}: is a node directory, not a fleet directory (the one `init_fleet` made)"
    if expect == "node" and has_key and not is_node:
        return f"{path}: is a fleet directory, not a node directory (make one with `add_node`)"
    return ""


def _one_line(exc: IdentityError) -> FleetError:
    return FleetError(" ".join(str(exc).split()))


def _check_new_dir(path: Path) -> None:
    """Refuse ``path`` if it exists and is not a directory (a missing one is created)."""
    if path.exists() and not path.is_dir():
        raise FleetError(f"{path}: not a directory")


@contextmanager
def _writing(path: Path, doing: str) -> Iterator[None]:
    """Errors while writing into ``path`` as :class:`FleetError`: an identity error
    in one line, an OS error as ``path: cannot <doing> (<reason>)``."""
    try:
        yield
    except IdentityError as exc:
        raise _one_line(exc) from None
    except OSError as exc:
        raise FleetError(f"{path}: cannot {doing} ({exc.strerror})") from None


def _check_dir(path: Path, expect: str, create: str, holds: str, file: str) -> None:
    """Refuse ``path`` unless it is the ``expect`` directory (fleet or node) and
    holds ``file``; ``create`` tells how to make one, ``holds`` names what ``file`` is."""
    why = _describe(path, expect)
    if why:
        raise FleetError(f"{why} ({create})")
    if not (path / file).exists():
        raise FleetError(f"{path}: holds no {holds} ({file} missing)")


def _check_fleet_dir(fleet_dir: Path) -> None:
    create = "create a fleet with `init_fleet` or `p2p fleet init`"
    _check_dir(fleet_dir, "fleet", create, "fleet", _id.FLEET_FILE)
    mode = _id.load_fleet(fleet_dir).mode
    if mode == "cert" and not (fleet_dir / _id.FLEET_KEY_FILE).exists():
        raise FleetError(
            f"{fleet_dir}: holds no fleet signing key ({_id.FLEET_KEY_FILE}): "
            "a node directory cannot admit members of a cert fleet"
        )


def _check_node_dir(node_dir: Path) -> None:
    create = "create it with `add_node` or `p2p fleet add-node`"
    _check_dir(node_dir, "node", create, "node identity", _id.NODE_KEY_FILE)


def init_fleet(fleet_dir: str | Path, *, psk: bool = False, name: str | None = None) -> Fleet:
    """Create a new fleet in ``fleet_dir`` (created if missing) and return it.

    ``psk=False``: an Ed25519 signing key (``fleet.key``) that certifies each
    member; ``psk=True``: a 32-byte pre-shared key (``fleet.psk``).  ``name``
    defaults to the directory's name.  Refuses a directory that already holds
    a fleet (:class:`FleetError`): overwriting it would orphan its members.
    """
    path = Path(fleet_dir)
    _check_new_dir(path)
    with _writing(path, "create the fleet"):
        return _id.init_fleet(path, psk=psk, name=name)


def add_node(
    fleet_dir: str | Path,
    node_dir: str | Path,
    *,
    name: str | None = None,
    valid_days: float = DEFAULT_VALID_DAYS,
) -> NodeIdentity:
    """Make ``node_dir`` a member of the fleet in ``fleet_dir``; return its identity.

    Creates the node's key on first use (kept afterwards: the node id never
    changes), writes its certificate (cert fleet, valid ``valid_days`` from
    now, named ``name`` or the directory's name) and its copy of the fleet
    files.  Refuses a node directory of another fleet.  Running it again on a
    member renews its certificate (see :func:`renew`).
    """
    fleet_path, node_path = Path(fleet_dir), Path(node_dir)
    _check_fleet_dir(fleet_path)
    _check_new_dir(node_path)
    if node_path.resolve() == fleet_path.resolve():
        raise FleetError(f"{node_path}: a node directory must not be the fleet directory")
    with _writing(node_path, "write the node"):
        return _id.add_node(fleet_path, node_path, name=name, valid_days=valid_days)


def renew(
    fleet_dir: str | Path,
    node_dir: str | Path,
    *,
    valid_days: float = DEFAULT_VALID_DAYS,
) -> NodeIdentity:
    """Issue a new certificate, valid ``valid_days`` from now, for an existing member.

    Keeps the node's key (so its id) and the name in its current certificate
    (even an expired one).  Refuses a directory that is not yet a member
    (:func:`add_node` makes one) or that belongs to another fleet.  A running
    node reads its certificate at start: restart it to present the new one.
    In a psk fleet there is no certificate: this refreshes the fleet files.
    """
    fleet_path, node_path = Path(fleet_dir), Path(node_dir)
    _check_fleet_dir(fleet_path)
    _check_node_dir(node_path)
    if not (node_path / _id.FLEET_FILE).exists():
        raise FleetError(f"{node_path}: not a member of any fleet yet (use `add_node`)")
    name = None
    cert_path = node_path / _id.NODE_CERT_FILE
    if cert_path.exists():
        try:
            name = Certificate.decode(cert_path.read_bytes(), IdentityError).name
        except (IdentityError, OSError):
            name = None  # unreadable: add_node falls back to the directory's name
    return add_node(fleet_path, node_path, name=name, valid_days=valid_days)


def load_node(node_dir: str | Path) -> tuple[NodeIdentity, Fleet]:
    """The identity and fleet of a member (what :func:`~p2p.open_node` starts from).

    Checks the key file's permissions, that the certificate is the fleet's,
    for this key and not expired; :class:`FleetError` otherwise.  The pair can
    be passed to :func:`~p2p.open_node` in place of the directory.
    """
    path = Path(node_dir)
    _check_node_dir(path)
    try:
        return _id.load_node(path)
    except IdentityError as exc:
        raise _one_line(exc) from None


def load_fleet(directory: str | Path) -> Fleet:
    """The public description of the fleet of ``directory`` (a fleet or a node
    directory), with its pre-shared key in a psk fleet."""
    path = Path(directory)
    if not path.is_dir():
        raise FleetError(f"{path}: no such directory")
    try:
        return _id.load_fleet(path)
    except IdentityError as exc:
        raise _one_line(exc) from None


def node_info(node_dir: str | Path) -> NodeInfo:
    """What ``node_dir`` holds, checked as :func:`load_node` checks it."""
    identity, fleet = load_node(node_dir)
    cert = identity.certificate
    return NodeInfo(
        node_id=identity.node_id,
        name=cert.name if cert else None,
        fleet_name=fleet.name,
        mode=fleet.mode,
        not_after=cert.not_after if cert else None,
    )


def expires_in(node_dir: str | Path, *, now: float | None = None) -> float | None:
    """Seconds until the node's certificate expires (negative: expired), or
    ``None`` in a psk fleet.  Reads the certificate without requiring it to be
    valid, so a script can find the nodes to :func:`renew`."""
    path = Path(node_dir)
    _check_node_dir(path)
    fleet = load_fleet(path)
    if fleet.mode == "psk":
        return None
    cert_path = path / _id.NODE_CERT_FILE
    try:
        data = cert_path.read_bytes()
    except OSError as exc:
        raise FleetError(f"{cert_path}: cannot read ({exc.strerror})") from None
    try:
        cert = Certificate.decode(data, IdentityError)
    except IdentityError as exc:
        raise FleetError(f"{cert_path}: {' '.join(str(exc).split())}") from None
    if cert.not_after is None:
        return -1.0  # a version-1 certificate: refused as if expired
    return cert.not_after - (time.time() if now is None else now)


def _node_id(node: int | str | Path) -> int:
    """A node id: an int, 16 hex digits, or a member's node directory."""
    if isinstance(node, bool):
        raise FleetError(f"{node!r} is not a node id")
    if isinstance(node, int):
        if not 0 <= node < 1 << 64:
            raise FleetError(f"node id {node} does not fit 64 bits")
        return node
    if isinstance(node, Path) or Path(node).is_dir():
        return load_node(node)[0].node_id
    try:
        value = int(node, 16)
    except ValueError:
        raise FleetError(
            f"{node!r} is neither a node id (16 hex digits) nor a node directory"
        ) from None
    if not 0 <= value < 1 << 64:
        raise FleetError(f"node id {node!r} does not fit 64 bits")
    return value


def revoke(
    fleet_dir: str | Path,
    nodes: Iterable[int | str | Path],
    *,
    to: Iterable[str | Path] = (),
) -> RevocationList:
    """Add ``nodes`` (ids, hex ids or node directories) to the fleet's signed
    revocation list and return the new list.

    Writes ``FLEET_DIR/revoked.cbor`` with the next serial and copies it into
    each node directory of ``to``: a running member there reads it within a
    second and spreads it to every member, which then drops and refuses the
    revoked nodes.  Revoking is cumulative and cannot be undone (a node that
    must come back needs a new identity).
    """
    fleet_path = Path(fleet_dir)
    _check_fleet_dir(fleet_path)
    targets = [Path(t) for t in to]
    for target in targets:
        _check_node_dir(target)
    ids = {_node_id(n) for n in nodes}
    if not ids:
        raise FleetError("revoke: no node given")
    try:
        authority = _id.load_fleet_authority(fleet_path)
        previous = load_revocations(fleet_path / REVOKED_FILE, authority.fleet)
        rl = _revoke_list(authority, previous, ids)
        for target in [fleet_path, *targets]:
            _id.write_atomic(target / REVOKED_FILE, rl.encode())
    except IdentityError as exc:
        raise _one_line(exc) from None
    return rl


def revoked(fleet_or_node_dir: str | Path) -> frozenset[int]:
    """The node ids the verified revocation list in the directory names (empty
    if it has none)."""
    path = Path(fleet_or_node_dir)
    fleet = load_fleet(path)
    try:
        rl = load_revocations(path / REVOKED_FILE, fleet)
    except IdentityError as exc:
        raise _one_line(exc) from None
    return frozenset() if rl is None else rl.nodes


__all__ = [
    "DEFAULT_VALID_DAYS",
    "Certificate",
    "Fleet",
    "FleetError",
    "FleetMode",
    "IdentityError",
    "NodeIdentity",
    "NodeInfo",
    "RevocationList",
    "add_node",
    "expires_in",
    "init_fleet",
    "load_fleet",
    "load_node",
    "node_info",
    "renew",
    "revoke",
    "revoked",
]

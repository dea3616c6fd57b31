"""A fleet's revocation list: node ids it no longer admits (DESIGN.md §6).

``p2p fleet revoke`` writes ``FLEET_DIR/revoked.cbor``, signed by the fleet key
(cert mode) or authenticated with a key derived from the psk (psk mode), with a
serial number one above the previous list's.  A member reads the list from its
node directory (copied there by the operator, ``--to``) at start and whenever
the file changes, and the lists spread over the overlay: the membership digest
carries the list's serial, and a member holding a newer list sends it to a
peer that shows an older one.  A member that adopts a list drops the revoked
nodes from its view and links, and refuses them at the handshake, in peer
exchanges and on open connections.

psk mode: every holder of the psk can admit new identities and sign lists, so
revoking a device's identity does not revoke the psk it stole; rotate the psk
(a new fleet) to lock such a device out for good.

Wire and file form: CBOR ``[1, fleet_id(16), serial, [node id, ...], proof]``.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from pathlib import Path

import cbor2
from cryptography.exceptions import InvalidSignature

from p2p._errors import IdentityError, SecurityError
from p2p._identity import Fleet, FleetAuthority, decode_cbor, ed25519_public

__all__ = ["MAX_REVOKED", "REVOKED_FILE", "RevocationList", "load_revocations", "revoke"]

REVOKED_FILE = "revoked.cbor"
MAX_REVOKED = 4096
"""Most node ids one list may name (bounds what a peer can make us decode)."""
MAX_LIST_SIZE = 16 + 9 * MAX_REVOKED + 128
_CONTEXT = b"p2p-revoked-v1\x00"


@dataclass(frozen=True, slots=True)
class RevocationList:
    """The fleet's statement "these node ids are no longer members" (serial ``serial``)."""

    fleet_id: bytes
    serial: int
    nodes: frozenset[int]
    proof: bytes

    def _signed_part(self) -> bytes:
        return _CONTEXT + cbor2.dumps([1, self.fleet_id, self.serial, sorted(self.nodes)])

    def encode(self) -> bytes:
        return cbor2.dumps([1, self.fleet_id, self.serial, sorted(self.nodes), self.proof])

    @classmethod
    def decode(cls, data: bytes) -> RevocationList:
        """Parse a list's shape (not its proof: see :meth:`verify`); :class:`SecurityError`."""
        obj = decode_cbor(data, max_size=MAX_LIST_SIZE, what="revocation list", error=SecurityError)
        ok = (
            isinstance(obj, list)
            and len(obj) == 5
            and obj[0] == 1
            and isinstance(obj[1], bytes)
            and len(obj[1]) == 16
            and _uint(obj[2], 1 << 63)
            and isinstance(obj[3], list)
            and len(obj[3]) <= MAX_REVOKED
            and all(_uint(n, 1 << 64) for n in obj[3])
            and isinstance(obj[4], bytes)
            and len(obj[4]) in (32, 64)
        )
        if not ok:
            raise SecurityError("revocation list: wrong shape")
        return cls(obj[1], obj[2], frozenset(obj[3]), obj[4])

    def verify(self, fleet: Fleet) -> None:
        """Return only if ``fleet`` issued this list; else raise :class:`SecurityError`."""
        if not hmac.compare_digest(self.fleet_id, fleet.fleet_id):
            raise SecurityError("revocation list of another fleet")
        if fleet.public_key is not None:
            key = ed25519_public(fleet.public_key, SecurityError, "fleet key")
            try:
                key.verify(self.proof, self._signed_part())
            except InvalidSignature:
                raise SecurityError("revocation list signature does not verify") from None
        elif not hmac.compare_digest(self.proof, _mac(fleet, self._signed_part())):
            raise SecurityError("revocation list was not made with this fleet's psk")


def _uint(x: object, limit: int) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and 0 <= x < limit


def _mac(fleet: Fleet, data: bytes) -> bytes:
    return hmac.new(fleet.mac_key(b"revocations"), data, "sha256").digest()


def revoke(
    authority: FleetAuthority, previous: RevocationList | None, nodes: set[int]
) -> RevocationList:
    """A new list: ``previous``'s nodes and ``nodes``, with the next serial."""
    fleet = authority.fleet
    names = set(previous.nodes if previous else ()) | nodes
    if len(names) > MAX_REVOKED:
        raise IdentityError(f"a revocation list names at most {MAX_REVOKED} nodes")
    serial = (previous.serial if previous else 0) + 1
    unsigned = RevocationList(fleet.fleet_id, serial, frozenset(names), b"")
    if authority.signing_key is not None:
        proof = authority.signing_key.sign(unsigned._signed_part())
    else:
        proof = _mac(fleet, unsigned._signed_part())
    return RevocationList(fleet.fleet_id, serial, frozenset(names), proof)


def load_revocations(path: Path, fleet: Fleet) -> RevocationList | None:
    """The verified list in ``path`` (``None`` if there is no file); raises
    :class:`IdentityError` naming the file if it is unreadable or forged."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise IdentityError(f"{path}: cannot read ({exc.strerror})") from None
    try:
        rl = RevocationList.decode(data)
        rl.verify(fleet)
    except SecurityError as exc:
        raise IdentityError(f"{path}: {exc}") from None
    return rl

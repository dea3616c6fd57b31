"""What a node knows of its fleet beyond its view: the signed records of its
peers and their gossip, the fleet's revocation list, and the seeds it was
given.  A part of :class:`~p2p.machine.NodeMachine` (its base class), sans-IO.

Invariants: a record reaches the machine only verified (``verify``), an older
record never replaces a newer one nor a departure, and a revocation list is
adopted only if genuine and newer than the one held.
"""

from __future__ import annotations

from collections.abc import Iterable

from p2p._membership import Peer, RecordGossip, records_digest
from p2p.machine._outputs import (
    Out,
    RevocationsAdopted,
    SendControl,
    SendExchange,
    Verify,
    VerifyRevocations,
)
from p2p.machine._seeds import Seeds
from p2p.wire import Members, Revoked
from topics import VCubePS
from vcube import Detector


class _Fleet:
    """Records, revocations and seeds (see the module docstring); the state is
    :class:`~p2p.machine.NodeMachine`'s, set in its ``__init__``."""

    id: int
    core: VCubePS
    detector: Detector | None
    alive: set[int]
    record: bytes
    records_learned: int
    peers: dict[int, Peer]
    departed: dict[int, Peer]
    revoked: set[int]
    revocation_serial: int
    revocations: bytes
    gossip: RecordGossip
    seeds: Seeds
    _verify: Verify
    _verify_revocations: VerifyRevocations

    def learn(self, node: int, inc: int, now: float) -> Out:
        raise NotImplementedError  # NodeMachine's

    def revoke(self, node: int, now: float) -> Out:
        raise NotImplementedError  # NodeMachine's

    # ---------------------------------------------------------- records --

    def add_peer(self, peer: Peer, inc: int, now: float) -> tuple[bool, Out]:
        """A verified record of ``peer`` announcing incarnation ``inc`` (discovery,
        a seed, an exchange): whether it told something new, and the outputs of
        learning it.  A record older than the one held, or than the departure
        last reported, changes nothing."""
        node = peer.node_id
        if node == self.id or node in self.revoked:
            return False, []
        for prior in (self.peers.get(node), self.departed.get(node)):
            if prior is not None and (
                peer.issued_at < prior.issued_at or peer.record == prior.record
            ):
                return False, []
        self.peers[node] = peer
        return True, self.learn(node, inc, now)

    def set_record(self, record: bytes) -> None:
        """This node's own signed record (a new one for each incarnation)."""
        self.record = record

    def known_records(self) -> list[bytes]:
        """This node's record and those of the peers it believes up (what an
        exchange sends: a crashed peer's record would only make others dial it)."""
        alive = self.alive
        return [self.record, *(p.record for n, p in self.peers.items() if n in alive)]

    def introduce(self, dest: int) -> Out:
        """Ask ``dest`` (a seed) for its records, with ours."""
        return [SendExchange(dest, tuple(self.known_records()), True)]

    def exchange(self, sender: int, records: Iterable[bytes], reply: bool, now: float) -> Out:
        """Records from ``sender``: learn the verified new ones, answer if asked,
        and pass the news on to this node's VCube neighbours (not back to
        ``sender``), so a join floods the overlay once.  Raises what ``verify``
        raises on a forged record.  ``records_learned`` counts the news."""
        held = {p.record for p in self.peers.values()}  # known bytes need no check
        out: Out = []
        news = []
        for record in records:
            if record in held:
                continue
            new, learnt = self.add_peer(*self._verify(record), now)
            out += learnt
            if new:
                news.append(record)
        self.records_learned += len(news)
        if reply and sender in self.peers:
            out.append(SendExchange(sender, tuple(self.known_records()), False))
        return out + self.spread(news, sender)

    def spread(self, news: list[bytes], sender: int | None) -> Out:
        """Pass records new to this node on to its VCube neighbours (not back to
        ``sender``): each node forwards a record once.  Anti-entropy (the
        digests each round, :meth:`on_digest`) covers what a flood over
        differing views misses."""
        if not news:
            return []
        records = (self.record, *news)
        children = self.core.overlay.children(self.id, self.id)
        return [SendExchange(n, records, False) for n in children if n != sender]

    def on_digest(self, sender: int, digest: int, now: float) -> Out:
        """``sender`` holds records with ``digest``: if ours differ, send ours and
        ask for its own (both then hold the union, ``p2p._membership``)."""
        if sender not in self.peers:
            return []  # its introduction has not arrived: nowhere to answer yet
        mine = records_digest(self.known_records())
        if self.gossip.answer(sender, digest, mine, now):
            return [SendExchange(sender, tuple(self.known_records()), True)]
        return []

    def _digests(self, now: float) -> Out:
        """Tell the monitored nodes our records' digest, when it changed since we
        last told them or every ``DIGEST_REFRESH`` rounds."""
        if self.detector is None or not self.record:
            return []
        digest = records_digest(self.known_records())
        msg = Members(digest, self.revocation_serial)
        targets = self.gossip.due(self.detector.monitored(), digest, now)
        return [SendControl(n, msg) for n in targets if n in self.alive]

    def _depart(self, node: int) -> None:
        """Keep ``node``'s record as departed: an older or equal one stays out."""
        peer = self.peers.pop(node, None)
        if peer is not None:
            self.departed[node] = peer

    # ------------------------------------------------------ revocation --

    def adopt_revocations(self, blob: bytes, now: float) -> Out:
        """The fleet's revocation list ``blob`` (from a peer, or the driver's file):
        adopted if genuine and newer than the one held.  Its nodes leave at once
        and are refused from now on, and the list goes on to this node's VCube
        neighbours.  Raises ``SecurityError`` on a forged list."""
        serial, nodes = self._verify_revocations(blob)
        if serial <= self.revocation_serial:
            return []
        self.revocation_serial, self.revocations = serial, blob
        fresh = sorted(nodes - self.revoked - {self.id})
        out: Out = [RevocationsAdopted(serial, tuple(fresh), self.id in nodes)]
        for node in fresh:
            out += self.revoke(node, now)
        notice = Revoked(blob)
        children = self.core.overlay.children(self.id, self.id)
        return out + [SendControl(n, notice) for n in children]

    def _compare(self, sender: int, theirs: int) -> Out:
        """``sender`` holds revocation list ``theirs``: send ours if newer, ask for
        its own (our digest and serial) if older."""
        mine = self.revocation_serial
        if theirs == mine or sender not in self.peers:
            return []
        if theirs < mine:
            return [SendControl(sender, Revoked(self.revocations))]
        return [SendControl(sender, Members(records_digest(self.known_records()), mine))]

    # ------------------------------------------------------------ seeds --

    def add_seed(self, address: str, now: float) -> Out:
        """A seed's address (``p2p node --seed``): records are exchanged with it at
        once and every ``seed_interval`` (:class:`ExchangeWithSeed` from the timer)."""
        self.seeds.add(address, now)
        return []

    def seed_reached(self, address: str, node: int, now: float) -> Out:
        """The exchange with ``address`` went out; the seed is ``node`` (this node
        itself: no more exchanges with it)."""
        if node == self.id:
            self.seeds.drop(address)
        else:
            self.seeds.reached(address, node, now)
        return []

    def seed_failed(self, address: str, now: float) -> Out:
        """The exchange with ``address`` failed: tried again after a backoff."""
        self.seeds.failed(address, now)
        return []

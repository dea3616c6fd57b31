"""Wire format of VCube-PS packets: CBOR frame bodies behind a 4-byte length prefix.

A TCP stream carries *frames*: a 4-byte big-endian unsigned length, then that
many bytes of *body*.  A body is one CBOR data item (RFC 8949) in a strict
subset: unsigned and negative integers, byte strings, UTF-8 text strings,
arrays, ``true`` and ``false``, all of definite length with every head in its
shortest form.  No maps, tags, floats, ``null``/``undefined``, other simple
values, indefinite lengths or trailing bytes.  Packets are compact arrays
whose first element is a type tag.

=======  ====================================================  ==============================
Item     CBOR                                                  Checks
=======  ====================================================  ==============================
body     ``[version, [packet, ...]]``                          version == 2; 1..max_packets
         or ``[version, [packet, ...], alive]``                1..max_packets
         or ``[version, [packet, ...], exchange]``             0..max_packets
         or ``[version, [packet, ...], alive, exchange]``      0..max_packets
alive    unsigned integer                                      < 2**64: the sender's detector
                                                               version (piggybacked)
exchange ``[reply: bool, [record: bytes, ...]]``               1..max_records, each 1..
                                                               max_record bytes
PUB      ``[0, round, topic, [message, ...], dests]``          <= max_round_messages; payload
                                                               sum <= max_round_bytes (when
                                                               more than one message)
SUB      ``[1, round, topic, op]``
UNS      ``[2, round, topic, op, dests]``
         or ``[2, round, topic, op, dests, [bound, ...]]`` (an announce's ``predates``)
         or ``[2, round, topic, op, dests, [bound, ...], [bound, ...]]`` (and ``beyond``)
ACK      ``[3, round, topic, [op, ...], [bound, ...]]``        each <= max_view_entries
         or ``[3, round, topic, [op, ...], [bound, ...], [bound, ...]]`` (``predates``)
         or ``[3, round, topic, [op, ...], [bound, ...], [bound, ...], [bound, ...]]``
         (and ``beyond``)
FENCE    ``[8, round, topic, id, step, [message, ...],``       ``topics.Fence``: id's seq is
         ``[message, ...]]`` (``messages``, ``others``)        the value plus one; step 0..4;
         or ``[8, ..., [message, ...], [id, ...]]``            each <= max_round_messages;
         (and ``marks``, each id's seq plus one)               marks <= max_view_entries
round    ``[source: node, incarnation: ctr, number: ctr]``     ``RoundId``
op       ``[node: node, incarnation: ctr, rc: ctr, bool]``     ``ViewEntry`` (subscribed)
bound    ``[node: node, incarnation: ctr, first_owned: ctr]``  ``Bound``
message  ``[id, payload: bytes, [id, ...], [id, ...], prev]``  ``PubMessage``: payload <=
         or ``[id, payload, [id, ...], [id, ...], prev, joins]``  max_payload; deps + op_deps <=
         or ``[seq: ctr, payload]``: a follower (below)       max_barrier; prev: -1 or ctr;
                                                               joins (``op_joins``, present
                                                               only when not 0): 1 ..
                                                               2**len(op_deps) - 1; from
                                                               2**64 on (64 ops or more)
                                                               its shortest big-endian
                                                               bytes
follower ``[seq: ctr, payload: bytes]``, not first in its      the message ``p`` before it
         array: id ``(p.source, p.incarnation, seq)``,        is all it names, in ``p``'s
         deps ``[p's id]``, no op_deps, prev ``p``'s seq      stream (``chains_on``): a
                                                               message that is one is only
                                                               sent in this form
id       ``[source: node, incarnation: ctr, seq: ctr]``        ``causal.MsgId``
topic    text string                                           1..max_topic_len UTF-8 bytes
dests    ``[node, ...]``                                       strictly increasing; <=
                                                               max_dests
node     unsigned integer                                      < 2**64
ctr      unsigned integer                                      < 2**63
=======  ====================================================  ==============================

Four runtime-level *control* packets share the packets array (the core never
sees them):

=======  ====================================================  ==============================
DET      ``[4, detector message]``                             ``vcube.decode_detector``: a
                                                               Probe, Reply or Push, uint64
                                                               fields, <= max_detector_entries
LEAVE    ``[5, incarnation: ctr]``                             the sender leaves gracefully
MEMBERS  ``[6, digest: node, revocations: ctr]``              digest of the sender's member
                                                               records (``p2p._membership``),
                                                               its revocation list's serial
REVOKED  ``[7, list: bytes]``                                  the fleet's signed revocation
                                                               list (``p2p._revocation``)
=======  ====================================================  ==============================

*alive* is the sender's failure-detector version (``vcube.Detector.version``)
when the frame was encoded, carried by every frame of a node that runs a
detector: the receiver's detector takes the frame as a sign of life *and*
learns whether the sender has news, so a pull target whose data traffic shows
a version already synced needs no probe (``Detector.heard``).

An *exchange* is runtime-level peer exchange (static seeds, networks without
multicast): signed discovery records, checked by the receiver with
``verify_record`` before use; ``reply`` asks for the receiver's own list.

A :class:`~topics.Bundle` is link-level only: :func:`encode_packets` flattens
it into its packets, in order, and the receiver hands them to its core one by
one.

:func:`decode_packets` is the only gate between the network and a core.  It
first scans the raw bytes (well-formedness, the subset above, shortest heads,
nesting depth, item count, no length larger than the bytes left), so
``cbor2.loads`` never sees a tag, a map or a length it would allocate blindly;
then it checks every decoded value against the schema and the size limits of
:class:`~topics.PubSubConfig`.  Any deviation raises :class:`WireError`, and
nothing else: a packet that passes carries sizes the core accepts.

Modules, each using only those above it in this list (pure encode/decode, no I/O):

* ``_limits``: :class:`WireError`, :class:`WireLimits`, the protocol constants and type tags;
* ``_cbor``: canonical CBOR items (heads, integers, strings) both ways, the byte scan;
* ``_control``: the runtime's control packets and the peer exchange, both ways;
* ``_encode``: packets and frame bodies to bytes (:func:`encode_packets`, :func:`frame`);
* ``_decode``: frame bodies to packets, the direct and the checked decoder
  (:func:`decode_body`, :func:`decode_frame`, :func:`decode_packets`);
* ``_reader``: :class:`FrameReader`, de-framing a stream in bounded memory.
"""

from p2p.wire._control import (
    MAX_REPLAY_DEPS,
    MAX_REPLAY_ENTRIES,
    MAX_REPLAY_PARTS,
    MAX_REVOKED_BLOB,
    Control,
    Leave,
    Members,
    PeerExchange,
    Replay,
    ReplayEntry,
    Resume,
    Revoked,
)
from p2p.wire._decode import Body, decode_body, decode_frame, decode_packets
from p2p.wire._encode import encode_packets, frame, uint_size
from p2p.wire._limits import (
    COUNTER_LIMIT,
    MAX_DEPTH,
    NODE_LIMIT,
    PREFIX_BYTES,
    PROTOCOL_VERSION,
    WireError,
    WireLimits,
)
from p2p.wire._reader import FrameReader

__all__ = [
    "COUNTER_LIMIT",
    "MAX_DEPTH",
    "MAX_REPLAY_DEPS",
    "MAX_REPLAY_ENTRIES",
    "MAX_REPLAY_PARTS",
    "MAX_REVOKED_BLOB",
    "NODE_LIMIT",
    "PREFIX_BYTES",
    "PROTOCOL_VERSION",
    "Body",
    "Control",
    "FrameReader",
    "Leave",
    "Members",
    "PeerExchange",
    "Replay",
    "ReplayEntry",
    "Resume",
    "Revoked",
    "WireError",
    "WireLimits",
    "decode_body",
    "decode_frame",
    "decode_packets",
    "encode_packets",
    "frame",
    "uint_size",
]

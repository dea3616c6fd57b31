"""Built-in scenarios: the embedded default fleet of the quick start."""

from __future__ import annotations

import random

from p2p.sim._scenario import Action


def chat_fleet(
    nodes: int = 64, *, seed: int = 1, topics: int = 4, messages: int = 256
) -> list[Action]:
    """A LAN-chat style fleet: everyone joins ``room-0``, others join some rooms,
    subscribers publish at random times, a few leave half-way.

    Subscriptions happen in the first 500 u.t., publications over the next
    5000 u.t., then some nodes unsubscribe while messages still flow.
    """
    rng = random.Random(seed)
    out: list[Action] = []
    rooms = [f"room-{k}" for k in range(topics)]
    members: dict[str, list[int]] = {r: [] for r in rooms}
    for n in range(nodes):
        for k, room in enumerate(rooms):
            if k == 0 or rng.random() < 0.35:
                out.append(Action(rng.uniform(0, 500), "SUB", n, room))
                members[room].append(n)
    for i in range(messages):
        room = rooms[0] if rng.random() < 0.5 else rng.choice(rooms)
        if not members[room]:
            continue
        who = rng.choice(members[room])
        out.append(Action(rng.uniform(1500, 6500), "PUB", who, room, f"msg {i}".encode()))
    for room in rooms[1:]:
        for n in rng.sample(members[room], k=len(members[room]) // 8):
            out.append(Action(rng.uniform(4000, 7000), "UNS", n, room))
    out.sort(key=lambda a: a.time)
    return out

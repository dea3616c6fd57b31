"""A LAN that splits in two and heals, on six real ``p2p node`` processes in
network namespaces (``tests/_partition.py``): the publisher on the small side,
then on the large side.  After the heal the fleet merges back within
``MERGE_BOUND``, and every subscriber, on either side, delivers every
publication made since its first delivery, exactly once and in order (what
it missed while the sides were apart it resumes from the publisher's
history); the traces pass ``p2p check``; every namespace and process is gone
afterwards, whatever happened.  Needs root and iproute2 (fails, does not
skip, without them: CI runs as root).

``python tests/_partition.py --side small --runs 10`` repeats it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from _netns import Lan, leftovers, unavailable
from _partition import NODES, per_node_log, problems, report, run

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("side", ["small", "large"])
def test_a_healed_partition_loses_nothing(side: str, tmp_path: Path) -> None:
    reason = unavailable()
    assert reason is None, reason
    net = Lan(NODES)
    with net:
        pr = run(net, tmp_path, side)
    assert leftovers(net.suffix) == [], leftovers(net.suffix)
    found = problems(pr)
    assert found == [], (report(pr), found, per_node_log(pr))
    assert report(pr)["published_after_merge"] >= 100

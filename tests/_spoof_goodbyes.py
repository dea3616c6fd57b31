"""An outsider on the LAN: sends DNS-SD goodbyes for every member's service.

Run as ``python tests/_spoof_goodbyes.py INTERFACE SERVICE_TYPE SECONDS``.  It
holds no fleet secret: it browses ``SERVICE_TYPE`` on ``INTERFACE`` and, every
0.2 s for ``SECONDS``, multicasts for each service name it saw the PTR record
with TTL 0 that a departing service sends (RFC 6762 §10.1), as anyone on a LAN
can.  Prints how many goodbyes it sent.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from zeroconf import IPVersion, ServiceBrowser, ServiceStateChange, Zeroconf, const
from zeroconf._dns import DNSPointer
from zeroconf._protocol.outgoing import DNSOutgoing


def main(interface: str, service_type: str, seconds: float) -> int:
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
    sys.exit(main(sys.argv[1], sys.argv[2], float(sys.argv[3])))

"""Secured transports open and close cleanly in every mode (libzmq aborted when the ZAP socket
was closed from another thread; the guard thread also owns monitor sockets now); run in a
subprocess so an abort fails the test instead of killing pytest."""
from __future__ import annotations

import subprocess
import sys

CYCLES = """
from psnode.net.security import Mode, Plane
from psnode.net.transport import Transport, new_security
for mode in Mode:
    sec = new_security(mode)
    for i in range(40):
        t = Transport("j", "s", 2**20, sec)
        plane = Plane.DATA if i % 2 else Plane.CONTROL
        chan, port = t.router("127.0.0.1", 0, plane)
        d = t.dealer("127.0.0.1", port, "x", plane)
        if i % 3 == 0:
            d.close()           # a link closed before its transport (a worker's old server)
        t.close()
print("clean")
"""


def test_transports_open_close_cycles_in_every_mode() -> None:
    res = subprocess.run([sys.executable, "-c", CYCLES], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and res.stdout.strip() == "clean" and res.stderr == "", res.stderr

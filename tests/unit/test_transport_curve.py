"""CURVE transports open and close cleanly (libzmq aborted when the ZAP socket was closed from
another thread); run in a subprocess so an abort fails the test instead of killing pytest."""
from __future__ import annotations

import subprocess
import sys

CYCLES = """
from psnode.transport import CurveKeys, Transport
keys = CurveKeys.generate()
for _ in range(60):
    t = Transport("j", "s", 2**20, keys)
    chan, port = t.router("127.0.0.1", 0)
    t.dealer("127.0.0.1", port, "x")
    t.close()
print("clean")
"""


def test_curve_transport_open_close_cycles() -> None:
    res = subprocess.run([sys.executable, "-c", CYCLES], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and res.stdout.strip() == "clean" and res.stderr == "", res.stderr


def test_key_file_is_private_and_checked(tmp_path) -> None:
    import os

    import pytest

    from psnode.errors import ConfigError
    from psnode.transport import CurveKeys

    path = tmp_path / "job.key"
    keys = CurveKeys.generate()
    keys.save(str(path))
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert CurveKeys.load(str(path)) == keys
    os.chmod(path, 0o644)
    with pytest.raises(ConfigError, match="readable by others"):
        CurveKeys.load(str(path))

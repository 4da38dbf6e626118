"""``python -m psnode``: run the scheduler or a server, as PSNODE_ROLE says (see config.py).

SIGTERM ends the process with exit code 143.  An exception escaping the role's loop (a bug)
is written to the process's failure record (``PSNODE_ERROR_FILE``, :mod:`psnode.protocol.failure`)
before the traceback, so the launcher names it as the root cause.
"""
from __future__ import annotations

import logging
import signal
import sys

from psnode import cpupolicy
from psnode.config import NodeConfig, Role
from psnode.errors import PSError
from psnode.protocol import failure


def main() -> int:
    try:
        cfg = NodeConfig.from_env()
    except PSError as exc:
        print(f"psnode: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=cfg.log_level, stream=sys.stderr,
                        format=f"%(asctime)s {cfg.role.value} %(name)s %(levelname)s: %(message)s")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if cfg.role is Role.WORKER:
        print("psnode: PSNODE_ROLE=worker is for training scripts (psnode.kv.create), "
              "not for `python -m psnode`", file=sys.stderr)
        return 2
    cpupolicy.apply(cfg.cpu_policy, whole_process=True)   # (numpy's BLAS threads exist already; later ones inherit it)
    try:
        if cfg.role is Role.SCHEDULER:
            from psnode.scheduler import loop as scheduler
            return scheduler.main(cfg)
        from psnode.server import loop as server
        return server.main(cfg)
    except Exception as exc:
        failure.write(cfg.error_file, "exception", cfg.role.value, cfg.rank, cfg.host, exc=exc)
        raise


if __name__ == "__main__":
    sys.exit(main())

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
            listen_fd, cfg = _listen_first(cfg)
            from psnode.scheduler import loop as scheduler
            return scheduler.main(cfg, listen_fd)
        from psnode.server import loop as server
        return server.main(cfg)
    except Exception as exc:
        failure.write(cfg.error_file, "exception", cfg.role.value, cfg.rank, cfg.host, exc=exc)
        raise


def _listen_first(cfg: NodeConfig) -> tuple[int | None, NodeConfig]:
    """A scheduler whose launcher waits for its address (``PSNODE_ADDRESS_FILE``): bind it and
    write it now, before the imports of its loop; the socket's fd and the config at that port."""
    if not cfg.address_file:
        return None, cfg
    import dataclasses

    from psnode.files import write_atomic
    from psnode.net.listen import listen_early

    fd, port = listen_early(cfg.host, cfg.scheduler_port, elsewhere=True)
    write_atomic(cfg.address_file, f"{cfg.host}:{port}\n")
    if port != cfg.scheduler_port:
        logging.getLogger("psnode.scheduler").warning("scheduler: port %s on %s was taken; listening at %s:%s",
                                                      cfg.scheduler_port, cfg.host, cfg.host, port)
    return fd, dataclasses.replace(cfg, scheduler_port=port)


if __name__ == "__main__":
    sys.exit(main())

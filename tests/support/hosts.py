"""Hosts that fail: network namespaces and their processes, real sshd hosts to crash, and the
training script of the host-loss tests.

* :func:`ip`, :func:`ns_pids`, :func:`kill_namespace`: iproute2 on namespaces the tests create
  (never the machine's own interfaces);
* :func:`keygen`, :func:`sshd_config`: an OpenSSH host of a test's own (keys, config);
* :func:`descendants`: every process below a pid (an sshd and the sessions it serves);
  :func:`settled`: none of them is a shell starting up (when a crash may strike);
* :data:`HOST_LOSS`: a ``dist_sync`` job whose worker ``argv[2]`` (default 1) blocks at step 3
  on its first run (``flags/ready`` written) while its host is crashed; it resumes from ``kv.num_pushes``, so
  each rank ends at the uninterrupted closed form :data:`HOST_LOSS_FINAL`;
  :data:`HOST_LOSS_TWICE`: two workers, rank 0 blocked at step 2 and rank 1 at step 4 on their
  first runs (``flags/ready2``, ``flags/ready4``), for two crashes one after the other, ending at
  :data:`HOST_LOSS_FINAL` too;
  :data:`HOST_LOSS_KEYS` the same over six keys (one on every server), printing when each step
  completed (:func:`host_loss_keys_final`); :data:`HOST_LOSS_BIG` the same on one big embedding
  table computed on the servers (``argv[3]`` rows of 16; with ``argv[4]`` ``given``, the same
  values computed by rank 0 and given whole), each rank ending with
  :data:`HOST_LOSS_BIG_FINAL` when every row it checks is exact.
"""
from __future__ import annotations

import os
import subprocess
import textwrap
from pathlib import Path

#: OpenSSH's server, as Debian installs it.
SSHD = "/usr/sbin/sshd"

HOST_LOSS = textwrap.dedent("""
    import sys, time, pathlib, numpy as np, psnode
    flags = pathlib.Path(sys.argv[1])
    crashing = int(sys.argv[2]) if len(sys.argv) > 2 else 1      # the rank on the host that crashes
    kv = psnode.kv.create('dist_sync')
    kv.set_optimizer(psnode.optimizer.create('sgd', learning_rate=0.125))
    kv.init('w', np.zeros(3, np.float32))
    start = kv.num_pushes('w')
    print("START", start, "RESTARTS", kv.restarts, flush=True)
    for step in range(start, 6):
        if kv.rank == crashing and step == 3 and kv.restarts == 0:
            (flags / 'ready').touch()
            time.sleep(600)                       # its host crashes here
        kv.push('w', np.full(3, (kv.rank + 1) * (step + 1), np.float32))
        kv.pull('w')
    print("FINAL", kv.pull('w').tolist(), flush=True)
    kv.close()
""")

#: What each rank of :data:`HOST_LOSS` prints last: w = -lr * sum_s mean_grad_s = -0.125 * sum_s 1.5 (s + 1).
HOST_LOSS_FINAL = f"FINAL {[-0.125 * 1.5 * sum(range(1, 7))] * 3}"


HOST_LOSS_TWICE = textwrap.dedent("""
    import sys, time, pathlib, numpy as np, psnode
    flags = pathlib.Path(sys.argv[1])
    kv = psnode.kv.create('dist_sync')
    kv.set_optimizer(psnode.optimizer.create('sgd', learning_rate=0.125))
    kv.init('w', np.zeros(3, np.float32))
    start = kv.num_pushes('w')
    print("START", start, "RESTARTS", kv.restarts, flush=True)
    for step in range(start, 6):
        if step == 2 * (kv.rank + 1) and kv.restarts == 0:   # rank 0 at step 2, rank 1 at step 4
            (flags / f'ready{step}').touch()
            time.sleep(600)                       # its host crashes here
        kv.push('w', np.full(3, (kv.rank + 1) * (step + 1), np.float32))
        kv.pull('w')
    print("FINAL", kv.pull('w').tolist(), flush=True)
    kv.close()
""")

HOST_LOSS_KEYS = textwrap.dedent("""
    import sys, time, pathlib, numpy as np, psnode
    flags = pathlib.Path(sys.argv[1])
    crashing = int(sys.argv[2])                    # the rank on the host that crashes
    keys = [f"k{i}" for i in range(6)]             # (spread over every server)
    kv = psnode.kv.create('dist_sync')
    kv.set_optimizer(psnode.optimizer.create('sgd', learning_rate=0.125))
    for k in keys:
        kv.init(k, np.zeros(3, np.float32))
    done = {k: kv.num_pushes(k) for k in keys}     # (per key: a restored server may hold fewer)
    start = min(done.values())
    print("START", start, "RESTARTS", kv.restarts, "PUSHES", done, flush=True)
    for step in range(start, 6):
        if step == 3 and kv.restarts == 0:
            if kv.rank == crashing:
                (flags / 'ready').touch()
                time.sleep(600)                   # its host crashes here
            # the others push step 3 (each key part's 4th push: the first to ask for a copy)
            # only after the crash, so the lost server's copy holds none of steps 0-2
            for _ in range(1200):
                if (flags / 'crashed').exists():
                    break
                time.sleep(0.1)
        for i, k in enumerate(keys):
            if step >= done[k]:                   # (a key pushed further: those pushes are held)
                kv.push(k, np.full(3, (kv.rank + 1) * (step + 1) + i, np.float32))
        for k in keys:
            kv.pull(k)
        print("STEP", step, repr(time.time()), flush=True)
    print("FINAL", [kv.pull(k).tolist()[0] for k in keys], flush=True)
    kv.close()
""")


HOST_LOSS_BIG = textwrap.dedent("""
    import sys, time, pathlib, numpy as np, psnode
    from psnode.sparse import row_sparse_array
    flags = pathlib.Path(sys.argv[1])
    crashing, rows, dim = int(sys.argv[2]), int(sys.argv[3]), 16
    init = psnode.init.ps_initializer(psnode.init.Normal(1.0), seed=3)
    kv = psnode.kv.create('dist_sync', aggregator='sum')
    kv.set_optimizer(psnode.optimizer.create('sgd', learning_rate=1.0))
    if sys.argv[4:] == ['given']:                   # (a pretrained table: rank 0's values, sent whole)
        table = init.values('emb', (rows, dim)) if kv.rank == 0 else np.zeros((rows, dim), np.float32)
        kv.init('emb', table, stype='row_sparse')
        del table
    else:                                           # (computed on the servers)
        kv.init('emb', psnode.sparse.zeros((rows, dim)), init)

    def touched(step, rank):                        # 64 rows of the table, the same in every run
        return np.unique(np.random.default_rng(1000 * step + rank).integers(0, rows, 64))

    start = kv.num_pushes('emb')
    print("START", start, "RESTARTS", kv.restarts, flush=True)
    for step in range(start, 6):
        if step == 3 and kv.restarts == 0:
            if kv.rank == crashing:
                (flags / 'ready').touch()
                time.sleep(600)                   # its host crashes here
            for _ in range(1200):                 # (the others push step 3 after the crash)
                if (flags / 'crashed').exists():
                    break
                time.sleep(0.1)
        ids = touched(step, kv.rank)
        kv.push('emb', row_sparse_array((np.full((len(ids), dim), kv.rank + 1, np.float32), ids), (rows, dim)))
        kv.row_sparse_pull('emb', row_ids=ids)
        print("STEP", step, repr(time.time()), flush=True)
    ids = np.unique(np.concatenate([touched(s, r) for s in range(6) for r in range(kv.num_workers)]))
    want = init.values('emb', (rows, dim), rows=ids)
    for s in range(6):                            # sgd, learning rate 1, each round's sum of gradients
        grad = np.zeros(len(ids), np.float32)
        for r in range(kv.num_workers):
            grad[np.searchsorted(ids, touched(s, r))] += r + 1
        want -= grad[:, None]
    got = kv.row_sparse_pull('emb', row_ids=ids).data
    print("FINAL", "EXACT" if np.array_equal(got, want) else "WRONG", flush=True)
    kv.close()
""")

#: What each rank of :data:`HOST_LOSS_BIG` prints last when every row it checked is exact.
HOST_LOSS_BIG_FINAL = "FINAL EXACT"


def host_loss_keys_final(workers: int) -> str:
    """What each rank of :data:`HOST_LOSS_KEYS` prints last: key i gets the mean gradient
    (W + 1) / 2 (s + 1) + i at steps s = 0..5, learning rate 1/8 (every figure exact in float32)."""
    return f"FINAL {[-0.125 * sum((workers + 1) / 2 * (s + 1) + i for s in range(6)) for i in range(6)]}"


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=10)


def ns_pids(ns: str) -> list[int]:
    out = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True, timeout=10).stdout
    return [int(x) for x in out.split()]


def kill_namespace(ns: str) -> list[int]:
    """SIGKILL every process in ``ns`` (all started by the test); the pids it found."""
    found = ns_pids(ns)
    for pid in found:
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
    return found


def keygen(path: Path) -> str:
    """A new ed25519 key at ``path``; its public half as ``ssh-ed25519 AAAA...``."""
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "", "-f", str(path)],
                   check=True, timeout=30)
    return " ".join(path.with_suffix(".pub").read_text().split()[:2])


def sshd_config(port: int, address: str, host_key: Path, pid_file: Path, authorized_keys: Path) -> str:
    """An sshd_config for a test host: root by key only, no PAM, quiet."""
    return (f"Port {port}\nListenAddress {address}\nHostKey {host_key}\nPidFile {pid_file}\n"
            f"AuthorizedKeysFile {authorized_keys}\nPermitRootLogin prohibit-password\n"
            "PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
            "MaxSessions 100\nMaxStartups 100:30:200\nLogLevel ERROR\n")


def settled(pids: list[int]) -> bool:
    """None of ``pids`` is a shell starting up with pyenv (root's ``~/.bashrc`` on a developer's
    machine runs ``pyenv rehash``, which holds a lock file on the one disk every test host shares:
    killed there, it would hang every later shell on this machine, which a real crash, on a
    disk of its own, would not)."""
    for pid in pids:
        try:
            if b"pyenv" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return False
        except OSError:
            continue
    return True


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            out.append(child)
            todo.append(child)
    return out

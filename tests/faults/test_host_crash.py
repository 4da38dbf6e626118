"""A host crashes: its link goes down without a word, then every process on it is killed.

The hosts (tests/support/hostcrash.py): four real sshd hosts in two network namespaces, the one
that crashes alone in its own.  The launcher learns of the crash only by the silence: its probe
of a host whose nodes went silent, or its SSH keepalives.  With ``--max-restarts`` the crashed
host's worker restarts with its rank in a spare slot of a live host and resumes from
``kv.num_pushes``; with ``--replicas 2`` its server restarts on a live host with its state
copied back from a replica (no checkpoint directory anywhere); the standby scheduler takes the
job over when the crashed host ran the scheduler.  Each job ends exit 0 with the values of an
uninterrupted run on every rank, and nothing of it is left.
"""
from __future__ import annotations

import ast
import os
import re
import shutil
from pathlib import Path

import pytest

from tests.support import require
from tests.support.hostcrash import CASES, crash_during_job, crash_one_after_another, first_round_after, run_case
from tests.support.hosts import HOST_LOSS_FINAL, SSHD, host_loss_keys_final


@pytest.fixture(autouse=True)
def _possible() -> None:
    """Namespaces need root and iproute2, the hosts OpenSSH's sshd: a failure under CI."""
    require("network namespaces need root" if os.geteuid() != 0 else
            "iproute2 (ip) is not installed" if shutil.which("ip") is None else
            f"{SSHD} is not installed" if not os.path.exists(SSHD) else None,
            "run as root with iproute2 and openssh-server (apt-get install iproute2 openssh-server)")


def test_a_silently_crashed_hosts_worker_restarts_elsewhere_with_exact_values(tmp_path: Path) -> None:
    out, code, took = crash_during_job(
        tmp_path, "node1 slots=1\nnode4 slots=1\nnode3 slots=1   # spare\n", "node4", 1,
        ["-n", "2", "-s", "1", "--max-restarts", "1"],
        {"scheduler": "node1", "server-0": "node1", "worker-0": "node1", "worker-1": "node4"})
    assert code == 0, out
    assert "host node4 does not answer" in out, out
    assert "worker-1 restarts with rank 1 on node3 (local rank 0): its host node4 does not answer" in out, out
    assert "[worker 1 @ node3] START 3 RESTARTS 1" in out, out
    assert out.count(HOST_LOSS_FINAL) == 2, out                  # the uninterrupted run's closed form
    assert re.search(r"succeeded in .*worker 1 moved to node3 \(node4 did not answer\)", out.splitlines()[-2]), out
    assert took < 90, f"the job ended {took:.0f} s after the crash\n{out}"


def test_the_scheduler_hosts_crash_hands_the_job_to_the_standby_with_exact_values(tmp_path: Path) -> None:
    """node1 runs the scheduler and worker 0; node2 the server; node3 worker 1, a spare slot and
    the standby scheduler.  node1 crashes: the standby takes the job over and worker 0 restarts
    on node3."""
    out, code, took = crash_during_job(
        tmp_path, "node1 slots=1\nnode3 slots=2   # one spare\n", "node1", 0,
        ["-n", "2", "-s", "1", "--server-hosts", "node2", "--max-restarts", "1", "--standby-scheduler"],
        {"scheduler": "node1", "scheduler-1": "node3", "server-0": "node2", "worker-0": "node1", "worker-1": "node3"})
    assert code == 0, out
    assert "the standby scheduler on node3 takes the job over at 10.213.9.3:" in out, out
    assert "worker-0 restarts with rank 0 on node3 (local rank 1): its host node1 does not answer" in out, out
    assert "[worker 0 @ node3] START 3 RESTARTS 1" in out, out
    assert out.count(HOST_LOSS_FINAL) == 2, out                  # the uninterrupted run's closed form
    last = out.splitlines()[-2]
    assert "succeeded in" in last and "the standby scheduler on node3 took the job over" in last, out
    assert took < 90, f"the job ended {took:.0f} s after the crash\n{out}"


def test_the_scheduler_hosts_crash_one_after_another_are_survived_with_a_new_standby_each_time(
        tmp_path: Path) -> None:
    """Five hosts: node1 runs the scheduler and worker 0, node2 the standby and worker 1, node3
    the server, node4 and node5 a spare slot each.  node1 crashes: the standby on node2 takes the
    job over, worker 0 moves to a spare slot and a new standby starts on a host that lives.  Then
    node2 crashes: that standby takes the job over, worker 1 moves to the other spare slot, a new
    standby starts again, and each worker ends with the uninterrupted values."""
    out, code, first, second = crash_one_after_another(tmp_path)
    assert code == 0, out
    assert first == {"scheduler": "node1", "scheduler-1": "node2", "server-0": "node3", "worker-0": "node1",
                     "worker-1": "node2"}, first
    assert "the standby scheduler on node2 takes the job over at 10.213.9.2:" in out, out
    new = re.findall(r"a new standby scheduler starts on (node\d) at 10\.213\.9\.(\d):", out)
    assert len(new) == 2 and new[0][0] in ("node3", "node4", "node5"), out
    assert new[1][0] in ({"node3", "node4", "node5"} - {new[0][0]}), out
    spare = {"worker-0": second.pop("worker-0", None)}
    assert second == {"scheduler-1": "node2", "scheduler-2": new[0][0], "server-0": "node3", "worker-1": "node2"} \
        and spare["worker-0"] in ("node4", "node5"), (second, spare)
    assert f"the standby scheduler on {new[0][0]} takes the job over at 10.213.9.{new[0][1]}:" in out, out
    assert f"worker-0 restarts with rank 0 on {spare['worker-0']} (local rank 0): its host node1 does not answer" \
        in out, out
    other = ({"node4", "node5"} - {spare["worker-0"]}).pop()
    assert f"worker-1 restarts with rank 1 on {other} (local rank 0): its host node2 does not answer" in out, out
    assert out.count(HOST_LOSS_FINAL) == 2, out                  # the uninterrupted run's closed form
    last = out.splitlines()[-1]
    assert "succeeded in" in last and \
        f"the standby schedulers on node2, then {new[0][0]} took the job over in turn" in last, out


def test_a_server_and_worker_hosts_crash_is_survived_with_replicas_and_no_checkpoints(tmp_path: Path) -> None:
    """Four hosts, three servers (one each on node1-3, their state copied to the next server),
    three workers and a spare slot on node4; no --checkpoint-dir.  node2 (server 1, worker 1 and
    the idle standby scheduler) crashes: server 1 restarts on node4 with its state copied back
    from server 2's replica, worker 1 in node4's spare slot, and every rank ends with the
    uninterrupted values."""
    out, code, took = run_case(CASES["server"], tmp_path)
    assert code == 0, out
    assert "host node2 does not answer" in out, out
    assert re.search(r"server-1 restarts with rank 1 on node4", out), out
    assert "worker-1 restarts with rank 1 on node4 (local rank 0): its host node2 does not answer" in out, out
    assert "server 1 restored" in out and "from its replica on server 2" in out, out
    assert_resumed_per_key(out, "[worker 1 @ node4]")
    assert_recovered(out, took, ["server 1 moved to node4", "worker 1 moved to node4"])


def test_the_scheduler_hosts_crash_is_survived_with_replicas_and_no_checkpoints(tmp_path: Path) -> None:
    """The same four hosts; node1 runs the scheduler, server 0 and worker 0, and crashes.  The
    standby scheduler (on by default with --replicas 2 on several hosts: node2) takes the job
    over; server 0 restarts on node4 with its state copied back from server 1's replica, worker 0
    in node4's spare slot; every rank ends with the uninterrupted values."""
    out, code, took = run_case(CASES["scheduler"], tmp_path)
    assert code == 0, out
    assert "the standby scheduler on node2 takes the job over at 10.213.9.2:" in out, out
    assert re.search(r"server-0 restarts with rank 0 on node4", out), out
    assert "worker-0 restarts with rank 0 on node4 (local rank 0): its host node1 does not answer" in out, out
    assert "server 0 restored" in out and "from its replica on server 1" in out, out
    assert_resumed_per_key(out, "[worker 0 @ node4]")
    assert_recovered(out, took, ["the standby scheduler on node2 took the job over", "server 0 moved to node4",
                                 "worker 0 moved to node4"])


def test_a_worker_only_hosts_crash_is_survived_with_replicas_and_no_checkpoints(tmp_path: Path) -> None:
    """Servers on node1 and node2 (replicated), workers on node1-3, a spare slot on node4; node3
    (worker 2 only) crashes: worker 2 restarts in node4's spare slot, the servers lose nothing."""
    out, code, took = run_case(CASES["worker"], tmp_path)
    assert code == 0, out
    assert "worker-2 restarts with rank 2 on node4 (local rank 0): its host node3 does not answer" in out, out
    assert "[worker 2 @ node4] START 3 RESTARTS 1" in out, out
    assert "restored" not in out, out                              # no server was touched
    assert_recovered(out, took, ["worker 2 moved to node4"])


def assert_resumed_per_key(out: str, who: str) -> None:
    """The lost worker's replacement resumed per key (docs/reliability.md): the others pushed
    step 3 only after the crash, so the restored server's copy held none of the lost worker's
    three steps on its keys (it resumes them from 0) while the servers that stayed up hold all
    three."""
    found = re.search(re.escape(who) + r" START 0 RESTARTS 1 PUSHES (\{[^}]*\})", out)
    assert found, out
    counts = ast.literal_eval(found[1])
    assert len(counts) == 6 and set(counts.values()) == {0, 3}, counts


def assert_recovered(out: str, took: float, closing: list[str]) -> None:
    """Every rank of HOST_LOSS_KEYS (3 workers) at the uninterrupted closed form, the closing
    line saying ``closing``, and the first round after the crash within a bound (the soak holds
    it to 10 s: benchmarks/faults/soak.py)."""
    assert out.count(host_loss_keys_final(3)) == 3, out          # the uninterrupted run's closed form
    last = out.splitlines()[-2]
    assert "succeeded in" in last and all(words in last for words in closing), out
    first = first_round_after(out)
    print(f"first round {first:.1f} s after the crash; job ended {took:.0f} s after it")
    assert first < 30, f"the first round after the crash completed {first:.1f} s after it\n{out}"

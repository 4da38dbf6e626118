"""What the workers that survive a failure print, and what a misspelt store type prints: one line
each, the user's frames only (never psnode's, never ``Exception ignored in atexit callback``);
and a worker whose server stalls for a while waits for it without a word.

Real scheduler, server and worker processes on 127.0.0.1 (tests/support/cluster.py): no launcher
stops the survivors, so each ends on its own, through its own ``kv.close()`` or the one at exit.
Rank 1 fails once rank 0 has queued its pushes, and rank 0 closes only once the scheduler took
that failure (its status says so), so the job's end reaches rank 0 before or inside its
``close``, however fast its pushes are applied.
"""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tests.support.cli import assert_nothing_left, cli_env, run_cli
from tests.support.cluster import run_job

SURVIVORS = textwrap.dedent("""
    import os, sys, time
    import numpy as np, psnode.kv
    kv = psnode.kv.create('dist_async')
    big = np.ones(4_000_000, np.float32)
    kv.init(0, np.zeros_like(big))
    flag = os.path.join(sys.argv[1], "pushed")
    if kv.rank == 1:
        while not os.path.exists(flag):
            time.sleep(0.005)
        raise ValueError("rank 1 gives up")
    for step in range(10 if kv.rank == 0 else 2):
        kv.push(0, big)
    if kv.rank == 0:
        open(flag, "w").close()
        # closes only once the scheduler took rank 1's failure (the job's end is on its way)
        from psnode.config import NodeConfig
        from psnode.errors import PSError
        from psnode.scheduler import client
        cfg = NodeConfig.from_env()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                nodes = client.status(cfg.scheduler_address, cfg.job_id, key_file=cfg.key_file).nodes
            except PSError:
                break                               # (the scheduler ended with the job)
            if any(n.role == "worker" and n.rank == 1 and n.state != "alive" for n in nodes):
                break
            time.sleep(0.01)
    print("pushed", kv.rank, flush=True)
    if sys.argv[2] == "explicit":
        kv.close()
""")


@pytest.mark.parametrize("close", ["at_exit", "explicit"])
def test_survivors_of_a_failed_worker_say_one_line_and_no_traceback(tmp_path: Path, close: str) -> None:
    job = run_job(SURVIVORS, 3, 1, timeout=90, args=[str(tmp_path), close], tmp=tmp_path,
                  env={"PSNODE_HEARTBEAT_INTERVAL": "0.5"})   # (big pushes on a loaded machine)
    failed = job.workers[1]
    assert failed.code == 1 and "\nValueError: rank 1 gives up\n" in failed.err, failed.err
    expected = {w.rank: f"psnode worker {w.rank}: job {job.job_id} ended: worker 1 on 127.0.0.1 "
                        f"(pid {failed.popen.pid}) failed" for w in job.workers}
    # (the server's same-host link may close before the scheduler's word reaches a survivor: that
    # one line comes first then)
    link = "worker {}: the same-host link to server 0 closed; using TCP"
    said = {w.rank: [line for line in w.err.splitlines() if line.strip() and line != link.format(w.rank)]
            for w in (job.workers[0], job.workers[2])}
    for rank, lines in said.items():   # (rank 2 may have closed before the job ended: nothing to say)
        assert lines in ([], [expected[rank]]), job.workers[rank].err
    assert said[0] == [expected[0]], job.workers[0].err    # rank 0 closed as the job ended


TYPO = textwrap.dedent("""
    import psnode.kv

    def main():
        return psnode.kv.create('dist_synk')

    main()
""")


def test_a_misspelt_store_type_shows_the_users_frames_and_a_guess(tmp_path: Path) -> None:
    home = tmp_path / "home"
    script = tmp_path / "typo.py"
    script.write_text(TYPO)
    res = run_cli(["launch", "-n", "1", "-s", "1", str(script)], cli_env(home))
    assert res.returncode == 1, res.stdout + res.stderr
    streamed = [line.split("] ", 1)[1] for line in res.stdout.splitlines() if line.startswith("[worker 0 @")]
    streamed = [line for line in streamed if line.strip(" ^~")]       # (Python 3.11's markers under a call)
    error = ("psnode.errors.ConfigError: unknown KVStore type 'dist_synk': did you mean 'dist_sync'? "
             "use one of local, dist_sync, dist_async, dist_ssp (or MXNet's ")
    assert streamed[:6] == [
        "Traceback (most recent call last):",
        f'  File "{script}", line 7, in <module>',
        "    main()",
        f'  File "{script}", line 5, in main',
        "    return psnode.kv.create('dist_synk')",
        streamed[5],
    ], res.stdout
    assert streamed[5].endswith("frames inside psnode not shown)") and streamed[6].startswith(error), res.stdout
    assert len(streamed) == 7, res.stdout
    assert "did you mean 'dist_sync'?" in res.stderr     # the panel's root cause
    assert_nothing_left(home)


STEADY = textwrap.dedent("""
    import os, sys, time
    import numpy as np, psnode.kv
    kv = psnode.kv.create('dist_sync')
    kv.init(0, np.zeros(4, np.float32))
    out = np.empty(4, np.float32)
    open(os.path.join(sys.argv[1], "ready"), "w").close()
    end = time.monotonic() + 6.0
    steps = 0
    while time.monotonic() < end:
        kv.push(0, np.ones(4, np.float32)); kv.pull(0, out=out); steps += 1
        time.sleep(0.01)
    print("steps", steps, "value", float(out[0]), flush=True)
    kv.close()
""")


def test_a_server_silent_for_less_than_its_last_resend_is_waited_for_quietly(tmp_path: Path) -> None:
    """A server that stops for 2.5 s (SIGSTOP: a stall, as under memory pressure) answers a resend:
    the worker says nothing (no "sending again" warning), and the job ends well."""
    import os
    import signal
    import time

    from tests.support.cluster import start_job, wait_for_file, wait_job

    job = start_job(STEADY, 1, 1, args=[str(tmp_path)], tmp=tmp_path,
                    env={"PSNODE_HEARTBEAT_INTERVAL": "1.0", "PSNODE_RETRY_TIMEOUT": "1.0"})
    wait_for_file(tmp_path / "ready")
    server = job.by_role("server")[0]
    time.sleep(0.5)
    os.kill(server.popen.pid, signal.SIGSTOP)
    try:
        time.sleep(2.5)
    finally:
        os.kill(server.popen.pid, signal.SIGCONT)
    wait_job(job, 60)
    worker = job.workers[0]
    assert [p.code for p in job.procs] == [0, 0, 0], job.describe()
    assert worker.out.startswith("steps "), job.describe()
    assert worker.err == "", worker.err

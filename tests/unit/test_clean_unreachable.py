"""``mxdist clean`` and a job whose host is gone: the warning worded as every SSH error (the host
named once, no library text), and ``--forget-unreachable`` forgets the record.

The host is a real TCP listener that accepts each connection and closes it unanswered (as an
address that now belongs to something else, or an sshd refusing at start-up): paramiko's words
for it are "Error reading SSH protocol banner".
"""
from __future__ import annotations

import contextlib
import os
import socket
import threading

import pytest
from typer.testing import CliRunner

from mxdist.job import records
from mxdist.job.records import JobRecord, JobState, ProcRecord
from mxdist.main import app

runner = CliRunner()


@pytest.fixture
def silent_host():
    """(address, port) of a listener that closes every connection unanswered."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        listener.settimeout(0.2)
        done = threading.Event()

        def refuse() -> None:
            while not done.is_set():
                with contextlib.suppress(OSError):
                    conn, _ = listener.accept()
                    conn.close()

        thread = threading.Thread(target=refuse, daemon=True)
        thread.start()
        yield listener.getsockname()
        done.set()
        thread.join(5)


def _gone_job(job_id: str, address: str, port: int, tmp_path) -> None:
    records.save(JobRecord(
        id=job_id, command=["t.py"], backend="ssh", scheduler=f"{address}:1", workdir="/w",
        hosts=[{"name": address, "address": address, "port": port}],
        options={"workdir": "/w", "python": "python3", "ssh_config": str(tmp_path / "none"),
                 "known_hosts": str(tmp_path / "known"), "connect_timeout": 2.0},
        procs=[ProcRecord(name="worker-0", role="worker", rank=0, host=f"{address}:port={port}", address=address,
                          log="/nonexistent.log", pid=2**22 + 7, run_log="/r/worker-0.log", rc_file="/r/worker-0.rc")],
        state=JobState.FAILED, created=1.0, ended=2.0, run_dir="/r"))


def test_clean_keeps_a_job_whose_host_is_gone_then_forgets_it_when_asked(home, silent_host, tmp_path):
    address, port = silent_host
    _gone_job("job-gone", address, port, tmp_path)
    result = runner.invoke(app, ["clean", "job-gone"])
    text = " ".join(result.output.split())
    assert result.exit_code == 0, text
    assert "removed 0 jobs" in text
    label = f"{address}:port={port}"
    assert (f"kept job-gone: {label}: {address}:{port} closed the connection before SSH's greeting") in text, text
    assert text.count(f"{address}:") == 2          # the host once, then where the connection went
    assert "Error reading SSH protocol banner" not in text and "SSHException" not in text
    assert "mxdist clean --forget-unreachable job-gone forgets it" in text, text
    assert records.record_path("job-gone").is_file()

    result = runner.invoke(app, ["clean", "--forget-unreachable", "job-gone"])
    text = " ".join(result.output.split())
    assert result.exit_code == 0, text
    assert "removed 1 job: job-gone" in text, text
    assert (f"forgot job-gone: {label} did not answer; what the job left there stays (its run directory /r)") \
        in text, text
    assert not records.record_path("job-gone").exists()
    assert not os.path.exists(records.log_dir("job-gone"))

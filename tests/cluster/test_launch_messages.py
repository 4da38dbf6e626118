"""What a failed job says, on this machine: each place a user looks names the failure once (the
streamed traceback, the panel, the closing line; every other process one short line), every
consequence reads the same, and a psnode API error in a training script shows the script's
frames and the fix, not psnode's internals.  Through a pipe, as ``mxdist launch ... | tee``.
"""
from __future__ import annotations

import textwrap
from pathlib import Path

from tests.support.cli import assert_nothing_left, cli_env, latest, run_cli

RAISES = textwrap.dedent("""
    import time, numpy as np, psnode
    kv = psnode.kv.create('dist_sync')
    kv.init('w', np.zeros(2, np.float32))
    for step in range(200):
        if kv.rank == 1 and step == 3:
            raise ValueError(f"bad batch at step {step}")
        kv.push('w', np.ones(2, np.float32)); kv.pull('w')
        time.sleep(0.02)
    kv.close()
""")

WRONG_DTYPE = textwrap.dedent("""
    import numpy as np, psnode
    kv = psnode.kv.create('dist_sync')
    kv.init('w', np.zeros(3, np.float32))

    def train_step(grad):
        kv.push('w', grad)

    train_step(np.ones(3))          # float64
""")


def flat(text: str) -> str:
    return " ".join(text.replace("│", " ").split())


def test_a_failure_is_said_once_per_place_and_every_consequence_reads_the_same(tmp_path):
    home = tmp_path / "home"
    script = tmp_path / "job.py"
    script.write_text(RAISES)
    res = run_cli(["launch", "-n", "2", "-s", "2", str(script)], cli_env(home))
    out = res.stdout + res.stderr
    assert res.returncode == 1, out
    job = latest(home)["id"]
    # the streamed traceback, the panel's headline, the closing line: once each
    assert out.count("bad batch at step 3") == 3, out
    assert "[worker 1 @ localhost] ValueError: bad batch at step 3" in res.stdout
    text = flat(res.stderr)
    assert "╭─ job failed ─" in text and "╮ worker 1 on localhost: ValueError: bad batch at step 3 then:" in text, text
    assert f"job {job} failed in " in text and text.endswith(": worker 1 on localhost: ValueError: bad batch at step 3")
    # every other process: one short line naming who failed
    lines = [line for line in res.stdout.splitlines() if not line.startswith("[worker 1 @")]
    said = [line for line in lines if line.startswith("[scheduler @ localhost]") and "ending" in line]
    assert len(said) == 1 and said[0].endswith("failed") and f"job {job} ending: worker 1 on 127.0.0.1" in said[0]
    for who in ("server 0", "server 1"):
        said = [line for line in lines if line.startswith(f"[{who} @ localhost]")]
        assert len(said) == 1 and said[0].endswith("failed") and "worker 1 on 127.0.0.1" in said[0], res.stdout
    said = [line for line in lines if line.startswith("[worker 0 @ localhost]")]
    assert len(said) == 1 and said[0].endswith("failed") and f"job {job} ended: worker 1" in said[0], res.stdout
    # the panel: every process the failure took down, in the same words; the log's path (its tail
    # was streamed above)
    for who in ("scheduler", "server 0", "server 1", "worker 0"):
        assert f"{who} on localhost: ended with the job" in text, text
    assert ": stopped" not in text and "exit code" not in text
    assert f"log: {home}/jobs/{job}/worker-1.log" in text and "Traceback" not in res.stderr
    assert_nothing_left(home)


def test_a_psnode_error_in_a_script_shows_the_scripts_frames_and_the_fix(tmp_path):
    home = tmp_path / "home"
    script = tmp_path / "job.py"
    script.write_text(WRONG_DTYPE)
    res = run_cli(["launch", "-n", "1", "-s", "1", str(script)], cli_env(home))
    assert res.returncode == 1, res.stdout + res.stderr
    streamed = [line.split("] ", 1)[1] for line in res.stdout.splitlines() if line.startswith("[worker 0 @")]
    streamed = [line for line in streamed if line.strip(" ^~")]       # (Python 3.11's markers under a call)
    start = streamed.index("Traceback (most recent call last):")
    assert streamed[start:] == [
        "Traceback (most recent call last):",
        f'  File "{script}", line 9, in <module>',
        "    train_step(np.ones(3))          # float64",
        f'  File "{script}", line 7, in train_step',
        "    kv.push('w', grad)",
        streamed[start + 5],
        "psnode.errors.DTypeMismatch: key 'w' holds float32[3]; got float64[3]: convert it with .astype(np.float32)",
    ], res.stdout
    assert streamed[start + 5].endswith("frames inside psnode not shown)")
    assert "psnode/" not in res.stdout.replace(str(Path(script).parent), "")
    assert latest(home)["root_cause"]["headline"] == (
        "worker 0 on localhost: DTypeMismatch: key 'w' holds float32[3]; got float64[3]: convert it with "
        ".astype(np.float32)")
    assert_nothing_left(home)

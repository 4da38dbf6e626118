"""The host agent's reading of a log's last error (the root cause of a process without a failure record)."""
from __future__ import annotations

from pathlib import Path

from mxdist.backends import agent


def test_an_argparse_error_after_its_usage_is_the_cause(tmp_path: Path) -> None:
    log = tmp_path / "w.log"
    log.write_text("started\nusage: train.py [-h] [--lr LR]\n                [--epochs N]\n"
                   "train.py: error: unrecognized arguments: --bogus\n")
    assert agent.last_exception(str(log)) == "train.py: error: unrecognized arguments: --bogus"


def test_another_programs_error_line_is_no_usage_error(tmp_path: Path) -> None:
    log = tmp_path / "w.log"
    log.write_text("started rank 1\nrank 1 gives up\nsrun: error: 127.0.0.3: task 0: Exited with exit code 3\n")
    assert agent.last_exception(str(log)) is None


def test_the_last_traceback_wins(tmp_path: Path) -> None:
    log = tmp_path / "w.log"
    log.write_text("Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\n"
                   "ValueError: bad batch at step 3\n")
    assert agent.last_exception(str(log)) == "ValueError: bad batch at step 3"

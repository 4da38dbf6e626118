"""What a user's mistake looks like: psnode's API errors (the caller's frames, the fix), and the
preflight check of a job's command (:func:`mxdist.backends.agent.command_problem`), without processes."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

import psnode
from mxdist.backends.agent import command_problem
from mxdist.planning.plan import command_target
from psnode.errors import DTypeMismatch, KeyNotInitialized, ShapeMismatch, user_traceback


def test_a_dtype_mismatch_is_named_so_with_the_astype_to_use():
    kv = psnode.kv.create("local")
    try:
        kv.init("w", np.zeros(3, np.float32))
        with pytest.raises(DTypeMismatch) as got:
            kv.push("w", np.ones(3))                        # float64
        assert str(got.value) == ("key 'w' holds float32[3]; got float64[3]: convert it with "
                                  ".astype(np.float32)")
        assert isinstance(got.value, ShapeMismatch)        # caught as before
        with pytest.raises(DTypeMismatch, match=r"pull into a float32 array \(np.empty\(\(3,\), np.float32\)\)"):
            kv.pull("w", out=np.empty(3, np.float64))
        with pytest.raises(ShapeMismatch) as shape:
            kv.push("w", np.ones(4, np.float32))
        assert type(shape.value) is ShapeMismatch and str(shape.value) == "key 'w' holds float32[3]; got float32[4]"
    finally:
        kv.close()


def _raise_from_user_code(kv):
    kv.pull("nope")


def test_an_uncaught_psnode_error_shows_the_callers_frames_only():
    kv = psnode.kv.create("local")
    try:
        try:
            _raise_from_user_code(kv)
        except KeyNotInitialized as exc:
            text = user_traceback(type(exc), exc, exc.__traceback__)
    finally:
        kv.close()
    lines = text.splitlines()
    assert lines[0] == "Traceback (most recent call last):"
    assert f'File "{__file__}"' in text and "_raise_from_user_code" in text and 'kv.pull("nope")' in text
    assert os.path.dirname(psnode.__file__) not in text                 # none of psnode's own frames
    assert lines[-2].startswith("  (") and lines[-2].endswith("frames inside psnode not shown)")
    assert lines[-1] == ("psnode.errors.KeyNotInitialized: key 'nope' is not initialised: "
                         "call kv.init('nope', value) first")


def test_a_local_store_installs_the_short_display_while_open():
    before = sys.excepthook
    kv = psnode.kv.create("local")
    try:
        assert sys.excepthook is not before
    finally:
        kv.close()
    assert sys.excepthook is before


def test_the_command_to_check_on_every_host(tmp_path):
    assert command_target(["train.py", "--epochs", "3"]) == ("script", "train.py")
    assert command_target(["hostname"]) == ("program", "hostname")
    (tmp_path / "train.py").write_text("")
    (tmp_path / "run.sh").write_text("#!/bin/sh\n")
    wd = str(tmp_path)
    assert command_problem(wd, "script", "train.py") is None
    assert command_problem(wd, "script", "nosuch.py") == f"no script nosuch.py in {wd}"
    assert command_problem(wd, "script", "/abs/nosuch.py") == "no script /abs/nosuch.py"
    assert command_problem(wd, "program", "./run.sh") == f"./run.sh in {wd} is not an executable file"
    os.chmod(tmp_path / "run.sh", 0o755)
    assert command_problem(wd, "program", "./run.sh") is None
    assert command_problem(wd, "program", "./nosuch") == f"no program ./nosuch in {wd}"
    assert command_problem(wd, "program", "sh") is None
    assert command_problem(wd, "program", "sh", {"PATH": str(tmp_path)}) == f"sh: command not found (PATH={wd})"

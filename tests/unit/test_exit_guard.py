"""psnode's exit guard (psnode/exitguard/sitecustomize.py) and how the host agent hands it to
every process it starts: real Pythons, real ``torch.distributed`` where it matters."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import psnode
from mxdist.backends import agent
from mxdist.supervisor.setup import free_listen_port
from tests.support import require, wait_for

GUARD = str(Path(psnode.__file__).parent / "exitguard")


def python(code: str, pythonpath: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MXDIST_EXIT_GUARD")}
    full.update(env, PYTHONPATH=os.pathsep.join(pythonpath))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=full, capture_output=True,
                          text=True, timeout=120)


def test_the_agent_finds_this_hosts_guard_without_importing_psnode() -> None:
    assert agent.exit_guard_dir() == GUARD
    assert os.path.isfile(os.path.join(GUARD, "sitecustomize.py"))


def test_the_guard_goes_first_on_the_pythonpath_once() -> None:
    assert agent.with_exit_guard({}, GUARD) == {"PYTHONPATH": GUARD}
    got = agent.with_exit_guard({"PYTHONPATH": os.pathsep.join(["/a", GUARD, "", "/b"])}, GUARD)
    assert got["PYTHONPATH"] == os.pathsep.join([GUARD, "/a", "/b"])
    assert agent.with_exit_guard({"PYTHONPATH": "/a", "MXDIST_EXIT_GUARD": "0"}, GUARD)["PYTHONPATH"] == "/a"
    assert agent.with_exit_guard({"PYTHONPATH": "/a"}, None) == {"PYTHONPATH": "/a"}


def test_a_spawned_process_imports_the_guard(tmp_path: Path) -> None:
    code = "import os, sitecustomize; print(sitecustomize.__file__); print(os.environ['PYTHONPATH'])"
    env = {"PYTHONPATH": "/elsewhere"}
    [started] = agent.spawn(str(tmp_path), str(tmp_path / "run"), sys.executable,
                            [agent.SpawnItem("worker-0", [sys.executable, "-c", code], env,
                                             str(tmp_path / "run" / "worker-0.failure"))])
    wait_for(lambda: os.path.exists(started.rc), 60, "the process's exit status")
    assert Path(started.rc).read_text() == "0"
    lines = Path(started.log).read_text().splitlines()
    assert lines == [os.path.join(GUARD, "sitecustomize.py"), os.pathsep.join([GUARD, "/elsewhere"])]


def test_the_hidden_sitecustomize_still_runs(tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text("print('the user sitecustomize ran', flush=True)\n")
    res = python("print('script')", [GUARD, str(tmp_path)])
    assert (res.returncode, res.stdout) == (0, "the user sitecustomize ran\nscript\n"), res.stderr


SCRIPT = """
    import atexit
    import torch.distributed as dist
    real = dist.destroy_process_group
    def destroy(*a, **k):
        print("destroyed by the guard", flush=True)
        return real(*a, **k)
    dist.destroy_process_group = destroy
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:{port}", rank=0, world_size=1)
    atexit.register(print, "the script's own atexit ran", flush=True)
    print("done", flush=True)
"""


def test_the_guard_ends_a_live_process_group_after_the_scripts_atexit() -> None:
    require(None if importlib.util.find_spec("torch") else "torch is not installed",
            "pip install -e '.[test,frameworks]'")
    code = SCRIPT.format(port=free_listen_port("127.0.0.1"))
    res = python(code, [GUARD])
    assert (res.returncode, res.stdout) == (0, "done\nthe script's own atexit ran\ndestroyed by the guard\n"), \
        res.stderr
    off = python(SCRIPT.format(port=free_listen_port("127.0.0.1")), [GUARD], MXDIST_EXIT_GUARD="0")
    assert off.stdout == "done\nthe script's own atexit ran\n", off.stderr


def test_a_process_without_torch_is_untouched() -> None:
    res = python("import sys; print('torch.distributed' in sys.modules)", [GUARD])
    assert (res.returncode, res.stdout) == (0, "False\n"), res.stderr

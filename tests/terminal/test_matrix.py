"""Every command that draws, as users run it, on every backend: in a real terminal (a pty with a
size, its screen replayed by :class:`~tests.support.terminal.Screen`), through a pipe, and in
a dumb terminal (TERM=dumb); on this machine, on the sshd hosts of tests/ssh and in the Slurm
cluster of tests/slurm (one :class:`Target` each, module-scoped).

=====================================  ==========================  ==========================
command                                terminal                    pipe / TERM=dumb
=====================================  ==========================  ==========================
launch (a psnode job to its end)       lines, closing line, no     no escape codes / no
                                       spinner left                cursor moves
launch + Ctrl-C (job running)          exit 130 within seconds,    (tests/cluster: ``| tee``,
                                       every host clean            ``| head``)
launch + Ctrl-C (preflight spinner)    ssh, slurm: exit 130 within
                                       PROMPT, cursor shown again
launch nosuch.py                       refused per host, exit 3
launch --sync (ssh; others refuse it)  one bar, left full          one line when done
status                                 table: job, hosts, rows     the same, plain
status --watch                         q / Ctrl-C: ends within     frame after frame; Ctrl-C
                                       PROMPT, one frame left      (pipe), q (dumb)
logs, logs --role --rank               prefixed lines / raw bytes  the same
logs -f                                new lines; Ctrl-C: 130      ``| head -3`` ends with head
                                       within PROMPT (also dumb)
jobs                                   the running job's row       the same
stop                                   each host clean             already stopped / nothing
                                                                   running, exit 0
logs, status of the ended job          from the local copies
clean                                  asks; y removes all         refused without --yes / n
=====================================  ==========================  ==========================

The running job is one detached psnode job per backend (``running``), shared by the status,
watch, logs and jobs cases and ended by the stop case; every job ends with nothing of it left
on any host.  (The ``Ctrl-C`` through ``| tee`` and ``| head`` of an attached launch, and SIGHUP
on closing the terminal, are in tests/cluster/test_launch_lifecycle.py.)
"""
from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.support import Drained, wait_for
from tests.support.cli import ROOT, assert_nothing_left, cli_env, latest, records
from tests.support.slurm_launch import job_processes
from tests.support.terminal import COLS, Screen, Terminal, terminal_env

MXDIST = [sys.executable, "-m", "mxdist"]
PROMPT = 2.0        # seconds within which q or Ctrl-C ends a command that would run on
LAUNCH_PROMPT = 3.0  # ... and an attached launch, which stops the job on every host first (0.5-0.9 s here)
CURSOR_MOVES = re.compile(r"\x1b\[\d*[ABK]")   # what redrawing in place needs (a dumb terminal gets none)

QUICK = textwrap.dedent("""
    import numpy as np, psnode
    kv = psnode.kv.create('dist_sync')
    kv.init('w', np.zeros(2, np.float32))
    kv.push('w', np.full(2, kv.rank + 1, np.float32))
    print("rank", kv.rank, "of", kv.num_workers, "pulled", kv.pull('w').tolist(), flush=True)
    kv.close()
""")

TICKER = textwrap.dedent("""
    import time, numpy as np, psnode
    kv = psnode.kv.create('dist_sync')
    kv.init('w', np.zeros(2, np.float32))
    for i in range(600):
        kv.push('w', np.ones(2, np.float32)); kv.pull('w')
        print("tick", i, "rank", kv.rank, flush=True)
        time.sleep(0.2)
""")


@dataclass
class Target:
    """One backend as the matrix uses it: how a user launches there and what status shows."""

    name: str
    home: Path
    env: dict[str, str]                 # the environment of a pipe (a terminal's: terminal_env)
    hosts: tuple[str, ...]              # host labels in status, stop, logs
    flags: list[str]                    # launch flags that pick the backend (-H ..., --launcher slurm)
    inside: Callable[[list[str]], list[str]] = lambda argv: argv   # an attached launch as typed (salloc ...)
    cwd: Path = ROOT
    scripts: dict[str, str] = field(default_factory=dict)
    nothing_left: Callable[[str], None] = lambda job: None
    cleanups: list[Callable[[], None]] = field(default_factory=list)

    def script(self, name: str, text: str) -> str:
        if name not in self.scripts:
            path = self.cwd / name
            path.write_text(text)
            self.scripts[name] = str(path)
        return self.scripts[name]

    def launch_argv(self, *args: str) -> list[str]:
        return self.inside([*MXDIST, "launch", *self.flags, *args])

    def term(self, argv: list[str], term: str = "xterm-256color", cols: int = COLS) -> Terminal:
        return Terminal(argv, terminal_env(self.env, term), cwd=self.cwd, cols=cols)

    def mxdist(self, *args: str, term: str = "xterm-256color") -> Terminal:
        return self.term([*MXDIST, *args], term)

    def pipe(self, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*MXDIST, *args], env=self.env, cwd=self.cwd, capture_output=True, text=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)


# -- the three backends --------------------------------------------------------------------------

def _local(tmp: Path) -> Target:
    home = tmp / "home"
    t = Target("local", home, cli_env(home), ("localhost",), [], cwd=tmp)
    t.nothing_left = lambda job: assert_nothing_left(home)
    return t


def _ssh(tmp: Path, cluster) -> Target:
    home = tmp / "home"
    t = Target("ssh", home, cluster.env(home), ("node1", "node2"), ["-H", "node1,node2"], cwd=tmp)
    t.nothing_left = lambda job: assert_nothing_left(home)
    return t


def _slurm(tmp: Path, cluster) -> Target:
    home = tmp / "home"
    env = cluster.env(cli_env(home))
    t = Target("slurm", home, env, ("127.0.0.2", "127.0.0.3"), ["--launcher", "slurm"], cwd=tmp)
    t.inside = lambda argv: ["salloc", "-N2", "--immediate=30", *argv]
    t.nothing_left = lambda job: _slurm_nothing_left(cluster, job)
    return t


def _make(name: str, tmp: Path, request: pytest.FixtureRequest) -> Target:
    if name == "local":
        t = _local(tmp)
    elif name == "ssh":
        t = _ssh(tmp, request.getfixturevalue("ssh_cluster"))
    else:
        t = _slurm(tmp, request.getfixturevalue("slurm3"))
    t.home.mkdir()
    return t


def _slurm_nothing_left(cluster, job: str) -> None:
    """No step of ``job`` in Slurm's queue, no process of it anywhere (other jobs may run)."""
    wait_for(lambda: not [s for s in cluster.steps() if f" mxdist.{job}." in f" {s.split()[1]}"]
             and not job_processes(job), 15, f"the end of every step and process of job {job}",
             describe=lambda: f"steps {cluster.steps()}, pids {job_processes(job)}")


@pytest.fixture(scope="module", params=["local", "ssh", "slurm"])
def target(request, tmp_path_factory) -> Iterator[Target]:
    t = _make(request.param, tmp_path_factory.mktemp(f"matrix-{request.param}"), request)
    try:
        yield t
    finally:
        for clean in reversed(t.cleanups):
            clean()


def flat(text: str) -> str:
    return " ".join(text.replace("│", " ").split())


def nospace(text: str) -> str:
    """``text`` without panel borders and whitespace: a phrase a panel wrapped reads whole."""
    return "".join(text.replace("│", " ").split())


def ended_within(term: Terminal, seconds: float, what: str) -> int:
    """The exit code of ``term``'s command, which must end within ``seconds``."""
    t0 = time.monotonic()
    code = term.wait(60)
    took = time.monotonic() - t0
    assert took < seconds, f"{what} took {took:.1f} s to end (at most {seconds:g}); the screen:\n{term.screen().text()}"
    return code


def no_escapes(text: str) -> None:
    assert "\x1b" not in text, f"escape codes in output that is not a terminal:\n{text!r}"


# -- attached launches ---------------------------------------------------------------------------

def test_launch_in_a_terminal_runs_to_its_end(target):
    with target.term(target.launch_argv("-n", "2", "-s", "2", target.script("quick.py", QUICK))) as term:
        assert term.wait(90) == 0, term.screen().text()
        screen = term.screen().flat()
    for rank, host in ((0, target.hosts[0]), (1, target.hosts[-1])):
        assert f"[worker {rank} @ {host}] rank {rank} of 2 pulled [1.5, 1.5]" in screen, screen
    job = latest(target.home)["id"]
    assert f"job {job} succeeded in" in screen
    assert "preflight: checking" not in screen        # the spinner is gone once preflight is done
    target.nothing_left(job)


@pytest.mark.parametrize("mode", ["pipe", "dumb"])
def test_launch_through_a_pipe_and_in_a_dumb_terminal(target, mode):
    argv = target.launch_argv("-n", "2", "-s", "1", target.script("quick.py", QUICK))
    if mode == "pipe":
        res = subprocess.run(argv, env=target.env, cwd=target.cwd, capture_output=True, text=True, timeout=90)
        out, code = res.stdout + res.stderr, res.returncode
        no_escapes(out)
    else:
        with target.term(argv, term="dumb") as term:
            code = term.wait(90)
            out = term.raw()
        assert not CURSOR_MOVES.search(out), out
    assert code == 0, out
    assert "rank 1 of 2 pulled [1.5, 1.5]" in out and "succeeded in" in out
    target.nothing_left(latest(target.home)["id"])


def test_a_missing_script_is_refused_on_every_host_before_anything_starts(target):
    before = [r["id"] for r in records(target.home)]
    with target.term(target.launch_argv("-n", "2", "-s", "1", "nosuch.py", "--epochs", "3")) as term:
        code = term.wait(60)
        screen = term.screen().flat()
    assert code == 3, screen
    assert "preflight failed: nothing was started" in screen and "no job recorded" in screen
    assert [r["id"] for r in records(target.home)] == before
    text = nospace(screen)
    fix = "checkthepath" if target.name != "ssh" else "copyittothesamepathonthathost"
    for host in target.hosts:
        assert f"{host}:noscriptnosuch.pyin{target.cwd}fix:{fix}" in text, screen


def test_ctrl_c_in_a_terminal_stops_the_job_on_every_host(target):
    with target.term(target.launch_argv("-n", "2", "-s", "1", target.script("ticker.py", TICKER))) as term:
        term.wait_for(lambda s: "tick 2 rank 0" in s and "tick 2 rank 1" in s, 90, "both workers' ticks")
        term.ctrl_c()
        code = ended_within(term, LAUNCH_PROMPT, "launch after Ctrl-C")
        screen = term.screen().flat()
    rec = latest(target.home)
    assert code == 130 and rec["state"] == "stopped" and rec["stopped_by"] == "Ctrl-C", screen
    assert f"job {rec['id']} stopped after" in screen and "Ctrl-C: stopping the job on every host" in screen
    target.nothing_left(rec["id"])


@pytest.mark.parametrize("backend", ["ssh", "slurm"])   # (a local preflight runs in the launcher, at once)
def test_ctrl_c_during_preflights_spinner(backend, request, tmp_path):
    """A host slow to answer preflight (its --python takes 10 s to start, the first time): the
    spinner turns, Ctrl-C ends the launch at once and leaves neither the spinner nor a hidden
    cursor behind."""
    target = _make(backend, tmp_path, request)
    slow = tmp_path / "slow-python"
    first = tmp_path / "first-call"
    slow.write_text(f"#!/bin/sh\nmkdir {first} 2>/dev/null && sleep 10\nexec {shlex.quote(sys.executable)} \"$@\"\n")
    slow.chmod(0o755)
    argv = target.launch_argv("--python", str(slow), "-n", "2", "-s", "1", target.script("quick.py", QUICK))
    with target.term(argv) as term:
        term.wait_for(lambda s: "preflight: checking 2 host(s)" in s, 60, "the preflight spinner")
        term.ctrl_c()
        code = ended_within(term, PROMPT, "launch after Ctrl-C during preflight")
        screen = term.screen().flat()
        raw = term.raw()
    rec = latest(target.home)
    assert code == 130 and rec["state"] == "stopped", screen
    assert f"job {rec['id']} stopped after" in screen and "preflight: checking" not in screen
    assert raw.rfind("\x1b[?25h") > raw.rfind("\x1b[?25l"), "the cursor is left hidden"
    target.nothing_left(rec["id"])
    assert all(p["pid"] is None for p in rec["procs"])       # nothing was started


def test_sync_progress(target, tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    (project / "quick.py").write_text(QUICK)
    (project / "data.bin").write_bytes(os.urandom(3 << 20))
    remote = tmp_path / "remote-project"
    args = ["-n", "1", "-s", "1", "--sync", f"{project}:{remote}", "--workdir", str(remote), "quick.py"]
    if target.name != "ssh":
        with target.term([*MXDIST, "launch", *target.flags, *args]) as term:
            assert term.wait(60) == 2
            screen = term.screen().flat()
        assert "invalid launch options" in screen and "--sync" in screen, screen
        return
    argv = [*MXDIST, "launch", "-H", "node1", *args]     # one host: on this machine every host is one disk
    with target.term(argv, cols=240) as term:
        assert term.wait(90) == 0, term.screen().text()
        screen = term.screen().text()
    bars = [line for line in screen.splitlines() if line.startswith(f"sync {project} -> {remote}")]
    assert len(bars) == 1 and "3.1/3.1 MB" in bars[0], screen       # drawn in place, left finished
    assert "rank 0 of 1 pulled [1.0, 1.0]" in flat(screen)
    res = subprocess.run(argv, env=target.env, cwd=target.cwd, capture_output=True, text=True, timeout=90)
    assert res.returncode == 0, res.stderr
    no_escapes(res.stderr)          # one line when done: what was copied (nothing now: unchanged files)
    lines = [line for line in res.stderr.splitlines() if line.startswith("sync")]
    assert len(lines) == 1 and lines[0].startswith(f"sync {project} -> {remote}: 3.1 MB in "), res.stderr
    with target.term(argv, term="dumb") as term:
        assert term.wait(90) == 0
        assert not CURSOR_MOVES.search(term.raw())
        assert f"sync{project}->{remote}:3.1MBin" in "".join(term.screen().text().split())
    target.nothing_left(latest(target.home)["id"])


# -- a running job: status, watch, logs, jobs; then stop ---------------------------------------------

@dataclass
class Running:
    target: Target
    job: str


@pytest.fixture(scope="module")
def running(target) -> Running:
    """A detached psnode job of two workers ticking until stopped (by test_stop_in_a_terminal)."""
    ticker = target.script("ticker.py", TICKER)
    if target.name == "slurm":
        done = target.cwd / "allocation-done"
        argv = shlex.join([*MXDIST, "launch", "--launcher", "slurm", "-d", "-n", "2", "-s", "1", ticker])
        keep = f"{argv} && while [ ! -e {shlex.quote(str(done))} ]; do sleep 0.2; done"
        alloc = subprocess.Popen(["salloc", "-N2", "--immediate=30", "sh", "-c", keep], env=target.env,
                                 cwd=target.cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

        def release() -> None:
            done.touch()
            try:
                alloc.wait(30)
            except subprocess.TimeoutExpired:
                alloc.kill()
                alloc.wait(10)

        target.cleanups.append(release)
        before = {r["id"] for r in records(target.home)}
        job = wait_for(lambda: [r["id"] for r in records(target.home) if r["id"] not in before], 60,
                       "the detached job's record")[0]
    else:
        res = target.pipe("launch", *target.flags, "-d", "-n", "2", "-s", "1", ticker)
        assert res.returncode == 0, res.stdout + res.stderr
        job = res.stdout.split()[-1]
    target.cleanups.append(lambda: (target.pipe("stop", job), target.nothing_left(job)))
    wait_for(lambda: all("tick 3 rank" in Path(p["log"]).read_text() for p in latest(target.home)["procs"]
                         if p["role"] == "worker" and Path(p["log"]).exists()) and
             sum(p["role"] == "worker" and Path(p["log"]).exists() for p in latest(target.home)["procs"]) == 2,
             60, "both workers to tick")
    return Running(target, job)


def _status_shows(running: Running, text: str) -> None:
    t = flat(text)
    assert f"job {running.job} running" in t, text
    for host in running.target.hosts:
        assert host in t, text
    assert "scheduler" in t and "server 0" in t and "worker 0" in t and "worker 1" in t, text


@pytest.mark.parametrize("mode", ["terminal", "pipe", "dumb"])
def test_status(running, mode):
    t = running.target
    if mode == "pipe":
        res = t.pipe("status", running.job)
        assert res.returncode == 0, res.stderr
        no_escapes(res.stdout + res.stderr)
        _status_shows(running, res.stdout)
        return
    with t.mxdist("status", running.job, term="dumb" if mode == "dumb" else "xterm-256color") as term:
        assert term.wait(30) == 0
        _status_shows(running, term.screen().text())
        if mode == "dumb":
            assert not CURSOR_MOVES.search(term.raw())


@pytest.mark.parametrize("key", ["q", "ctrl-c"])
def test_status_watch_quits_at_once_and_leaves_one_frame(running, key):
    t = running.target
    with t.mxdist("status", running.job, "--watch", "--interval", "0.3") as term:
        term.wait_for(lambda s: f"job {running.job}" in s and "worker 1" in s, 30, "the table")
        frames = len(term.raw())
        wait_for(lambda: len(term.raw()) > frames, 10, "a redraw")           # it refreshes
        term.type(b"q") if key == "q" else term.ctrl_c()
        code = ended_within(term, PROMPT, f"status --watch after {key}")
        screen = term.screen().text()
    assert code == 0
    _status_shows(running, screen)
    assert screen.count(f"job {running.job}") == 1, screen                    # one frame, not a copy per redraw
    assert screen.count("worker 1") == 1 and not screen.rstrip().endswith("^C"), screen


def test_status_watch_through_a_pipe_and_in_a_dumb_terminal(running):
    t = running.target
    proc = subprocess.Popen([*MXDIST, "status", running.job, "--watch", "--interval", "0.3"], env=t.env, cwd=t.cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            stdin=subprocess.DEVNULL)
    drained = Drained([proc])

    def frames() -> int:
        return drained.out(proc).count(f"job {running.job}")

    try:
        wait_for(lambda: frames() >= 1, 30, "the first frame", describe=lambda: drained.err(proc))
        wait_for(lambda: frames() >= 2, 10, "a second frame", describe=lambda: drained.out(proc))
        os.killpg(proc.pid, signal.SIGINT)          # Ctrl-C reaches every process of a pipeline
        assert drained.wait([proc], time.monotonic() + PROMPT + 1), "status --watch did not end after Ctrl-C"
    finally:
        drained.finish()
    out, err = drained.out(proc), drained.err(proc)
    no_escapes(out + err)
    assert out.count(f"job {running.job}") >= 2, out                           # frame after frame
    _status_shows(running, out)
    with t.mxdist("status", running.job, "--watch", "--interval", "0.3", term="dumb") as term:
        term.wait_for(lambda s: s.count(f"job {running.job}") >= 2, 30, "two frames, one after the other")
        term.type(b"q")
        assert ended_within(term, PROMPT, "status --watch in a dumb terminal after q") == 0
        assert not CURSOR_MOVES.search(term.raw())


@pytest.mark.parametrize("mode", ["terminal", "pipe", "dumb"])
def test_logs(running, mode):
    t = running.target
    host0, host1 = t.hosts[0], t.hosts[-1]
    if mode == "pipe":
        res = t.pipe("logs", running.job)
        assert res.returncode == 0, res.stderr
        out = res.stdout
        no_escapes(res.stdout + res.stderr)
        one = t.pipe("logs", running.job, "--role", "worker", "--rank", "1")
        assert one.returncode == 0 and one.stdout.startswith("tick 0 rank 1\n"), one.stdout   # as written
    else:
        with t.mxdist("logs", running.job, term="dumb" if mode == "dumb" else "xterm-256color") as term:
            assert term.wait(30) == 0
            out = term.screen().text()
    assert f"[worker 0 @ {host0}] tick 1 rank 0" in out and f"[worker 1 @ {host1}] tick 1 rank 1" in out, out


def test_logs_follow_until_ctrl_c(running):
    t = running.target
    for term_name in ("xterm-256color", "dumb"):
        with t.mxdist("logs", running.job, "--role", "worker", "--rank", "0", "-f", term=term_name) as term:
            term.wait_for(lambda s: "tick 1 rank 0" in s, 30, "the log so far")
            last = int(re.findall(r"tick (\d+) rank 0", term.screen().text())[-1])
            term.wait_for(lambda s, last=last: f"tick {last + 2} rank 0" in s, 30, "new lines as they come")
            term.ctrl_c()
            assert ended_within(term, PROMPT, "logs -f after Ctrl-C") == 130


def test_logs_follow_into_head_ends_with_head(running):
    t = running.target
    cmd = f"{shlex.join([*MXDIST, 'logs', running.job, '-f'])} | head -3"
    res = subprocess.run(["bash", "-c", cmd], env=t.env, cwd=t.cwd, capture_output=True, text=True, timeout=30)
    assert len(res.stdout.splitlines()) == 3 and "tick" in res.stdout, res.stdout + res.stderr
    assert "Traceback" not in res.stderr, res.stderr


@pytest.mark.parametrize("mode", ["terminal", "pipe", "dumb"])
def test_jobs(running, mode):
    t = running.target
    if mode == "pipe":
        res = t.pipe("jobs")
        assert res.returncode == 0
        no_escapes(res.stdout + res.stderr)
        text = res.stdout
    else:
        with t.mxdist("jobs", term="dumb" if mode == "dumb" else "xterm-256color") as term:
            assert term.wait(30) == 0
            text = term.screen().text()
    row = next((line for line in text.splitlines() if running.job in line), "")
    assert "running" in row and t.hosts[0] in flat(text), text


def test_stop_in_a_terminal(running):
    t = running.target
    with t.mxdist("stop", running.job) as term:
        code = term.wait(60)
        screen = term.screen().flat()
    assert code == 0, screen
    assert f"stopping job {running.job} (running)" in screen and f"job {running.job} stopped after" in screen
    for host in t.hosts:
        assert f"{host}: nothing of the job left" in screen, screen
    t.nothing_left(running.job)
    again = t.pipe("stop", running.job)                      # through a pipe: nothing to stop any more
    assert again.returncode == 0 and f"job {running.job} already stopped: nothing to stop" in again.stderr
    no_escapes(again.stdout + again.stderr)
    with t.mxdist("stop", term="dumb") as term:              # no job named: none is running
        assert term.wait(30) == 0
        assert f"no running jobs (the latest, {running.job}, stopped)" in term.screen().flat()


# -- the ended job, then clean ------------------------------------------------------------------------

def test_logs_and_status_of_the_ended_job(running):
    t = running.target
    assert latest(t.home)["state"] == "stopped", "test_stop_in_a_terminal runs first"
    with t.mxdist("logs", running.job, "--role", "worker") as term:
        assert term.wait(30) == 0
        assert f"[worker 1 @ {t.hosts[-1]}] tick 3 rank 1" in term.screen().flat()
    with t.mxdist("status", running.job) as term:
        assert term.wait(30) == 0
        screen = term.screen().flat()
    assert f"job {running.job} stopped" in screen and "(mxdist stop)" in screen, screen


def test_clean_asks_first(running):
    t = running.target
    res = t.pipe("clean")                                    # nobody to ask: refused, nothing removed
    assert res.returncode == 2 and "pass --yes" in flat(res.stderr), res.stderr
    no_escapes(res.stderr)
    count = len(records(t.home))
    assert count >= 2
    with t.mxdist("clean", term="dumb") as term:             # asked, answered no
        term.wait_for(lambda s: "remove" in s and "[y/N]" in s, 30, "the question")
        term.type(b"n\r")
        assert term.wait(30) == 0
        assert "nothing removed" in term.screen().flat()
    assert len(records(t.home)) == count
    with t.mxdist("clean") as term:                          # asked, answered yes
        term.wait_for(lambda s: f"remove {count} finished jobs" in flat(s), 30, "the question")
        term.type(b"y\r")
        assert term.wait(60) == 0
        assert f"removed {count} jobs" in term.screen().flat()
    assert records(t.home) == []
    with t.mxdist("jobs") as term:
        assert term.wait(30) == 0
        assert "no jobs recorded" in term.screen().flat()


def test_screen_replays_what_a_terminal_draws():
    """The emulator itself: redraw in place, wrap, scroll (what the assertions above rely on)."""
    s = Screen(10, 3).feed("ab\r\ncd\r\n\x1b[2K\x1b[1A\x1b[2K\x1b[1A\x1b[2Kxy\r\n")
    assert s.text() == "xy"
    assert Screen(4, 3).feed("abcdef").text() == "abcd\nef"
    s = Screen(5, 2).feed("1\r\n2\r\n3\r\n\x1b[5A\x1b[2Kz")
    assert s.text() == "1\n2\nz"                   # the cursor stops at the top row of the screen ("3")

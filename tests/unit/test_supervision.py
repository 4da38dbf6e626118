"""The supervisor's rules without processes: the pure rules (mxdist.job.lifecycle, mxdist.job.rootcause) and
the Supervisor itself driven through a fake backend (the Backend protocol allows it).

The supervisor runs in the test's main thread (it installs signal handlers); a driver thread
plays the processes: it waits for them to start, then makes them exit.
"""
from __future__ import annotations

import os
import queue
import signal
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import pytest

from mxdist.backends.base import (
    BackendError,
    Capability,
    Evidence,
    ExitStatus,
    HostProblem,
    Preflight,
    ProcStatus,
    Started,
)
from mxdist.job import lifecycle, records
from mxdist.job.lifecycle import Action, Failure, Supervision
from mxdist.job.records import JobState, ProcState
from mxdist.job.rootcause import Outcome, decide
from mxdist.planning.hosts import Host
from mxdist.planning.plan import NodeOptions, PlanRequest, make_plan
from mxdist.planning.options import LaunchSettings
from mxdist.supervisor.supervisor import Supervisor, new_record
from psnode.net.security import Mode

# -- mxdist.job.lifecycle ---------------------------------------------------------------------------------


def rules(max_restarts: int = 0, servers_restart: bool = False) -> Supervision:
    procs = [("scheduler", "scheduler"), ("server-0", "server"), ("worker-0", "worker"), ("worker-1", "worker")]
    return Supervision.of(procs, max_restarts, servers_restart)


def test_a_killed_scheduler_is_restarted_a_bounded_number_of_times_and_a_verdict_is_final():
    procs = [("scheduler", "scheduler"), ("server-0", "server"), ("worker-0", "worker")]
    r = Supervision.of(procs, scheduler_restarts=lifecycle.SCHEDULER_RESTARTS)
    assert lifecycle.SCHEDULER_RESTARTS == 3 and r.limit("scheduler") == 3 and r.limit("worker-0") == 0
    killed, lost = Failure(-signal.SIGKILL, None, 60.0), Failure(None, None, 60.0)
    assert [r.exited("scheduler", False, f) for f in (killed, lost, killed)] == [Action.RESTART] * 3
    assert r.exited("scheduler", False, killed) is Action.FAIL          # no restart left
    r = Supervision.of(procs, scheduler_restarts=3)
    assert r.exited("scheduler", False, Failure(1, None, 60.0)) is Action.FAIL   # its exit code: the verdict
    r = Supervision.of(procs, max_restarts=5)                               # not psnode's: never restarted
    assert r.exited("scheduler", False, killed) is Action.FAIL
    r = Supervision.of(procs, scheduler_restarts=3)
    assert r.exited("worker-0", True) is Action.WIND_DOWN
    assert r.exited("scheduler", False, killed) is Action.CONTINUE      # after the workers finished


def test_workers_done_winds_down_then_done():
    r = rules()
    assert r.exited("worker-0", True) is Action.CONTINUE
    assert r.exited("worker-1", True) is Action.WIND_DOWN
    assert r.exited("server-0", True) is Action.CONTINUE
    assert r.exited("scheduler", True) is Action.DONE


def test_a_server_exiting_0_early_is_not_an_event_and_failures_after_wind_down_do_not_count():
    r = rules()
    assert r.exited("scheduler", True) is Action.CONTINUE     # psnode's scheduler ends first
    assert r.exited("worker-0", True) is Action.CONTINUE
    assert r.exited("worker-1", True) is Action.WIND_DOWN
    assert r.exited("server-0", False) is Action.DONE


def test_failures_and_restarts():
    r = rules(max_restarts=1)
    assert r.exited("worker-1", False) is Action.RESTART
    assert r.exited("worker-1", False) is Action.FAIL         # its one restart is used
    r = rules(max_restarts=1)
    assert r.exited("server-0", False) is Action.FAIL         # servers restart only with checkpoints
    r = rules(max_restarts=1, servers_restart=True)
    assert r.exited("server-0", False) is Action.RESTART
    assert r.restart_failed("server-0") is Action.FAIL
    assert rules().exited("scheduler", False) is Action.FAIL


def test_a_crash_loop_ends_after_three_quick_failures_the_same_way_and_restarts_back_off():
    r = rules(max_restarts=50)
    boom = "RuntimeError: CUDA out of memory"
    assert r.exited("worker-1", False, Failure(1, boom, ran=300.0)) is Action.RESTART
    assert r.delay("worker-1") == 0                                    # it ran long: at once
    assert r.exited("worker-1", False, Failure(1, boom, ran=2.0)) is Action.RESTART
    assert r.delay("worker-1") == 0                                    # a first quick failure: at once
    assert r.exited("worker-1", False, Failure(1, boom, ran=3.0)) is Action.RESTART
    assert r.delay("worker-1") == 1.0 and r.crash_loop is None
    assert r.exited("worker-1", False, Failure(1, boom, ran=1.0)) is Action.FAIL   # the third replacement
    assert r.crash_loop is not None and r.restarts["worker-1"] == 3
    assert r.crash_loop.startswith("crash loop: worker-1 failed the same way 4 times in a row") and boom in r.crash_loop


def test_what_breaks_a_crash_loop_and_what_never_counts():
    r = rules(max_restarts=50)
    for how in (Failure(1, "ValueError: a", 1.0), Failure(1, "ValueError: b", 1.0),     # not the same way
                Failure(2, "ValueError: b", 1.0), Failure(2, "ValueError: b", 60.0),    # ran long
                Failure(2, "ValueError: b", 1.0), Failure(2, "ValueError: b", 1.0)):
        assert r.exited("worker-0", False, how) is Action.RESTART
    r = rules(max_restarts=50)
    for _ in range(8):                    # SIGKILL from outside: no loop of its own, restarted at once
        assert r.exited("worker-0", False, Failure(-9, None, 0.5)) is Action.RESTART
        assert r.delay("worker-0") == 0
    assert r.crash_loop is None
    assert r.exited("worker-0", False, Failure(-11, None, 0.5)) is Action.RESTART      # (SIGSEGV: its own)
    assert r.exited("worker-0", False, Failure(-11, None, 0.5)) is Action.RESTART
    assert r.delay("worker-0") == lifecycle.BACKOFF
    for _ in range(6):
        r.exited("worker-0", False, Failure(1, f"E{_}", 0.5))
    assert r.delay("worker-0") == lifecycle.BACKOFF_MAX and r.crash_loop is None
    r = rules(max_restarts=1)
    assert r.exited("worker-0", False, Failure(1, "E", 1.0)) is Action.RESTART
    assert r.exited("worker-0", False, Failure(1, "E", 1.0)) is Action.FAIL and r.crash_loop is None


def test_wait_for_the_rest_only_when_psnode_started():
    assert Supervision.wait_for_rest(True) and not Supervision.wait_for_rest(False)
    assert not Supervision.wait_for_rest(None)


# -- mxdist.job.rootcause ---------------------------------------------------------------------------------

def exc_record(t: float, kind: str = "exception", typ: str = "ValueError", msg: str = "bad batch") -> dict:
    return {"kind": kind, "time": t, "type": typ, "message": msg}


def test_the_first_own_failure_wins_over_the_order_exits_were_seen():
    outcomes = [
        Outcome("server-0", "server", 0, "h1", code=1, when=101.0),
        Outcome("worker-0", "worker", 0, "h1", code=1, when=102.0,
                failure=exc_record(101.5, "job_ended", "PeerLost", "job ended")),
        Outcome("worker-1", "worker", 1, "host-b", code=1, when=103.0, failure=exc_record(100.0)),
        Outcome("scheduler", "scheduler", None, "h1", stopped=True),
    ]
    cause = decide(outcomes, first_seen="server-0")
    assert cause is not None
    assert cause.headline == "worker 1 on host-b: ValueError: bad batch" and cause.name == "worker-1"
    assert cause.consequences == ("server 0 on h1: exit code 1", "worker 0 on h1: ended with the job",
                                  "scheduler on h1: ended with the job")


def test_a_process_that_failed_with_its_own_error_is_said_to_have_failed_with_it():
    """Worker 1 raised the root cause's error too, and was killed in its exit by the job's stop
    (its log ends with the traceback): it failed too, with that error, not 'ended with the job'."""
    error = "ModuleNotFoundError: No module named 'nosuchmod'"
    outcomes = [
        Outcome("worker-0", "worker", 0, "h1", code=1, when=100.0, exception=error),
        Outcome("worker-1", "worker", 1, "h2", code=-15, when=100.2, exception=error, stopped=True),
        Outcome("worker-2", "worker", 2, "h2", code=1, when=100.3, exception="ValueError: bad batch", stopped=True),
        Outcome("worker-3", "worker", 3, "h2", code=-15, when=100.3, stopped=True),
        Outcome("worker-4", "worker", 4, "h2", code=1, when=100.3, exception="KeyboardInterrupt", stopped=True),
        Outcome("server-0", "server", 0, "h1", code=1, when=100.4,
                failure=exc_record(100.1, "job_ended", "PeerLost", "job ended"), exception="PeerLost: job ended"),
    ]
    cause = decide(outcomes)
    assert cause is not None and cause.headline == f"worker 0 on h1: {error}"
    assert cause.consequences == (f"worker 1 on h2: failed too, with the same error ({error})",
                                  "worker 2 on h2: failed too: ValueError: bad batch",
                                  "worker 3 on h2: ended with the job", "worker 4 on h2: ended with the job",
                                  "server 0 on h1: ended with the job")


def test_the_schedulers_verdict_names_a_silent_node():
    verdict = {"kind": "verdict", "time": 50.0, "reason": "stopped responding (5.0 s without a heartbeat)",
               "culprit": {"role": "worker", "rank": 2, "host": "10.0.0.3", "pid": 9}}
    outcomes = [
        Outcome("scheduler", "scheduler", None, "h1", code=1, when=56.0, failure=verdict),
        Outcome("server-1", "server", 1, "h2", code=1, when=56.5),
        Outcome("worker-2", "worker", 2, "h3", verified=False),
    ]
    cause = decide(outcomes)
    assert cause is not None
    assert cause.headline == "worker 2 on h3: stopped responding (5.0 s without a heartbeat)"
    assert "worker 2 on h3: not verified (its host could not be reached)" not in cause.consequences
    assert "scheduler on h1: ended the job (exit code 1)" in cause.consequences
    assert "server 1 on h2: exit code 1" in cause.consequences


def test_an_exception_without_a_record_comes_from_the_log_and_exit_codes_otherwise():
    cause = decide([Outcome("worker-1", "worker", 1, "h", code=1, when=5.0, exception="KeyError: 'x'"),
                    Outcome("worker-0", "worker", 0, "h", code=-9, when=6.0)])
    assert cause is not None and cause.headline == "worker 1 on h: KeyError: 'x'"
    assert cause.consequences == ("worker 0 on h: killed by SIGKILL",)
    cause = decide([Outcome("worker-1", "worker", 1, "h", code=7, when=5.0)])
    assert cause is not None and cause.headline == "worker 1 on h: exit code 7"
    assert decide([Outcome("worker-0", "worker", 0, "h", code=0, when=1.0)]) is None


# -- the Supervisor with a fake backend ---------------------------------------------------------------

class FakeBackend:
    """Processes that exist only in memory; the test decides when and how they end."""

    name = "fake"
    capabilities: frozenset = frozenset()

    def __init__(self) -> None:
        self.exits: dict[str, queue.Queue[int | None]] = {}
        self.running: set[str] = set()
        self.starts: list[str] = []
        self.stopped: list[str] = []
        self.cleaned: list[str] = []
        self.problems: list[HostProblem] = []
        self.unreachable: set[str] = set()
        self.evidence: dict[str, Evidence] = {}
        self.crash: dict[str, str] = {}
        self.keys: list[str] = []                     # hosts given the job's secret (install_key)
        self.hold: dict[str, threading.Event] = {}    # "preflight"/"install_key": waits until set
        self.entered: dict[str, threading.Event] = {"preflight": threading.Event(), "install_key": threading.Event()}
        self._pid = 1000
        self._lock = threading.Lock()

    # test side
    def wait_started(self, names: Sequence[str], timeout: float = 10) -> None:
        deadline = time.monotonic() + timeout
        while not set(names) <= self.running:
            assert time.monotonic() < deadline, f"not started: {set(names) - self.running}"
            time.sleep(0.01)

    def end(self, name: str, code: int | None) -> None:
        with self._lock:
            self.running.discard(name)
        self.exits[name].put(code)

    # Backend protocol
    def options(self) -> dict[str, Any]:
        return {}

    def _step(self, name: str) -> None:
        self.entered[name].set()
        if name in self.hold:
            assert self.hold[name].wait(30), f"{name} was never released"

    def preflight(self, hosts: Sequence[Host], modules: Sequence[str], env: Any, target: Any = None) -> Preflight:
        self._step("preflight")
        return Preflight(self.problems)

    def install_key(self, host: Host, run_dir: str, key: bytes) -> str:   # with Capability.KEYS
        self._step("install_key")
        with self._lock:
            self.keys.append(host.label)
        return f"{run_dir}/job.key"

    def reachable(self, host: Host, timeout: float) -> None:
        if host.label in self.unreachable:
            time.sleep(min(timeout, 0.3))
            raise BackendError(f"{host.label}: no route")

    def disconnect(self, host: Host) -> None:
        self._step("disconnect")

    def start(self, host: Host, procs: Sequence[Any], run_dir: str) -> list[Started]:
        out = []
        with self._lock:
            for p in procs:
                self._pid += 1
                self.exits[p.name] = queue.Queue()
                self.running.add(p.name)
                self.starts.append(p.name)
                out.append(Started(p.name, self._pid, f"{run_dir}/{p.name}.log", f"{run_dir}/{p.name}.rc"))
        return out

    def follow(self, host: Host, proc: Any, emit: Callable[[bytes], None], wait: bool = True,
               offset: int = 0) -> ExitStatus | None:
        emit(f"hello from {proc.name}\n".encode())
        code = self.exits[proc.name].get()
        if proc.name in self.crash:   # (what the process wrote before it failed)
            with open(proc.run_log, "a") as log:
                log.write(f"Traceback (most recent call last):\n  File \"train.py\"\n{self.crash[proc.name]}\n")
        return ExitStatus(code)

    def status(self, host: Host, procs: Sequence[Any]) -> list[ProcStatus]:
        return [ProcStatus(p.name in self.running, (), None) for p in procs]

    def signal(self, host: Host, procs: Sequence[Any], signum: int) -> None:
        pass

    def stop(self, host: Host, procs: Sequence[Any], grace: float) -> list[int]:
        for p in procs:
            if p.name in self.running:
                self.stopped.append(p.name)
                self.end(p.name, -15)
        return []

    def collect(self, host: Host, procs: Sequence[Any], run_dir: str) -> list[Evidence]:
        return [self.evidence.get(p.name, Evidence(None, None, None, None)) for p in procs]

    def cleanup(self, host: Host, job_id: str, run_dir: str) -> None:
        self.cleaned.append(host.label)

    def close(self) -> None:
        pass


HOSTS = [Host("a", address="127.0.0.1", slots=1), Host("b", address="127.0.0.2", slots=1)]


@pytest.fixture
def home(tmp_path):
    records.use_home(tmp_path / "home")
    yield tmp_path / "home"
    records.use_home(None)


def supervisor(backend: FakeBackend, max_restarts: int = 0, **settings: Any) -> Supervisor:
    job = records.new_job_id()
    plan = make_plan(PlanRequest(job_id=job, command=["train.py"], hosts=HOSTS, python="python3",
                                 scheduler_port=9000, master_port=9001, num_servers=1,
                                 node=NodeOptions(max_restarts=max_restarts)))
    record = new_record(plan, backend, ["train.py"], "/w", records.log_dir(job))  # type: ignore[arg-type]
    sup = Supervisor(plan, backend, record, LaunchSettings(run_dir=str(records.log_dir(job)), quiet=True,  # type: ignore[arg-type]
                                                            grace=0.1, finish_grace=5.0, **settings))
    sup._psnode_started = lambda: None  # type: ignore[method-assign] # no scheduler to ask
    return sup


def drive(fn: Callable[[], None]) -> threading.Thread:
    t = threading.Thread(target=fn, daemon=True)
    t.start()
    return t


WORKERS = ["worker-0", "worker-1"]
ALL = ["scheduler", "server-0", *WORKERS]


def test_all_workers_exit_0_the_job_succeeds_at_once_and_every_host_is_cleaned(home):
    fake = FakeBackend()
    sup = supervisor(fake)

    def play() -> None:
        fake.wait_started(ALL)
        fake.end("worker-0", 0)
        fake.end("worker-1", 0)

    drive(play)
    t0 = time.monotonic()
    assert sup.run() == 0
    assert time.monotonic() - t0 < 3.0                       # no finish-grace wait without psnode
    rec = records.load(sup.record.id)
    assert rec.state is JobState.SUCCEEDED and rec.exit_code == 0 and rec.ended is not None
    assert sorted(fake.stopped) == ["scheduler", "server-0"] and sorted(fake.cleaned) == ["a", "b"]
    assert {p.name: p.state for p in rec.procs}["worker-1"] is ProcState.EXITED
    assert records.try_lock(rec.id) is not None                 # the supervisor let go of the job


def test_a_failure_is_named_by_its_evidence_not_by_the_first_exit_seen(home):
    fake = FakeBackend()
    now = time.time()
    fake.evidence = {"worker-1": Evidence(1, now + 2, exc_record(now), None),
                     "server-0": Evidence(1, now + 1, None, None)}
    sup = supervisor(fake)
    saved: list[JobState] = []
    original = sup.save
    sup.save = lambda: (saved.append(sup.record.state), original())[1]  # type: ignore[method-assign]

    def play() -> None:
        fake.wait_started(ALL)
        fake.end("server-0", 1)                              # the consequence reaches us first

    drive(play)
    assert sup.run() == 1
    rec = records.load(sup.record.id)
    assert rec.state is JobState.FAILED and rec.exit_code == 1
    assert rec.root_cause is not None and rec.root_cause.headline == "worker 1 on b: ValueError: bad batch"
    assert "server 0 on a: exit code 1" in rec.consequences
    assert saved.count(JobState.FAILED) == 1                 # the final state is written once
    assert sorted(fake.cleaned) == ["a", "b"]


def test_a_failed_worker_is_restarted_and_the_job_goes_on(home):
    fake = FakeBackend()
    sup = supervisor(fake, max_restarts=1)

    def play() -> None:
        fake.wait_started(ALL)
        fake.end("worker-1", 9)
        deadline = time.monotonic() + 10
        while fake.starts.count("worker-1") < 2:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        fake.end("worker-1", 0)
        fake.end("worker-0", 0)

    drive(play)
    assert sup.run() == 0
    rec = records.load(sup.record.id)
    assert rec.state is JobState.SUCCEEDED and rec.proc("worker-1").restarts == 1


def test_a_crash_loop_ends_the_job_early_with_its_cause_after_backing_off(home, monkeypatch):
    monkeypatch.setattr(lifecycle, "BACKOFF", 0.2)
    fake = FakeBackend()
    fake.crash["worker-1"] = "RuntimeError: no GPU left on this host"
    now = time.time()
    fake.evidence = {"worker-1": Evidence(1, now, exc_record(now, typ="RuntimeError", msg="no GPU left on this host"),
                                          None)}
    sup = supervisor(fake, max_restarts=50)
    starts: list[float] = []

    def play() -> None:
        fake.wait_started(ALL)
        for _ in range(4):
            deadline = time.monotonic() + 10
            while "worker-1" not in fake.running:
                assert time.monotonic() < deadline
                time.sleep(0.005)
            starts.append(time.monotonic())
            fake.end("worker-1", 1)

    drive(play)
    assert sup.run() == 1
    rec = records.load(sup.record.id)
    assert rec.state is JobState.FAILED and rec.proc("worker-1").restarts == 3      # not 50
    assert rec.root_cause is not None
    headline = rec.root_cause.headline
    assert headline.startswith("worker 1 on b: RuntimeError: no GPU left on this host (crash loop: worker-1 "
                               "failed the same way 4 times in a row"), headline
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    assert gaps[1] >= 0.2 and gaps[2] >= 0.4, gaps                                  # backing off after 2


def test_mxdist_stop_asks_the_supervisor_through_the_job_directory(home):
    fake = FakeBackend()
    sup = supervisor(fake)

    def play() -> None:
        fake.wait_started(ALL)
        records.write_atomic(records.stop_request_path(sup.record.id), '{"grace": 0.1}')

    drive(play)
    assert sup.run() == 143
    rec = records.load(sup.record.id)
    assert rec.state is JobState.STOPPED and rec.stopped_by == "mxdist stop" and rec.exit_code == 143
    assert sorted(fake.stopped) == sorted(ALL)
    assert not records.stop_request_path(rec.id).exists()


@pytest.mark.parametrize("signum, code", [(signal.SIGHUP, 129), (signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_signals_end_the_job_with_their_exit_codes(home, signum, code):
    fake = FakeBackend()
    sup = supervisor(fake)

    def play() -> None:
        fake.wait_started(ALL)
        os.kill(os.getpid(), signum)

    # (a signal this test run inherited ignored, under nohup, would stay ignored: mxdist's rule)
    previous = signal.signal(signum, signal.SIG_DFL)
    try:
        drive(play)
        assert sup.run() == code
    finally:
        signal.signal(signum, previous)
    assert records.load(sup.record.id).state is JobState.STOPPED
    assert sorted(fake.stopped) == sorted(ALL)


def test_an_unreachable_host_is_not_waited_on_and_is_reported_not_verified(home):
    fake = FakeBackend()
    sup = supervisor(fake)

    def play() -> None:
        fake.wait_started(ALL)
        fake.unreachable.add("b")
        fake.end("worker-0", 3)

    drive(play)
    t0 = time.monotonic()
    assert sup.run() == 1
    assert time.monotonic() - t0 < 5.0
    rec = records.load(sup.record.id)
    assert set(rec.unverified) == {"b"} and rec.proc("worker-1").state is ProcState.UNKNOWN
    assert rec.root_cause is not None and rec.root_cause.headline == "worker 0 on a: exit code 3"
    assert "worker 1 on b: not verified (its host could not be reached)" in rec.consequences
    assert fake.cleaned == ["a"]
    rec.rechecked(["b"], {})           # (mxdist status / stop: b answers, its worker is stopped)
    assert not rec.unverified and rec.proc("worker-1").state is ProcState.STOPPED
    assert "worker 1 on b: stopped when its host was checked again" in rec.consequences
    assert not [line for line in rec.consequences if "not verified" in line]


def _preflight_thread_ends() -> None:
    for t in threading.enumerate():
        if t.name == "preflight":
            t.join(10)
            assert not t.is_alive()


def test_a_job_ended_during_preflight_ends_at_once_and_writes_nothing_of_it_anywhere(home):
    """A host slow to answer preflight: the stop request ends the job without waiting for it;
    nothing of the job was written on a host (nothing to clean there), nor is once it answers."""
    fake = FakeBackend()
    fake.capabilities = frozenset({Capability.KEYS})
    fake.hold["preflight"] = threading.Event()
    sup = supervisor(fake, security=Mode.AUTHENTICATED)

    def play() -> None:
        assert fake.entered["preflight"].wait(10)
        records.write_atomic(records.stop_request_path(sup.record.id), '{"grace": 0.1}')

    drive(play)
    t0 = time.monotonic()
    assert sup.run() == 143
    assert time.monotonic() - t0 < 2.0
    fake.hold["preflight"].set()                 # the slow host answers at last
    _preflight_thread_ends()
    rec = records.load(sup.record.id)
    assert rec.state is JobState.STOPPED and rec.stopped_by == "mxdist stop" and not fake.starts
    assert fake.cleaned == [] and fake.keys == [] and not fake.entered["install_key"].is_set()
    assert rec.key_file is None and not rec.remote_keys and not records.key_path(rec.id).exists()


def test_a_job_ended_while_its_secret_is_being_written_waits_for_it_and_removes_it(home):
    fake = FakeBackend()
    fake.capabilities = frozenset({Capability.KEYS})
    fake.hold["install_key"] = threading.Event()
    sup = supervisor(fake, security=Mode.AUTHENTICATED)

    def play() -> None:
        assert fake.entered["install_key"].wait(10)
        records.write_atomic(records.stop_request_path(sup.record.id), '{"grace": 0.1}')
        time.sleep(0.5)                          # the supervisor sees the request meanwhile
        fake.hold["install_key"].set()

    drive(play)
    assert sup.run() == 143
    rec = records.load(sup.record.id)
    assert rec.state is JobState.STOPPED and not fake.starts
    assert sorted(fake.keys) == ["a", "b"] and sorted(fake.cleaned) == ["a", "b"]   # written, then removed
    assert not records.key_path(rec.id).exists()


def test_preflight_problems_start_nothing_and_leave_no_record_unless_detached(home):
    fake = FakeBackend()
    fake.problems = [HostProblem("b", "cannot connect to b:22: connection refused", "is sshd running?")]
    sup = supervisor(fake)
    assert sup.run() == 3
    assert not fake.starts and not records.record_path(sup.record.id).exists()
    assert not records.log_dir(sup.record.id).exists()
    sup = supervisor(fake, detach=True)      # detached: mxdist status says why it ended
    assert sup.run() == 3
    rec = records.load(sup.record.id)
    assert rec.state is JobState.FAILED and not fake.starts
    assert rec.root_cause is not None and "connection refused" in rec.root_cause.headline


def test_a_verdict_on_the_job_itself_is_the_headline():
    verdict = {"kind": "verdict", "time": 10.0, "reason": "only 1 of 2 workers and 1 of 1 servers registered"}
    cause = decide([Outcome("scheduler", "scheduler", None, "h", code=1, when=11.0, failure=verdict),
                    Outcome("worker-0", "worker", 0, "h", stopped=True)])
    assert cause is not None and cause.headline == f"scheduler on h: {verdict['reason']}"


def test_a_supervisor_bug_still_ends_the_job_on_every_host(home):
    fake = FakeBackend()
    sup = supervisor(fake)

    def broken() -> int:
        fake.wait_started(ALL)
        raise KeyError("a bug")

    sup._watch = broken  # type: ignore[method-assign]
    assert sup.run() == 1
    rec = records.load(sup.record.id)
    assert rec.state is JobState.FAILED and "KeyError" in rec.root_cause.headline
    assert sorted(fake.stopped) == sorted(ALL) and sorted(fake.cleaned) == ["a", "b"]


def test_output_to_a_reader_that_went_away_is_dropped_not_raised():
    from mxdist import ui

    before = (ui._stdout.stream, ui._stderr.stream)
    r, w = os.pipe()
    os.close(r)                                   # | head exited, | tee killed by the same Ctrl-C
    broken = os.fdopen(w, "w", buffering=1)
    old = signal.signal(signal.SIGPIPE, signal.SIG_IGN)    # as in Python: EPIPE, not a signal
    ui.bind(broken, broken)
    try:
        ui.warn("Ctrl-C: stopping the job on every host")
        ui.closing_line("job-1", "stopped", 1.0, "Ctrl-C")
        ui.LogPrinter().feed("worker-0", "worker", 0, "h", b"a line\n")
        ui.raw_bytes(b"bytes\n")
    finally:
        signal.signal(signal.SIGPIPE, old)
        ui.bind(*before)
        broken.close()


def test_a_standby_scheduler_takes_over_is_never_restarted_and_never_waited_for():
    """Rule 8: the scheduler's failure with the standby running is FAIL_OVER (no restart at its
    address); the standby is then the scheduler (its failure: FAIL); idle, it is not waited for."""
    procs = [("scheduler", "scheduler"), ("scheduler-1", "scheduler"), ("server-0", "server"), ("worker-0", "worker")]
    killed = Failure(-signal.SIGKILL, None, 60.0)
    r = Supervision.of(procs, scheduler_restarts=lifecycle.SCHEDULER_RESTARTS)
    assert r.standby == "scheduler-1"
    assert r.exited("scheduler", False, killed) is Action.FAIL_OVER and r.failed_over
    assert r.exited("scheduler-1", False, killed) is Action.FAIL          # the acting scheduler
    idle = Supervision.of(procs, scheduler_restarts=3)
    assert idle.exited("scheduler-1", False, killed) is Action.CONTINUE   # an idle standby: the job goes on
    assert idle.exited("scheduler", False, killed) is Action.RESTART      # no standby left: rule 3
    done = Supervision.of(procs)
    assert done.exited("worker-0", True) is Action.WIND_DOWN
    assert done.exited("server-0", True) is Action.CONTINUE
    assert done.exited("scheduler", True) is Action.DONE                  # the idle standby is stopped
    after = Supervision.of(procs)
    assert after.exited("scheduler", False, killed) is Action.FAIL_OVER
    assert after.exited("worker-0", True) is Action.WIND_DOWN
    assert after.exited("server-0", True) is Action.CONTINUE              # the acting standby ends the job
    assert after.exited("scheduler-1", True) is Action.DONE


def test_each_new_standby_takes_the_job_over_in_turn_and_idles_until_then():
    """Rule 8, one host loss after another: a standby started after a failover (add_standby) is
    idle (not waited for, its end no event) until the scheduler that took over fails: FAIL_OVER
    again; with no standby left, the acting scheduler's failure is FAIL."""
    procs = [("scheduler", "scheduler"), ("scheduler-1", "scheduler"), ("server-0", "server"), ("worker-0", "worker")]
    killed = Failure(None, None, 60.0)
    r = Supervision.of(procs, scheduler_restarts=lifecycle.SCHEDULER_RESTARTS)
    assert r.exited("scheduler", False, killed) is Action.FAIL_OVER
    assert (r.scheduler, r.standby) == ("scheduler-1", None)
    r.add_standby("scheduler-2")
    assert r.exited("scheduler-1", False, killed) is Action.FAIL_OVER
    assert (r.scheduler, r.standby) == ("scheduler-2", None)
    r.add_standby("scheduler-3")
    assert r.exited("scheduler-3", False, killed) is Action.CONTINUE      # idle: the job goes on without one
    assert r.exited("scheduler-2", False, killed) is Action.FAIL          # none left
    done = Supervision.of(procs)
    assert done.exited("scheduler", False, killed) is Action.FAIL_OVER
    done.add_standby("scheduler-2")
    assert done.exited("worker-0", True) is Action.WIND_DOWN
    assert done.exited("server-0", True) is Action.CONTINUE
    assert done.exited("scheduler-1", True) is Action.DONE                # the idle new standby is stopped

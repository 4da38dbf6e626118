"""The host agent: the few operations a launcher needs on a host, for every backend.

Self-contained (standard library only, imports nothing from ``mxdist``) because the SSH backend
sends this file's source to the remote Python on stdin; the local backend calls the same
functions in-process.  Sending it on stdin keeps command lines short and secrets (the
processes' environment) off them.  Over SSH it runs one of two ways:

* once (``python -``: the source, then one call to :func:`_main` with a JSON request): the
  operation's output streams on stdout, its result is the last line of stderr; every
  :func:`spawn` and :func:`follow` runs so;
* serving (``python -c BOOT``, :data:`BOOT`: the source's length on the first line of stdin,
  then the source, ending in a call to :func:`serve`): one JSON request per line in, one JSON
  reply per line out, until stdin ends.  A host's other operations reuse one serving agent,
  so each costs a round trip rather than a Python start.

Process model: :func:`spawn` starts each process as ``python -S -c REAPER RCFILE -- ARGV...`` in
a new session (so pid == pgid and the whole group can be signalled), with stdout+stderr
appended to a log file and stdin from /dev/null.  The reaper runs the user's command, waits
for it and writes its exit status to RCFILE (``-N`` for signal N); it survives TERM/INT/HUP
itself so that a signalled command still gets its status written.  The process outlives the
launcher (``--detach``) and the SSH session.

Liveness reads ``/proc``: a process in state ``Z`` (zombie, not yet reaped) counts as dead.

GPUs: :func:`gpus` reports what a process started on the host with the job's environment
would see: ``nvidia-smi --query-gpu``'s list (none without nvidia-smi: a CPU host, not an
error) and ``CUDA_VISIBLE_DEVICES`` when that environment sets it.  :func:`check` (preflight)
includes it; :mod:`mxdist.backends.slurm` runs the same function's source on every node.

The job's secret: :func:`put_key` writes the secret file (received inside the request, i.e. on
stdin over SSH) to ``<run_dir>/job.key`` with mode 0600 and returns the absolute path.

Privacy: run directories (and missing parents) are created 0700, logs and secrets 0600.

torch elastic's error file: a worker's ``TORCHELASTIC_ERROR_FILE`` (where torch's ``@record``
writes the exception that ends it) names a path on this host; a leading ``~`` in it is expanded
here (torch does not expand it), and a stale file is removed before the worker starts.

Messages: every operation is a request dataclass (:class:`AgentRequest`: ``CheckRequest``,
``SpawnRequest``, ...) paired with its reply's dataclass (``CheckReply``, ``Spawned``, ...),
defined here once for both ends: the launcher builds a request and reads its reply with the
request's :meth:`AgentRequest.reply`; the agent reads the request with :func:`request_from_json` and
answers it with :meth:`AgentRequest.run`.  They live in this file, not in a module of their own,
because this file is what reaches the remote Python: one source, sent whole, keeps both ends
the same version with nothing else to send.  The wire form is ``{"op": OP, FIELD: value, ...}``
in, ``{"result": ...}`` or ``{"error": text}`` (:class:`Answer`) out; the local backends call
:func:`answer` on the same request objects, without JSON.  The GPU report is read by
:class:`GpusReport`; the Slurm preflight's line per node is :class:`NodeCheck`, whose source
:mod:`mxdist.backends.slurm` sends with :func:`gpus`'s.

After a job: :func:`collect` reads what each process left (exit status and when it was
written, its failure record at the path the launcher names, its torch elastic error file and
when that was written, the last exception line of a Python traceback at the end of its log); :func:`cleanup`
removes the job's secret file, the run directory when it is a remote one, and the job's
shared-memory segments (``/dev/shm/psnode.<job_id>.*``); :func:`read_files` returns the files a
job's processes left in a directory (their ``--timeline`` events) for the launcher to merge.
"""
from __future__ import annotations

import contextlib
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from typing import Any, ClassVar, Generic, TypeVar, cast

REAPER = (
    "import os,signal,subprocess,sys\n"
    "for s in (signal.SIGTERM,signal.SIGINT,signal.SIGHUP):signal.signal(s,lambda *a:None)\n"
    "rc_file=sys.argv[1];argv=sys.argv[3:]\n"
    "try:\n"
    " rc=subprocess.Popen(argv).wait()\n"
    "except OSError as e:\n"
    " print('mxdist: cannot run %r: %s'%(argv[0],e),flush=True);rc=127\n"
    "tmp=rc_file+'.tmp'\n"
    "with os.fdopen(os.open(tmp,os.O_WRONLY|os.O_CREAT|os.O_TRUNC,0o600),'w') as f:f.write(str(rc))\n"
    "os.replace(tmp,rc_file)\n"
)


def _expand(path: str) -> str:
    return os.path.abspath(os.path.expanduser(path))


def gpus(env: dict | None = None, timeout: float = 20.0) -> dict:
    """The GPUs of this host as a process started with ``env`` (added to this environment) sees
    them: ``{"visible": CUDA_VISIBLE_DEVICES or None, "gpus": [{"index", "uuid", "name",
    "memory_mib"}, ...], "error": None or why nvidia-smi gave no list}``.  No nvidia-smi on the
    PATH: no GPU and no error.  Self-contained (the Slurm preflight runs its source)."""
    import os
    import shutil
    import subprocess

    merged = {**os.environ, **(env or {})}
    out: dict = {"visible": merged.get("CUDA_VISIBLE_DEVICES"), "gpus": [], "error": None}
    smi = shutil.which("nvidia-smi", path=merged.get("PATH"))
    if smi is None:
        return out
    try:
        proc = subprocess.run([smi, "--query-gpu=index,uuid,name,memory.total", "--format=csv,noheader,nounits"],
                               capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        out["error"] = f"{smi} did not answer within {timeout:g} s"
        return out
    except OSError as exc:
        out["error"] = f"cannot run {smi}: {exc.strerror or exc}"
        return out
    if proc.returncode != 0:
        said = [line.strip() for line in (proc.stderr + proc.stdout).splitlines() if line.strip()]
        out["error"] = f"{smi} failed (exit {proc.returncode}): {said[0][:300] if said else 'no message'}"
        return out
    for line in proc.stdout.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 4 or not parts[0].isdigit():
            continue
        memory = parts[-1]
        out["gpus"].append({"index": int(parts[0]), "uuid": parts[1], "name": ",".join(parts[2:-1]).strip(),
                            "memory_mib": int(memory) if memory.isdigit() else None})
    return out


@dataclass(frozen=True)
class GpuEntry:
    """One GPU of :func:`gpus`'s report (``index`` as nvidia-smi numbers it, as text)."""

    index: str
    uuid: str = ""
    name: str = ""
    memory_mib: int | None = None


@dataclass(frozen=True)
class GpusReport:
    """:func:`gpus`'s report, read (:meth:`from_json`) from its dict: ``{"visible", "gpus":
    [{"index", "uuid", "name", "memory_mib"}, ...], "error"}``; a missing or malformed field
    reads as nothing found (no report at all: no GPU)."""

    visible: str | None = None
    gpus: tuple[GpuEntry, ...] = ()
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"visible": self.visible, "error": self.error,
                "gpus": [{"index": int(g.index) if g.index.isdigit() else g.index, "uuid": g.uuid, "name": g.name,
                          "memory_mib": g.memory_mib} for g in self.gpus]}

    @classmethod
    def from_json(cls, data: Any) -> GpusReport:
        if not isinstance(data, dict):
            return cls()
        visible = data.get("visible")
        listed = tuple(GpuEntry(str(g.get("index")), str(g.get("uuid") or ""), str(g.get("name") or ""),
                                g.get("memory_mib") if isinstance(g.get("memory_mib"), int) else None)
                       for g in data.get("gpus") or () if isinstance(g, dict))
        return cls(visible if isinstance(visible, str) else None, listed, str(data.get("error") or "") or None)


def command_problem(workdir: str, kind: str, word: str, env: dict | None = None) -> str | None:
    """Why the job's command cannot start in ``workdir`` on this host, or None: ``kind``
    ``script``: ``word`` must be a file (relative to ``workdir``); ``module``: ``python -m word``
    finds it (from ``workdir``, with ``env``'s PYTHONPATH); ``program``: an executable file (a
    path) or a name on the PATH of a process started with ``env``.  Self-contained (the Slurm
    preflight runs its source)."""
    import os
    import shutil
    import subprocess
    import sys

    path = os.path.join(workdir, os.path.expanduser(word))
    where = "" if os.path.isabs(os.path.expanduser(word)) else f" in {workdir}"
    if kind == "script":
        return None if os.path.isfile(path) else f"no script {word}{where}"
    if kind == "module":
        find = ("import importlib.util,sys\ntry:s=importlib.util.find_spec(sys.argv[1])\n"
                "except Exception as e:sys.exit('%s: %s'%(type(e).__name__,e))\nsys.exit(0 if s else 'not found')")
        try:
            done = subprocess.run([sys.executable, "-c", find, word], cwd=os.path.expanduser(workdir),
                                  env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"no module {word} in {workdir}: cannot look for it ({exc})"
        said = (done.stderr.strip().splitlines() or [""])[-1]
        return None if done.returncode == 0 else f"no module {word} in {workdir} (python -m {word}: {said})"
    if "/" in word:
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return None
        return f"{word}{where} is not an executable file" if os.path.exists(path) else f"no program {word}{where}"
    search = {**os.environ, **(env or {})}.get("PATH") or os.defpath
    return None if shutil.which(word, path=search) else f"{word}: command not found (PATH={search})"


@dataclass(frozen=True)
class NodeCheck:
    """One Slurm node's preflight answer, a line of the preflight step's stdout (:meth:`to_line`):
    ``MXDIST-CHECK {"node", "errors", "gpus"}``: the node (its ``SLURMD_NODENAME``), what is
    wrong there, and :func:`gpus`'s report.  Self-contained (the Slurm preflight runs its source);
    :meth:`from_line` is None for any other line."""

    node: str | None
    errors: list[str]
    gpus: dict

    def to_line(self) -> str:
        import json

        return "MXDIST-CHECK " + json.dumps({"node": self.node, "errors": self.errors, "gpus": self.gpus})

    @classmethod
    def from_line(cls, line: str) -> NodeCheck | None:
        import json

        mark, _, text = line.partition(" ")
        if mark != "MXDIST-CHECK":
            return None
        try:
            data = json.loads(text)
        except ValueError:
            return None
        if not isinstance(data, dict):
            return None
        node = data.get("node")
        return cls(node if isinstance(node, str) else None, [str(e) for e in data.get("errors") or []],
                   dict(data.get("gpus") or {}))


#: finds modules as an import would, without running them: argv[1] is JSON, ``[[path0, [module,
#: ...]], ...]``, each group looked for with its path0 first on the path; prints ``[{module: why},
#: ...]``, one per group.  A preflight costs one Python start, not numpy's and pyzmq's imports
_IMPORTS = (
    "import importlib.util,json,sys\n"
    "res=[]\n"
    "for p0,mods in json.loads(sys.argv[1]):\n"
    " sys.path[0]=p0\n"
    " importlib.invalidate_caches()\n"
    " out={}\n"
    " for m in mods:\n"
    "  try:\n"
    "   if importlib.util.find_spec(m) is None:out[m]=\"ModuleNotFoundError: No module named '%s'\"%m\n"
    "  except Exception as e:out[m]='%s: %s'%(type(e).__name__,e)\n"
    " res.append(out)\n"
    "print(json.dumps(res))\n"
)


def missing_modules(workdir: str, groups: list[tuple[str, list[str]]], env: dict | None = None) -> list[dict]:
    """For each ``(path0, modules)`` of ``groups``: which of ``modules`` this Python cannot
    import, run in ``workdir`` with ``path0`` first on its path (as ``python -m`` there:
    ``workdir``; as ``python dir/script.py``: ``dir``), each with ``Type: message``; one Python
    for all.  A module is looked for, not run (``importlib.util.find_spec``): one that is there
    but fails as it loads fails the job's processes at start, its error named as the root cause.
    Self-contained."""
    import json
    import os
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", _IMPORTS, json.dumps(groups)], cwd=workdir, capture_output=True,
                          text=True, timeout=120, env={**os.environ, **(env or {})})
    try:
        found = json.loads(proc.stdout.strip().splitlines()[-1])
        return [dict(x) for x in found]
    except (ValueError, IndexError, TypeError):
        said = (proc.stderr.strip().splitlines() or ["no message"])[-1]
        return [dict.fromkeys(mods, f"the import check failed (exit {proc.returncode}): {said}") for _, mods in groups]


_IMPORTS_PSNODE = re.compile(r"^\s*(?:import\s[^\n#]*\bpsnode\b|from\s+psnode\b)", re.MULTILINE)


def check(workdir: str, modules: list[str], env: dict | None = None, target: list | None = None) -> dict:
    """Preflight: Python version, the workdir, whether ``modules`` import with ``env`` from
    there as the job's processes import them, whether the job's command (``target``: ``[kind,
    word]``, :func:`command_problem`) is there, and the GPUs a process with ``env`` sees there
    (:func:`gpus`).

    ``modules`` import in ``workdir`` (the scheduler's and servers' ``python -m psnode`` runs
    there, with it on the path); a ``.py`` script that imports psnode must also import it from the
    script's own folder (``python dir/script.py`` puts that folder, not ``workdir``, on its path).
    ``missing``: ``{module: why}`` for every module that does not import (one error names them)."""
    out: dict = {"python": sys.version.split()[0], "executable": sys.executable, "errors": [],
                 "gpus": gpus(env), "missing": {}}
    workdir = _expand(workdir)
    if not os.path.isdir(workdir):
        out["errors"].append(f"working directory {workdir} does not exist")
        return out
    problem = command_problem(workdir, target[0], target[1], env) if target else None
    if problem:
        out["errors"].append(problem)
    folder, word = None, ""   # the script's folder, when psnode must import from there too
    if target and target[0] == "script" and not problem and "psnode" in modules:
        word = target[1]
        script = os.path.join(workdir, os.path.expanduser(word))
        try:
            with open(script, encoding="utf-8", errors="replace") as f:
                uses = bool(_IMPORTS_PSNODE.search(f.read(1 << 20)))
        except OSError:
            uses = False
        folder = os.path.dirname(os.path.abspath(script))
        if not uses or folder == workdir:
            folder = None
    groups = ([(workdir, list(modules))] if modules else []) + ([(folder, ["psnode"])] if folder else [])
    found = missing_modules(workdir, groups, env) if groups else []
    missing = found[0] if modules else {}
    if missing:
        first = next(iter(missing.values()))
        out["errors"].append(f"{sys.executable} cannot import {', '.join(missing)} in {workdir}: {first}")
    elif folder and found[-1]:
        missing = found[-1]
        out["errors"].append(
            f"{sys.executable} cannot import psnode from {word}'s folder {folder} "
            f"(python puts the script's folder on its path, not {workdir}): {missing['psnode']}")
    out["missing"] = missing
    return out


def private_dirs(path: str) -> str:
    """Create ``path`` and its missing parents with mode 0700; ``path`` itself is made 0700."""
    path = _expand(path)
    missing = []
    head = path
    while head and not os.path.isdir(head):
        missing.append(head)
        head = os.path.dirname(head)
    for d in reversed(missing):
        with contextlib.suppress(FileExistsError):
            os.mkdir(d, 0o700)
    if os.stat(path).st_mode & 0o077:
        os.chmod(path, 0o700)
    return path


#: Variables whose value is a path on this host that the process reading it does not expand.
_HOST_PATHS = ("TORCHELASTIC_ERROR_FILE",)


def exit_guard_dir() -> str | None:
    """This host's ``psnode/exitguard`` (the directory of psnode's ``sitecustomize``, which ends
    ``torch.distributed`` before the interpreter does), found without importing psnode; None
    when this Python has no psnode."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("psnode")
    except (ImportError, ValueError):
        return None
    for where in (spec.submodule_search_locations or []) if spec else []:
        guard = os.path.join(where, "exitguard")
        if os.path.isfile(os.path.join(guard, "sitecustomize.py")):
            return guard
    return None


def with_exit_guard(env: dict, guard: str | None) -> dict:
    """``env`` with ``guard`` first on its ``PYTHONPATH`` (unless ``MXDIST_EXIT_GUARD=0``)."""
    if guard is None or env.get("MXDIST_EXIT_GUARD") == "0":
        return env
    rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != guard]
    return {**env, "PYTHONPATH": os.pathsep.join([guard, *rest])}


#: seconds :func:`spawn` waits for a process to write its address file (then: not known)
ANNOUNCE_WAIT = 60.0


def spawn(workdir: str, run_dir: str, python: str, procs: list[dict]) -> list[dict]:
    """Start each ``{"name", "argv", "env", "failure", "error_file", "announce"}`` under a reaper
    (``failure``: where it writes its failure record, ``error_file``: its torch elastic error
    file; stale ones are removed); return ``{"name", "pid", "log", "rc", "offset", "address"}``
    (``offset``: the log's size before the process started, where its output begins).  Every
    process gets psnode's exit guard first on its ``PYTHONPATH`` (:func:`exit_guard_dir`).

    ``announce``: the file where the process writes the ``host:port`` it bound (a scheduler,
    ``PSNODE_ADDRESS_FILE``); once all are started, each is waited for (until it is written, the
    process ends, or :data:`ANNOUNCE_WAIT`) and its address returned (None: not written)."""
    run_dir = private_dirs(run_dir)
    workdir = _expand(workdir)
    guard = exit_guard_dir()
    started = []
    waits = []
    for spec in procs:
        log = os.path.join(run_dir, spec["name"] + ".log")
        rc = os.path.join(run_dir, spec["name"] + ".rc")
        announce = _expand(spec["announce"]) if spec.get("announce") else None
        for stale in (rc, rc + ".tmp", _expand(spec["failure"]), *([announce] if announce else []),
                      *([_expand(spec["error_file"])] if spec.get("error_file") else [])):
            if os.path.exists(stale):
                os.unlink(stale)
        env = dict(os.environ)
        env.update(spec["env"])
        for name in _HOST_PATHS:
            if env.get(name, "").startswith("~"):
                env[name] = _expand(env[name])
        env = with_exit_guard(env, guard)
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        offset = os.fstat(fd).st_size
        with os.fdopen(fd, "ab") as out, open(os.devnull, "rb") as devnull:
            proc = subprocess.Popen(
                [python, "-S", "-c", REAPER, rc, "--", *spec["argv"]],   # (-S: the reaper needs no site-packages)
                cwd=workdir, env=env, stdin=devnull, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True, close_fds=True,
            )
        started.append({"name": spec["name"], "pid": proc.pid, "log": log, "rc": rc, "offset": offset,
                        "address": None})
        if announce:
            waits.append((started[-1], proc, announce))
    deadline = time.monotonic() + ANNOUNCE_WAIT
    for entry, proc, path in waits:
        entry["address"] = _announced(path, proc, deadline)
    return started


def _announced(path: str, proc: subprocess.Popen, deadline: float) -> str | None:
    """The line ``proc`` wrote to ``path`` (atomically); None if it ended or ``deadline`` passed first."""
    while True:
        try:
            with open(path) as fh:
                text = fh.read().strip()
            if text:
                return text
        except FileNotFoundError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            return None
        time.sleep(0.005)


def put_key(run_dir: str, key: str) -> str:
    """Write ``key`` to ``<run_dir>/job.key`` (mode 0600, atomic); return its absolute path."""
    run_dir = private_dirs(run_dir)
    path = os.path.join(run_dir, "job.key")
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(key)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def remove_files(paths: list[str]) -> list[str]:
    """Delete ``paths`` (missing ones are fine); return those that could not be removed."""
    failed = []
    for path in paths:
        try:
            os.unlink(_expand(path))
        except FileNotFoundError:
            pass
        except OSError:
            failed.append(path)
    return failed


_EXC_LINE = re.compile(r"^([A-Za-z_][\w.]*)(: .*)?$")


_USAGE_ERROR = re.compile(r"^[\w.-]+: error: \S.*$")   # argparse's "PROG: error: MESSAGE"


def last_exception(log: str, size: int = 16384) -> str | None:
    """``Type: message`` of the last Python traceback at the end of ``log``; without one, an
    argparse error among its last lines (``train.py: error: unrecognized arguments: --x`` after
    its ``usage:`` lines; another program's ``srun: error: ...`` is no usage error); or None."""
    try:
        with open(_expand(log), "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - size))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return None
    starts = [i for i, line in enumerate(lines) if line.startswith("Traceback (most recent call last)")]
    if not starts:   # argparse prints "usage: ..." (maybe over several lines), then "PROG: error: ..."
        tail = [line.rstrip() for line in lines if line.strip()][-12:]
        usage = [i for i, line in enumerate(tail) if _USAGE_ERROR.match(line)
                 and any(earlier.startswith("usage: ") for earlier in tail[:i])]
        return tail[usage[-1]][:500] if usage else None
    found = None
    for line in lines[starts[-1] + 1:]:
        if line and not line[0].isspace():
            m = _EXC_LINE.match(line.rstrip())
            if m:
                found = line.rstrip()
                break
    return found[:500] if found else None


def _json_file(path: str) -> tuple[dict | None, float | None]:
    """The JSON object in ``path`` and when the file was last modified; (None, None) when there
    is none."""
    try:
        with open(_expand(path)) as f:
            written = os.fstat(f.fileno()).st_mtime
            data = json.load(f)
    except (OSError, ValueError):
        return None, None
    return (data, written) if isinstance(data, dict) else (None, None)


def collect(procs: list[dict]) -> list[dict]:
    """For ``{"name", "rc", "log", "failure", "error_file"}`` items (``failure``: the path of its
    failure record; ``error_file``: of its torch elastic error file, optional): ``{"rc",
    "rc_time", "failure", "exception", "error_file", "error_time"}`` (``error_file``: that file's
    JSON object, ``error_time`` its modification time)."""
    out = []
    for p in procs:
        rc_file = _expand(p["rc"]) if p.get("rc") else ""
        try:
            rc_time = os.stat(rc_file).st_mtime if rc_file else None
        except OSError:
            rc_time = None
        failure, _ = _json_file(p["failure"])
        error, error_time = _json_file(p["error_file"]) if p.get("error_file") else (None, None)
        out.append({"rc": read_rc(rc_file) if rc_file else None, "rc_time": rc_time, "failure": failure,
                    "exception": last_exception(p["log"]) if p.get("log") else None,
                    "error_file": error, "error_time": error_time})
    return out


def cleanup(run_dir: str, job_id: str, remove_dir: bool) -> dict:
    """Remove the job's key file, the run directory (``remove_dir``: only a directory named
    after the job), and ``/dev/shm/psnode.<job_id>.*``; report what could not be removed."""
    failed = []
    run_dir = _expand(run_dir) if run_dir else ""   # an older record may not name it
    targets = [os.path.join(run_dir, "job.key")] if run_dir else []
    if re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}", job_id):
        targets += glob.glob(f"/dev/shm/psnode.{job_id}.*")
    for path in targets:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            failed.append(f"{path}: {exc.strerror}")
    if run_dir and remove_dir and os.path.basename(run_dir.rstrip("/")) == job_id and os.path.isdir(run_dir):
        def note(fn: object, path: str, exc: tuple) -> None:
            if not isinstance(exc[1], FileNotFoundError):   # gone already: another host sharing
                failed.append(f"{path}: {exc[1]}")         # this filesystem removed it first
        shutil.rmtree(run_dir, onerror=note)
    return {"failed": failed}


def read_files(directory: str, suffix: str, limit: int) -> dict:
    """The files ``<directory>/*<suffix>`` (not below it): ``{"files": {name: text}, "left":
    [names not read: ``limit`` bytes in all were read, or unreadable]}``; a missing directory
    has none."""
    out: dict = {"files": {}, "left": []}
    budget = limit
    for path in sorted(glob.glob(os.path.join(glob.escape(_expand(directory)), "*" + glob.escape(suffix)))):
        name = os.path.basename(path)
        try:
            if os.path.getsize(path) > budget:
                out["left"].append(name)
                continue
            with open(path, encoding="utf-8", errors="replace") as f:
                text = f.read(budget)
        except OSError:
            out["left"].append(name)
            continue
        budget -= len(text.encode())
        out["files"][name] = text
    return out


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, pgid) of a live pid, or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read().decode()
    except OSError:
        return None
    fields = data[data.rindex(")") + 2 :].split()
    return fields[0], int(fields[2])


def group_members(pgids: list[int]) -> dict[int, list[int]]:
    """Live (non-zombie) pids of each process group in ``pgids``."""
    wanted = set(pgids)
    found: dict[int, list[int]] = {g: [] for g in pgids}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        st = _stat(int(entry))
        if st and st[1] in wanted and st[0] != "Z":
            found[st[1]].append(int(entry))
    return found


def read_rc(rc_file: str) -> int | None:
    try:
        with open(_expand(rc_file)) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def status(procs: list[dict]) -> list[dict]:
    """For ``{"pid", "rc"}`` items: ``{"alive": bool, "members": [...], "rc": int | None}``."""
    members = group_members([p["pid"] for p in procs])
    return [
        {"alive": bool(members[p["pid"]]), "members": members[p["pid"]], "rc": read_rc(p["rc"])}
        for p in procs
    ]


def signal_groups(pgids: list[int], signum: int) -> None:
    for pgid in pgids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signum)


def stop(pgids: list[int], grace: float) -> dict:
    """TERM every group, wait up to ``grace`` s, KILL what is left; report what survived."""
    live = [g for g, m in group_members(pgids).items() if m]
    signal_groups(live, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while live and time.monotonic() < deadline:
        time.sleep(0.05)
        live = [g for g, m in group_members(live).items() if m]
    killed = list(live)
    signal_groups(live, signal.SIGKILL)
    end = time.monotonic() + 5.0
    left: dict[int, list[int]] = {}
    while time.monotonic() < end:
        left = {g: m for g, m in group_members(pgids).items() if m}
        if not left:
            break
        time.sleep(0.1)
    return {"killed": killed, "left": {str(g): m for g, m in left.items()}}


def follow(log: str, rc_file: str, pid: int, offset: int, wait: bool,
           emit: Callable[[bytes], None], poll: float = 0.05, idle_poll: float = 0.25) -> dict:
    """Copy ``log`` from ``offset`` to ``emit``; with ``wait`` keep going until the process ends.

    Returns ``{"rc": int | None, "offset": int}``: ``rc`` None means the process is gone without
    a recorded status (killed with its reaper) or, without ``wait``, still running.

    While the log is quiet it is read less often (every ``poll`` seconds, up to ``idle_poll``):
    one follow per process of a job runs on its host, and a job of many processes must not spend
    its cores on reading logs.  The process's end is seen at once all the same: the wait between
    reads is on a pidfd of the process (Linux), where one can be had.
    """
    import select

    log, rc_file = _expand(log), _expand(rc_file)
    handle = None
    ended = None
    try:
        ended = os.pidfd_open(pid) if wait else None
    except (AttributeError, OSError):
        ended = None
    pause = poll
    try:
        while True:
            if handle is None and os.path.exists(log):
                handle = open(log, "rb")  # noqa: SIM115 - kept open across polls, closed below
                handle.seek(offset)
            chunk = handle.read(65536) if handle else b""
            if chunk:
                offset += len(chunk)
                emit(chunk)
                pause = poll
                continue
            rc = read_rc(rc_file)
            if not wait:
                break
            st = _stat(pid)
            if rc is not None or st is None or st[0] == "Z":
                # the process ended: drain what it wrote last, then report
                rest = handle.read() if handle else b""
                if rest:
                    offset += len(rest)
                    emit(rest)
                return {"rc": read_rc(rc_file), "offset": offset}
            if ended is not None:
                select.select([ended], [], [], pause)
            else:
                time.sleep(pause)
            pause = min(idle_poll, pause * 1.5)
    finally:
        if ended is not None:
            os.close(ended)
        if handle:
            handle.close()
    return {"rc": rc, "offset": offset}


# -- messages: every request and its reply, typed, for both ends ------------------------------

R = TypeVar("R")


class AgentRequest(Generic[R]):
    """A request to the agent, whose reply reads as ``R``.  Its wire form (:meth:`to_json`,
    :meth:`from_json`) is ``{"op": op, FIELD: value, ...}``, the fields as the operation's
    function takes them; :meth:`run` answers it on the host (the JSON result) and :meth:`reply`
    reads that result on the launcher's side.  A subclass quotes a ``list[...]`` reply type (a base
    class is evaluated: a host's older Python still reads this file and says what it lacks)."""

    op: ClassVar[str]

    def to_json(self) -> dict[str, Any]:
        return {"op": self.op, **asdict(cast(Any, self))}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> AgentRequest[R]:
        return cast(Any, cls)(**{f.name: data[f.name] for f in fields(cast(Any, cls)) if f.name in data})

    def run(self, emit: Callable[[bytes], None] | None = None) -> Any:
        raise NotImplementedError

    def reply(self, result: Any) -> R:
        raise NotImplementedError


@dataclass(frozen=True)
class CheckReply:
    """:func:`check`'s answer: ``gpus`` is :func:`gpus`'s report (read by :func:`mxdist.backends.base.host_gpus`)."""

    python: str
    executable: str
    errors: list[str]
    gpus: dict[str, Any]
    missing: dict[str, str]

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CheckReply:
        return cls(str(data["python"]), str(data["executable"]), list(data["errors"]), dict(data["gpus"] or {}),
                   dict(data["missing"] or {}))


@dataclass(frozen=True)
class CheckRequest(AgentRequest[CheckReply]):
    op: ClassVar[str] = "check"
    workdir: str
    modules: list[str]
    env: dict[str, str] | None = None
    target: list[str] | None = None    # [kind, word] (:func:`command_problem`)

    def run(self, emit: Callable[[bytes], None] | None = None) -> Any:
        return check(self.workdir, self.modules, self.env, self.target)

    def reply(self, result: Any) -> CheckReply:
        return CheckReply.from_json(result)


@dataclass(frozen=True)
class GpusRequest(AgentRequest[dict]):
    """:func:`gpus`; its report is read by :func:`mxdist.backends.base.host_gpus`."""

    op: ClassVar[str] = "gpus"
    env: dict[str, str] | None = None

    def run(self, emit: Callable[[bytes], None] | None = None) -> Any:
        return gpus(self.env)

    def reply(self, result: Any) -> dict:
        return dict(result)


@dataclass(frozen=True)
class SpawnItem:
    """One process for :func:`spawn`: ``failure`` where it writes its failure record,
    ``error_file`` its torch elastic error file (None: none)."""

    name: str
    argv: list[str]
    env: dict[str, str]
    failure: str
    error_file: str | None = None
    announce: str | None = None      # where it writes the address it bound (waited for; :func:`spawn`)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SpawnItem:
        return cls(data["name"], list(data["argv"]), dict(data["env"]), data["failure"], data.get("error_file"),
                   data.get("announce"))


@dataclass(frozen=True)
class Spawned:
    """A process :func:`spawn` started: its pid (== pgid), log and rc file, where its output
    begins in that log (``offset``: the log's size before it started), and the ``host:port`` it
    announced it bound (None: none announced)."""

    name: str
    pid: int
    log: str
    rc: str
    offset: int = 0
    address: str | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Spawned:
        return cls(str(data["name"]), int(data["pid"]), str(data["log"]), str(data["rc"]), int(data.get("offset", 0)),
                   data.get("address"))


@dataclass(frozen=True)
class SpawnRequest(AgentRequest["list[Spawned]"]):
    op: ClassVar[str] = "spawn"
    workdir: str
    run_dir: str
    python: str
    procs: list[SpawnItem]

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SpawnRequest:
        return cls(data["workdir"], data["run_dir"], data["python"], [SpawnItem.from_json(p) for p in data["procs"]])

    def run(self, emit: Callable[[bytes], None] | None = None) -> Any:
        return spawn(self.workdir, self.run_dir, self.python, [asdict(p) for p in self.procs])

    def reply(self, result: Any) -> list[Spawned]:
        return [Spawned.from_json(s) for s in result]


@dataclass(frozen=True)
class FollowReply:
    """:func:`follow`'s answer: ``rc`` None: gone without a recorded status or still running."""

    rc: int | None
    offset: int

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> FollowReply:
        return cls(data["rc"], int(data["offset"]))


@dataclass(frozen=True)
class FollowRequest(AgentRequest[FollowReply]):
    """:func:`follow`: the log streams to ``emit`` (over SSH: the agent's stdout)."""

    op: ClassVar[str] = "follow"
    log: str
    rc_file: str
    pid: int
    offset: int
    wait: bool

    def run(self, emit: Callable[[bytes], None] | None = None) -> Any:
        return follow(self.log, self.rc_file, self.pid, self.offset, self.wait, emit or (lambda data: None))

    def reply(self, result: Any) -> FollowReply:
        return FollowReply.from_json(result)


@dataclass(frozen=True)
class ProcRef:
    """A process for :func:`status`: its pid (== pgid) and rc file."""

    pid: int
    rc: str


@dataclass(frozen=True)
class Liveness:
    """:func:`status`'s answer for one process."""

    alive: bool
    members: list[int]
    rc: int | None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Liveness:
        return cls(bool(data["alive"]), [int(m) for m in data["members"]], data["rc"])


@dataclass(frozen=True)
class StatusRequest(AgentRequest["list[Liveness]"]):
    op: ClassVar[str] = "status"
    procs: list[ProcRef]

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StatusRequest:
        return cls([ProcRef(int(p["pid"]), p["rc"]) for p in data["procs"]])

    def run(self, emit: Callable[[bytes], None] | None = None) -> Any:
        return status([asdict(p) for p in self.procs])

    def reply(self, result: Any) -> list[Liveness]:
        return [Liveness.from_json(i) for i in result]


@dataclass(frozen=True)
class StopReply:
    """:func:`stop`'s answer: the groups it killed, and per group (its pgid as a string, JSON's
    keys) the pids still alive."""

    killed: list[int]
    left: dict[str, list[int]]

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> StopReply:
        return cls([int(g) for g in data["killed"]], {str(g): [int(p) for p in m] for g, m in data["left"].items()})

    def survivors(self) -> list[int]:
        """Every pid still alive, sorted."""
        return sorted(pid for pids in self.left.values() for pid in pids)


@dataclass(frozen=True)
class StopGroupsRequest(AgentRequest[StopReply]):
    op: ClassVar[str] = "stop"
    pgids: list[int]
    grace: float

    def run(self, emit: Callable[[bytes], None] | None = None) -> Any:
        return stop(self.pgids, self.grace)

    def reply(self, result: Any) -> StopReply:
        return StopReply.from_json(result)


@dataclass(frozen=True)
class SignalRequest(AgentRequest[None]):
    op: ClassVar[str] = "signal"
    pgids: list[int]
    signum: int

    def run(self, emit: Callable[[bytes], None] | None = None) -> Any:
        return signal_groups(self.pgids, self.signum)

    def reply(self, result: Any) -> None:
        return None


@dataclass(frozen=True)
class PutKeyRequest(AgentRequest[str]):
    """:func:`put_key`; the reply is the key file's absolute path."""

    op: ClassVar[str] = "put_key"
    run_dir: str
    key: str

    def run(self, emit: Callable[[bytes], None] | None = None) -> Any:
        return put_key(self.run_dir, self.key)

    def reply(self, result: Any) -> str:
        return str(result)


@dataclass(frozen=True)
class RemoveFilesRequest(AgentRequest["list[str]"]):
    """:func:`remove_files`; the reply lists those that could not be removed."""

    op: ClassVar[str] = "remove_files"
    paths: list[str]

    def run(self, emit: Callable[[bytes], None] | None = None) -> Any:
        return remove_files(self.paths)

    def reply(self, result: Any) -> list[str]:
        return [str(p) for p in result]


@dataclass(frozen=True)
class CollectItem:
    """A process for :func:`collect`: ``rc``, ``log``: its files (empty: none);
    ``failure``: where its failure record is; ``error_file``: its torch elastic error file."""

    name: str
    rc: str
    log: str
    failure: str
    error_file: str | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CollectItem:
        return cls(data["name"], data["rc"], data["log"], data["failure"], data.get("error_file"))


@dataclass(frozen=True)
class Collected:
    """What :func:`collect` found of one process: ``failure`` and ``error_file`` the JSON objects
    of its failure record and torch elastic error file, ``rc_time`` and ``error_time`` when its
    exit status and that error file were written."""

    rc: int | None
    rc_time: float | None
    failure: dict[str, Any] | None
    exception: str | None
    error_file: dict[str, Any] | None
    error_time: float | None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Collected:
        return cls(data["rc"], data["rc_time"], data["failure"], data["exception"], data.get("error_file"),
                   data.get("error_time"))


@dataclass(frozen=True)
class CollectRequest(AgentRequest["list[Collected]"]):
    op: ClassVar[str] = "collect"
    procs: list[CollectItem]

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CollectRequest:
        return cls([CollectItem.from_json(p) for p in data["procs"]])

    def run(self, emit: Callable[[bytes], None] | None = None) -> Any:
        return collect([asdict(p) for p in self.procs])

    def reply(self, result: Any) -> list[Collected]:
        return [Collected.from_json(i) for i in result]


@dataclass(frozen=True)
class CleanupReply:
    """:func:`cleanup`'s answer: ``PATH: why`` for each thing that could not be removed."""

    failed: list[str]

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> CleanupReply:
        return cls([str(f) for f in data["failed"]])


@dataclass(frozen=True)
class CleanupRequest(AgentRequest[CleanupReply]):
    op: ClassVar[str] = "cleanup"
    run_dir: str
    job_id: str
    remove_dir: bool

    def run(self, emit: Callable[[bytes], None] | None = None) -> Any:
        return cleanup(self.run_dir, self.job_id, self.remove_dir)

    def reply(self, result: Any) -> CleanupReply:
        return CleanupReply.from_json(result)


@dataclass(frozen=True)
class FilesReply:
    """:func:`read_files`'s answer: the text of each file read, by name; the names not read."""

    files: dict[str, str]
    left: list[str]

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> FilesReply:
        return cls({str(k): str(v) for k, v in data["files"].items()}, [str(n) for n in data["left"]])


@dataclass(frozen=True)
class ReadFilesRequest(AgentRequest[FilesReply]):
    op: ClassVar[str] = "read_files"
    directory: str
    suffix: str
    limit: int

    def run(self, emit: Callable[[bytes], None] | None = None) -> Any:
        return read_files(self.directory, self.suffix, self.limit)

    def reply(self, result: Any) -> FilesReply:
        return FilesReply.from_json(result)


@dataclass(frozen=True)
class Answer:
    """The agent's answer to one request on the wire: ``{"result": ...}`` or ``{"error": text}``."""

    result: Any = None
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"error": self.error} if self.error is not None else {"result": self.result}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Answer:
        return cls(error=str(data["error"])) if "error" in data else cls(result=data["result"])


REQUESTS: dict[str, type[AgentRequest[Any]]] = {c.op: c for c in (
    CheckRequest, GpusRequest, SpawnRequest, FollowRequest, StatusRequest, StopGroupsRequest, SignalRequest,
    PutKeyRequest, RemoveFilesRequest, CollectRequest, CleanupRequest, ReadFilesRequest)}
# follow streams on stdout, so it runs once; a served spawn costs a round trip, not a Python start (its
# processes' reapers are the serving agent's children until it ends: an ended one, a zombie, counts as dead)
SERVED = frozenset(REQUESTS) - {"follow"}
BOOT = 'import sys;_i=sys.stdin.buffer;exec(compile(_i.read(int(_i.readline())),"mxdist-agent","exec"))'


def request_from_json(data: dict[str, Any]) -> AgentRequest[Any]:
    """The request ``data`` (its wire form) asks for; ValueError for an unknown operation."""
    kind = REQUESTS.get(str(data.get("op")))
    if kind is None:
        raise ValueError(f"unknown operation {data.get('op')!r}")
    return kind.from_json(data)


def answer(request: AgentRequest[R], emit: Callable[[bytes], None] | None = None) -> R:
    """Answer ``request`` here (what the local backends call), read as its reply."""
    return request.reply(request.run(emit))


def _main(data: dict) -> int:
    """Entry point when run once remotely: one operation (its wire form), JSON answer on
    stderr's last line."""
    request = request_from_json(data)
    if isinstance(request, FollowRequest):
        out = sys.stdout.buffer

        def emit(chunk: bytes) -> None:
            out.write(chunk)
            out.flush()

        result = request.run(emit)
    else:
        result = request.run()
    sys.stderr.write("\n" + json.dumps(Answer(result=result).to_json()) + "\n")
    sys.stderr.flush()
    return 0


def serve() -> int:
    """Answer requests (their wire form, one JSON line each on stdin) until stdin ends: an
    :class:`Answer`, one JSON line each on stdout.  Only the answers reach stdout (what else
    writes to it, a child process included, goes to /dev/null)."""
    replies = os.fdopen(os.dup(1), "wb")
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.close(null)
    for line in sys.stdin.buffer:
        try:
            data = json.loads(line)
            if data.get("op") not in SERVED:
                raise ValueError(f"{data.get('op')!r} is not served")
            reply = Answer(result=request_from_json(data).run())
        except Exception:  # noqa: BLE001 - the launcher reports it per host
            import traceback

            reply = Answer(error=traceback.format_exc())
        replies.write(json.dumps(reply.to_json()).encode() + b"\n")
        replies.flush()
    return 0

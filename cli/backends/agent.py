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
``SpawnRequest``, ...) whose type argument is its reply's type (``CheckReply``, ``list[Spawned]``,
...), defined here once for both ends; each field is spelled once, in its dataclass.  One
writer and one reader serve every message, driven by the dataclass's fields and their
annotations: :func:`to_json` and :func:`from_json`, which raises :class:`MessageError` naming a
field that is unknown, missing or of another type.  The operations take and return these
dataclasses.  The launcher builds a request and reads the reply with the request's
:meth:`AgentRequest.reply`; the agent reads the request with :func:`request_from_json` and
answers it with :meth:`AgentRequest.run`.  They live in this file, not in a module of their
own, because this file is what reaches the remote Python: one source, sent whole, keeps both
ends the same version with nothing else to send.  The wire form is ``{"op": OP, FIELD: value,
...}`` in, an :class:`Answer` (its reply's wire form as ``result``, or ``error``) out; the local
backends call :func:`answer` on the same request objects, without JSON.  The Slurm preflight's
line per node is :class:`NodeCheck`, whose source :mod:`mxdist.backends.slurm` sends with
:func:`gpus`'s and the writer's.  Only the backends import this module; the rest of the
launcher asks a backend.

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
import types
import typing
from collections.abc import Callable
from dataclasses import MISSING, dataclass, field, fields, is_dataclass, replace
from typing import Any, ClassVar, Generic, TypeVar

if sys.version_info < (3, 10):  # noqa: UP036 - a host runs its own Python, maybe older than the launcher's
    raise SystemExit(f"mxdist's host agent needs Python 3.10 or newer; {sys.executable} is "
                     f"{sys.version.split()[0]} (pass --python with a newer one)")

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


# -- the wire: one writer and one reader for every message, driven by its dataclass's fields ----

class MessageError(ValueError):
    """A message that does not read as its type: the text names the field, what it holds and
    what it takes (the two ends run different sources: send the same mxdist to both)."""


def to_json(value: Any) -> Any:
    """``value``'s JSON form: a dataclass as an object of its fields, a list or tuple as a list, a
    dict with its keys as strings, anything else as it is.  Self-contained."""
    from dataclasses import fields, is_dataclass

    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_json(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    if isinstance(value, dict):
        return {str(k): to_json(v) for k, v in value.items()}
    return value


_HINTS: dict[type, dict[str, Any]] = {}
_SCALARS: dict[Any, str] = {str: "a string", int: "an integer", float: "a number", bool: "true or false"}


def from_json(kind: Any, data: Any, where: str = "") -> Any:
    """``data`` (parsed JSON) read as ``kind``: a dataclass (each field as its annotation says;
    a field left out takes its default), ``list[X]``, ``tuple[X, ...]``, ``dict[str, X]``, ``X |
    None``, ``str``, ``int``, ``float``, ``bool`` or ``Any``.  :class:`MessageError` names the
    first field (``where``: the path to it) that is unknown, missing or of another type."""
    where = where or getattr(kind, "__name__", str(kind))
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if kind is Any:
        return data
    if kind is type(None):
        if data is None:
            return None
        raise _wrong(where, "null", data)
    if origin is typing.Union or origin is types.UnionType:
        if data is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        for option in options:
            try:
                return from_json(option, data, where)
            except MessageError:
                if len(options) == 1:
                    raise
        raise _wrong(where, " or ".join(getattr(a, "__name__", str(a)) for a in args), data)
    if is_dataclass(kind) and isinstance(kind, type):
        return _read_fields(kind, data, where)
    if origin in (list, tuple) or kind in (list, tuple):
        if not isinstance(data, list):
            raise _wrong(where, "a list", data)
        items = [from_json(args[0] if args else Any, x, f"{where}[{i}]") for i, x in enumerate(data)]
        return tuple(items) if tuple in (origin, kind) else items
    if origin is dict or kind is dict:
        if not isinstance(data, dict):
            raise _wrong(where, "an object", data)
        return {k: from_json(args[1] if args else Any, v, f"{where}[{k!r}]") for k, v in data.items()}
    if kind in _SCALARS:
        if isinstance(data, bool) is (kind is bool) and isinstance(data, (int, float) if kind is float else kind):
            return float(data) if kind is float else data
        raise _wrong(where, _SCALARS[kind], data)
    raise TypeError(f"{where}: {kind!r} has no wire form")


def _read_fields(kind: type, data: Any, where: str) -> Any:
    """A dataclass ``kind`` from its JSON object ``data`` (:func:`from_json`)."""
    if not isinstance(data, dict):
        raise _wrong(where, f"an object ({kind.__name__})", data)
    hints = _HINTS.get(kind)
    if hints is None:
        hints = _HINTS[kind] = typing.get_type_hints(kind)
    known = {f.name: f for f in fields(kind) if f.init}
    unknown = [name for name in data if name not in known]
    if unknown:
        raise MessageError(f"{where}: unknown field {unknown[0]!r} ({kind.__name__}'s fields: {', '.join(known)})")
    missing = [n for n, f in known.items() if n not in data and f.default is MISSING and f.default_factory is MISSING]
    if missing:
        raise MessageError(f"{where}: missing field {missing[0]!r} ({kind.__name__}'s fields: {', '.join(known)})")
    return kind(**{name: from_json(hints[name], value, f"{where}.{name}") for name, value in data.items()})


def _wrong(where: str, expected: str, data: Any) -> MessageError:
    shown = repr(data)
    return MessageError(f"{where}: expected {expected}, got {shown[:80] + ('...' if len(shown) > 80 else '')} "
                        f"({type(data).__name__})")



def _expand(path: str) -> str:
    return os.path.abspath(os.path.expanduser(path))


def gpus(env: dict | None = None, timeout: float = 20.0) -> GpusReport:
    """The GPUs of this host as a process started with ``env`` (added to this environment) sees
    them: ``CUDA_VISIBLE_DEVICES`` (None: unset), nvidia-smi's list, and why nvidia-smi gave no
    list (None: it gave one).  No nvidia-smi on the PATH: no GPU and no error.  Self-contained
    with :class:`GpuEntry` and :class:`GpusReport` (the Slurm preflight runs their source)."""
    import os
    import shutil
    import subprocess

    merged = {**os.environ, **(env or {})}
    visible = merged.get("CUDA_VISIBLE_DEVICES")
    smi = shutil.which("nvidia-smi", path=merged.get("PATH"))
    if smi is None:
        return GpusReport(visible)
    try:
        proc = subprocess.run([smi, "--query-gpu=index,uuid,name,memory.total", "--format=csv,noheader,nounits"],
                               capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return GpusReport(visible, error=f"{smi} did not answer within {timeout:g} s")
    except OSError as exc:
        return GpusReport(visible, error=f"cannot run {smi}: {exc.strerror or exc}")
    if proc.returncode != 0:
        said = [line.strip() for line in (proc.stderr + proc.stdout).splitlines() if line.strip()]
        first = said[0][:300] if said else "no message"
        return GpusReport(visible, error=f"{smi} failed (exit {proc.returncode}): {first}")
    listed = []
    for line in proc.stdout.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 4 or not parts[0].isdigit():
            continue
        memory = parts[-1]
        listed.append(GpuEntry(int(parts[0]), parts[1], ",".join(parts[2:-1]).strip(),
                               int(memory) if memory.isdigit() else None))
    return GpusReport(visible, listed)


@dataclass(frozen=True)
class GpuEntry:
    """One GPU of :func:`gpus`'s report: its index as nvidia-smi numbers it, uuid, name and memory."""

    index: int
    uuid: str = ""
    name: str = ""
    memory_mib: int | None = None


@dataclass(frozen=True)
class GpusReport:
    """:func:`gpus`'s report: ``visible``, the ``CUDA_VISIBLE_DEVICES`` a process gets (None:
    unset); ``gpus``, what nvidia-smi lists; ``error``, why nvidia-smi gave no list (None: it
    gave one, or there is no nvidia-smi: a CPU host)."""

    visible: str | None = None
    gpus: list[GpuEntry] = field(default_factory=list)
    error: str | None = None


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
    ``MXDIST-CHECK`` and the JSON of the node (its ``SLURMD_NODENAME``), what is wrong there, and
    :func:`gpus`'s report.  Self-contained with :func:`to_json` (the Slurm preflight runs its
    source); :meth:`from_line` is None for any other line, :class:`MessageError` for a check line
    that does not read."""

    node: str | None
    errors: list[str]
    gpus: GpusReport

    MARK: ClassVar[str] = "MXDIST-CHECK"

    def to_line(self) -> str:
        import json

        return f"{self.MARK} {json.dumps(to_json(self))}"

    @classmethod
    def from_line(cls, line: str) -> NodeCheck | None:
        mark, _, text = line.partition(" ")
        if mark != cls.MARK:
            return None
        try:
            data = json.loads(text)
        except ValueError:
            raise MessageError(f"a node's preflight answer is no JSON: {text[:80]!r}") from None
        return from_json(cls, data, "NodeCheck")


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


def check(workdir: str, modules: list[str], env: dict | None = None, target: list | None = None) -> CheckReply:
    """Preflight: Python version, the workdir, whether ``modules`` import with ``env`` from
    there as the job's processes import them, whether the job's command (``target``: ``[kind,
    word]``, :func:`command_problem`) is there, and the GPUs a process with ``env`` sees there
    (:func:`gpus`).

    ``modules`` import in ``workdir`` (the scheduler's and servers' ``python -m psnode`` runs
    there, with it on the path); a ``.py`` script that imports psnode must also import it from the
    script's own folder (``python dir/script.py`` puts that folder, not ``workdir``, on its path).
    ``missing``: ``{module: why}`` for every module that does not import (one error names them)."""
    errors: list[str] = []
    out = CheckReply(sys.version.split()[0], sys.executable, errors, gpus(env), {})
    workdir = _expand(workdir)
    if not os.path.isdir(workdir):
        errors.append(f"working directory {workdir} does not exist")
        return out
    problem = command_problem(workdir, target[0], target[1], env) if target else None
    if problem:
        errors.append(problem)
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
        errors.append(f"{sys.executable} cannot import {', '.join(missing)} in {workdir}: {first}")
    elif folder and found[-1]:
        missing = found[-1]
        errors.append(
            f"{sys.executable} cannot import psnode from {word}'s folder {folder} "
            f"(python puts the script's folder on its path, not {workdir}): {missing['psnode']}")
    out.missing.update(missing)
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


def spawn(workdir: str, run_dir: str, python: str, procs: list[SpawnItem]) -> list[Spawned]:
    """Start each process of ``procs`` under a reaper (stale files of its ``failure`` record and
    ``error_file`` are removed first); the processes started, each with ``offset``, the log's size
    before it started (where its output begins).  Every process gets psnode's exit guard first
    on its ``PYTHONPATH`` (:func:`exit_guard_dir`).

    ``announce``: the file where the process writes the ``host:port`` it bound (a scheduler,
    ``PSNODE_ADDRESS_FILE``); once all are started, each is waited for (until it is written, the
    process ends, or :data:`ANNOUNCE_WAIT`) and its address returned (None: not written)."""
    run_dir = private_dirs(run_dir)
    workdir = _expand(workdir)
    guard = exit_guard_dir()
    started = []
    for spec in procs:
        log = os.path.join(run_dir, spec.name + ".log")
        rc = os.path.join(run_dir, spec.name + ".rc")
        announce = _expand(spec.announce) if spec.announce else None
        for stale in (rc, rc + ".tmp", _expand(spec.failure), *([announce] if announce else []),
                      *([_expand(spec.error_file)] if spec.error_file else [])):
            if os.path.exists(stale):
                os.unlink(stale)
        env = dict(os.environ)
        env.update(spec.env)
        for name in _HOST_PATHS:
            if env.get(name, "").startswith("~"):
                env[name] = _expand(env[name])
        env = with_exit_guard(env, guard)
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        offset = os.fstat(fd).st_size
        with os.fdopen(fd, "ab") as out, open(os.devnull, "rb") as devnull:
            proc = subprocess.Popen(
                [python, "-S", "-c", REAPER, rc, "--", *spec.argv],   # (-S: the reaper needs no site-packages)
                cwd=workdir, env=env, stdin=devnull, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True, close_fds=True,
            )
        started.append((Spawned(spec.name, proc.pid, log, rc, offset), proc, announce))
    deadline = time.monotonic() + ANNOUNCE_WAIT
    return [replace(entry, address=_announced(path, proc, deadline)) if path else entry
            for entry, proc, path in started]


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


def collect(procs: list[CollectItem]) -> list[Collected]:
    """What each process of ``procs`` left: its exit status and when it was written, its failure
    record, the last exception of its log, its torch elastic error file and when that was written."""
    out = []
    for p in procs:
        rc_file = _expand(p.rc) if p.rc else ""
        try:
            rc_time = os.stat(rc_file).st_mtime if rc_file else None
        except OSError:
            rc_time = None
        failure, _ = _json_file(p.failure)
        error, error_time = _json_file(p.error_file) if p.error_file else (None, None)
        out.append(Collected(read_rc(rc_file) if rc_file else None, rc_time, failure,
                             last_exception(p.log) if p.log else None, error, error_time))
    return out


def cleanup(run_dir: str, job_id: str, remove_dir: bool) -> CleanupReply:
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
    return CleanupReply(failed)


def read_files(directory: str, suffix: str, limit: int) -> FilesReply:
    """The files ``<directory>/*<suffix>`` (not below it): the text of each by name, and the
    names not read (``limit`` bytes in all were read, or unreadable); a missing directory has none."""
    out = FilesReply({}, [])
    budget = limit
    for path in sorted(glob.glob(os.path.join(glob.escape(_expand(directory)), "*" + glob.escape(suffix)))):
        name = os.path.basename(path)
        try:
            if os.path.getsize(path) > budget:
                out.left.append(name)
                continue
            with open(path, encoding="utf-8", errors="replace") as f:
                text = f.read(budget)
        except OSError:
            out.left.append(name)
            continue
        budget -= len(text.encode())
        out.files[name] = text
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


def status(procs: list[ProcRef]) -> list[Liveness]:
    """Whether each process's group has a live member, its members, and its recorded exit status."""
    members = group_members([p.pid for p in procs])
    return [Liveness(bool(members[p.pid]), members[p.pid], read_rc(p.rc)) for p in procs]


def signal_groups(pgids: list[int], signum: int) -> None:
    for pgid in pgids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signum)


def stop(pgids: list[int], grace: float) -> StopReply:
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
    return StopReply(killed, {str(g): m for g, m in left.items()})


def follow(log: str, rc_file: str, pid: int, offset: int, wait: bool,
           emit: Callable[[bytes], None], poll: float = 0.05, idle_poll: float = 0.25) -> FollowReply:
    """Copy ``log`` from ``offset`` to ``emit``; with ``wait`` keep going until the process ends.

    Returns the exit status and the offset reached: ``rc`` None means the process is gone without
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
                return FollowReply(read_rc(rc_file), offset)
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
    return FollowReply(rc, offset)


# -- messages: every request and its reply, typed once, for both ends ---------------------------

R = TypeVar("R")


class AgentRequest(Generic[R]):
    """A request to the agent, whose reply is an ``R`` (the subclass's type argument).  Its wire
    form is ``{"op": op, FIELD: value, ...}`` (:meth:`to_json`, :meth:`from_json`), its reply's
    :func:`to_json`; :meth:`run` answers it on the host and :meth:`reply` reads that answer's
    wire form on the launcher's side.  Fields are read and written by :func:`to_json` and
    :func:`from_json` from the dataclass alone: each is spelled once."""

    op: ClassVar[str]

    def to_json(self) -> dict[str, Any]:
        return {"op": self.op, **to_json(self)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> AgentRequest[R]:
        """The request of ``data`` (``op`` is its class's); :class:`MessageError` if it does not read."""
        return from_json(cls, {k: v for k, v in data.items() if k != "op"}, cls.op)

    @classmethod
    def reply_type(cls) -> Any:
        """``R``: the type its reply reads as."""
        for base in getattr(cls, "__orig_bases__", ()):
            if typing.get_origin(base) is AgentRequest:
                return typing.get_args(base)[0]
        raise TypeError(f"{cls.__name__} names no reply type")

    def run(self, emit: Callable[[bytes], None] | None = None) -> R:
        raise NotImplementedError

    def reply(self, result: Any) -> R:
        """The reply whose wire form is ``result``; :class:`MessageError` if it does not read."""
        return from_json(self.reply_type(), result, f"the {self.op} reply")


@dataclass(frozen=True)
class CheckReply:
    """:func:`check`'s answer: the Python's version and path, what is wrong (for the job's
    processes), the GPUs (read by :func:`mxdist.backends.base.host_gpus`), and ``{module: why}``
    for each module that does not import."""

    python: str
    executable: str
    errors: list[str]
    gpus: GpusReport
    missing: dict[str, str]


@dataclass(frozen=True)
class CheckRequest(AgentRequest[CheckReply]):
    op: ClassVar[str] = "check"
    workdir: str
    modules: list[str]
    env: dict[str, str] | None = None
    target: list[str] | None = None    # [kind, word] (:func:`command_problem`)

    def run(self, emit: Callable[[bytes], None] | None = None) -> CheckReply:
        return check(self.workdir, self.modules, self.env, self.target)


@dataclass(frozen=True)
class GpusRequest(AgentRequest[GpusReport]):
    """:func:`gpus`; its report is read by :func:`mxdist.backends.base.host_gpus`."""

    op: ClassVar[str] = "gpus"
    env: dict[str, str] | None = None

    def run(self, emit: Callable[[bytes], None] | None = None) -> GpusReport:
        return gpus(self.env)


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


@dataclass(frozen=True)
class SpawnRequest(AgentRequest[list[Spawned]]):
    op: ClassVar[str] = "spawn"
    workdir: str
    run_dir: str
    python: str
    procs: list[SpawnItem]

    def run(self, emit: Callable[[bytes], None] | None = None) -> list[Spawned]:
        return spawn(self.workdir, self.run_dir, self.python, self.procs)


@dataclass(frozen=True)
class FollowReply:
    """:func:`follow`'s answer: ``rc`` None: gone without a recorded status or still running."""

    rc: int | None
    offset: int


@dataclass(frozen=True)
class FollowRequest(AgentRequest[FollowReply]):
    """:func:`follow`: the log streams to ``emit`` (over SSH: the agent's stdout)."""

    op: ClassVar[str] = "follow"
    log: str
    rc_file: str
    pid: int
    offset: int
    wait: bool

    def run(self, emit: Callable[[bytes], None] | None = None) -> FollowReply:
        return follow(self.log, self.rc_file, self.pid, self.offset, self.wait, emit or (lambda data: None))


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


@dataclass(frozen=True)
class StatusRequest(AgentRequest[list[Liveness]]):
    op: ClassVar[str] = "status"
    procs: list[ProcRef]

    def run(self, emit: Callable[[bytes], None] | None = None) -> list[Liveness]:
        return status(self.procs)


@dataclass(frozen=True)
class StopReply:
    """:func:`stop`'s answer: the groups it killed, and per group (its pgid as a string, JSON's
    keys) the pids still alive."""

    killed: list[int]
    left: dict[str, list[int]]

    def survivors(self) -> list[int]:
        """Every pid still alive, sorted."""
        return sorted(pid for pids in self.left.values() for pid in pids)


@dataclass(frozen=True)
class StopGroupsRequest(AgentRequest[StopReply]):
    op: ClassVar[str] = "stop"
    pgids: list[int]
    grace: float

    def run(self, emit: Callable[[bytes], None] | None = None) -> StopReply:
        return stop(self.pgids, self.grace)


@dataclass(frozen=True)
class SignalRequest(AgentRequest[None]):
    op: ClassVar[str] = "signal"
    pgids: list[int]
    signum: int

    def run(self, emit: Callable[[bytes], None] | None = None) -> None:
        signal_groups(self.pgids, self.signum)


@dataclass(frozen=True)
class PutKeyRequest(AgentRequest[str]):
    """:func:`put_key`; the reply is the key file's absolute path."""

    op: ClassVar[str] = "put_key"
    run_dir: str
    key: str

    def run(self, emit: Callable[[bytes], None] | None = None) -> str:
        return put_key(self.run_dir, self.key)


@dataclass(frozen=True)
class RemoveFilesRequest(AgentRequest[list[str]]):
    """:func:`remove_files`; the reply lists those that could not be removed."""

    op: ClassVar[str] = "remove_files"
    paths: list[str]

    def run(self, emit: Callable[[bytes], None] | None = None) -> list[str]:
        return remove_files(self.paths)


@dataclass(frozen=True)
class CollectItem:
    """A process for :func:`collect`: ``rc``, ``log``: its files (empty: none);
    ``failure``: where its failure record is; ``error_file``: its torch elastic error file."""

    name: str
    rc: str
    log: str
    failure: str
    error_file: str | None = None


@dataclass(frozen=True)
class Collected:
    """What :func:`collect` found of one process: ``failure`` and ``error_file`` the JSON objects
    of its failure record and torch elastic error file, ``rc_time`` and ``error_time`` when its
    exit status and that error file were written."""

    rc: int | None
    rc_time: float | None
    failure: dict[str, Any] | None
    exception: str | None
    error_file: dict[str, Any] | None = None
    error_time: float | None = None


@dataclass(frozen=True)
class CollectRequest(AgentRequest[list[Collected]]):
    op: ClassVar[str] = "collect"
    procs: list[CollectItem]

    def run(self, emit: Callable[[bytes], None] | None = None) -> list[Collected]:
        return collect(self.procs)


@dataclass(frozen=True)
class CleanupReply:
    """:func:`cleanup`'s answer: ``PATH: why`` for each thing that could not be removed."""

    failed: list[str]


@dataclass(frozen=True)
class CleanupRequest(AgentRequest[CleanupReply]):
    op: ClassVar[str] = "cleanup"
    run_dir: str
    job_id: str
    remove_dir: bool

    def run(self, emit: Callable[[bytes], None] | None = None) -> CleanupReply:
        return cleanup(self.run_dir, self.job_id, self.remove_dir)


@dataclass(frozen=True)
class FilesReply:
    """:func:`read_files`'s answer: the text of each file read, by name; the names not read."""

    files: dict[str, str]
    left: list[str]


@dataclass(frozen=True)
class ReadFilesRequest(AgentRequest[FilesReply]):
    op: ClassVar[str] = "read_files"
    directory: str
    suffix: str
    limit: int

    def run(self, emit: Callable[[bytes], None] | None = None) -> FilesReply:
        return read_files(self.directory, self.suffix, self.limit)


@dataclass(frozen=True)
class Answer:
    """The agent's answer to one request on the wire: its reply's wire form in ``result``, or
    ``error``, why it failed (the other is None).  Self-contained with :func:`to_json` (a follow
    runs its source)."""

    result: Any = None
    error: str | None = None


REQUESTS: dict[str, type[AgentRequest[Any]]] = {c.op: c for c in (
    CheckRequest, GpusRequest, SpawnRequest, FollowRequest, StatusRequest, StopGroupsRequest, SignalRequest,
    PutKeyRequest, RemoveFilesRequest, CollectRequest, CleanupRequest, ReadFilesRequest)}
# follow streams on stdout, so it runs once; a served spawn costs a round trip, not a Python start (its
# processes' reapers are the serving agent's children until it ends: an ended one, a zombie, counts as dead)
SERVED = frozenset(REQUESTS) - {"follow"}
BOOT = 'import sys;_i=sys.stdin.buffer;exec(compile(_i.read(int(_i.readline())),"mxdist-agent","exec"))'


def request_from_json(data: dict[str, Any]) -> AgentRequest[Any]:
    """The request ``data`` (its wire form) asks for; MessageError (a ValueError) for an unknown
    operation or a field that does not read."""
    kind = REQUESTS.get(str(data.get("op")))
    if kind is None:
        raise MessageError(f"unknown operation {data.get('op')!r} (the agent answers {', '.join(REQUESTS)})")
    return kind.from_json(data)


def answer(request: AgentRequest[R], emit: Callable[[bytes], None] | None = None) -> R:
    """Answer ``request`` here (what the local backends call): its reply, without a wire between."""
    return request.run(emit)


def _main(data: dict) -> int:
    """Entry point when run once remotely: one operation (its wire form), its :class:`Answer` as
    JSON on stderr's last line."""
    request = request_from_json(data)
    if isinstance(request, FollowRequest):
        out = sys.stdout.buffer

        def emit(chunk: bytes) -> None:
            out.write(chunk)
            out.flush()

        result = request.run(emit)
    else:
        result = request.run()
    sys.stderr.write("\n" + json.dumps(to_json(Answer(to_json(result)))) + "\n")
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
                raise MessageError(f"{data.get('op')!r} is not served")
            reply = Answer(to_json(request_from_json(data).run()))
        except MessageError as exc:
            reply = Answer(error=f"MessageError: {exc}")
        except Exception:  # noqa: BLE001 - the launcher reports it per host
            import traceback

            reply = Answer(error=traceback.format_exc())
        replies.write(json.dumps(to_json(reply)).encode() + b"\n")
        replies.flush()
    return 0

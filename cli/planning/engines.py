"""Engines (``mxdist launch --engine``): what runs as a job's scheduler and servers, with which
environment, and what ``mxdist status`` can ask them.

An engine is a small strategy object (:class:`JobEngine`); the plan, the options, the supervisor
and ``mxdist status`` ask it, never its name.  Pure: no I/O.

* ``psnode`` (default): the scheduler and servers are ``python -m psnode``; every process gets
  ``NodeConfig(...).to_env()`` (the ``PSNODE_*`` contract, :mod:`psnode.config`); the scheduler
  answers ``mxdist status`` live; every ``mxdist launch`` option applies.
* ``mxnet``: MXNet's own ps-lite processes, for scripts that call ``mx.kv.create('dist_sync')``
  (what MXNet's ``tools/launch.py`` starts): the scheduler and servers are ``python -c "import
  mxnet"`` (MXNet serves at import, by ``DMLC_ROLE``, and exits once every worker's kvstore is
  closed).  Every process gets the variables ps-lite reads:

  ======================  =================================================================
  ``DMLC_ROLE``           ``scheduler``, ``server`` or ``worker``
  ``DMLC_PS_ROOT_URI``    the scheduler host's address (from the hosts file; Slurm: the node's)
  ``DMLC_PS_ROOT_PORT``   the scheduler's port (``--port``, else picked as psnode's is)
  ``DMLC_NUM_SERVER``     ``-s``
  ``DMLC_NUM_WORKER``     ``-n``
  ``DMLC_NODE_HOST``      the address of the process's own host: where it binds
  ======================  =================================================================

  ``DMLC_INTERFACE`` is not set: ps-lite reads it only without ``DMLC_NODE_HOST`` (pass it
  through, or ``-e``, if your build wants it).  Workers also get the torch-style variables
  (:mod:`mxdist.planning.plan`); ``RANK`` is mxdist's rank of the worker (``worker-N``), while MXNet's
  ``kv.rank`` is the order ps-lite's scheduler gives the workers (it cannot be set).  A ``.py``
  worker runs through :data:`MXNET_BOOT` (``python -c MXNET_BOOT script.py ARGS``): as ``python
  script.py``, except that a failing worker ends at once, so the job fails naming it instead of
  hanging (MXNet's kvstore waits at exit, in a ps-lite barrier, for every other worker).

  ps-lite has no authentication (the job runs ``insecure``), no status to ask, no restarts and
  no checkpoints: the psnode options that ask for those are refused naming the option; those
  MXNet's processes satisfy anyway (``--no-shm``, ``--cpu-policy normal``, ``--insecure``) are
  accepted with a note.
"""
from __future__ import annotations

import shlex
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from psnode.config import NodeConfig, Role

#: How the mxnet engine runs a worker's ``.py`` script: ``python -c MXNET_BOOT SCRIPT ARGS...`` runs
#: SCRIPT as ``python SCRIPT ARGS...`` does (compiled and run in the ``__main__`` module, the same
#: ``sys.argv``, the script's directory first on ``sys.path``), except that a worker that fails (an
#: uncaught exception, ``sys.exit`` non-zero) prints its traceback (``sys.excepthook``) or message,
#: runs the ``atexit`` handlers (logging's flush among them) and exits at once (``os._exit``): an
#: MXNet worker that ends normally destroys its dist kvstore, which waits for every other worker in
#: a ps-lite barrier, so a failed worker would hang the job instead of ending it.  Standard library
#: only.
MXNET_BOOT = """\
def _mxdist_boot():
    import __main__, atexit, os, sys
    del __main__._mxdist_boot
    script = os.path.abspath(sys.argv[1])
    del sys.argv[0]
    sys.path[0] = os.path.dirname(os.path.realpath(script))
    __main__.__file__, __main__.__cached__ = script, None
    try:
        with open(script, "rb") as source:
            code = compile(source.read(), script, "exec")
        exec(code, __main__.__dict__)
        return
    except SystemExit as stop:
        if stop.code is None or stop.code == 0:
            raise
        if not isinstance(stop.code, int):
            print(stop.code, file=sys.stderr)
        status = stop.code if isinstance(stop.code, int) else 1
    except BaseException as exc:
        tb = exc.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != script:
            tb = tb.tb_next
        sys.excepthook(type(exc), exc, exc.with_traceback(tb).__traceback__)
        status = 1
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(status)
_mxdist_boot()
"""


class EngineError(ValueError):
    """Options the engine cannot run (each refused option named, with the reason)."""


@dataclass(frozen=True)
class NodeFacts:
    """What the plan knows about one process, for its engine to turn into its environment."""

    job_id: str
    role: Role
    rank: int | None
    host: str                       # the address of its host: where it binds
    port: int                       # where it listens (0: any free port)
    scheduler: str                  # the scheduler host's address
    scheduler_port: int
    num_workers: int
    num_servers: int
    node: Mapping[str, Any] = field(default_factory=dict)   # the psnode options (NodeConfig fields)
    key_file: str | None = None     # the job's secret on its host (None: insecure)
    error_file: str | None = None   # where it writes its failure record
    address_file: str | None = None   # a scheduler: where it writes the address it bound (a taken port replaced)
    timeline: str | None = None     # --timeline: the directory it appends its timeline events to
    min_workers: int | None = None  # an elastic job's bounds (None: num_workers, a job of fixed size)
    max_workers: int | None = None


class JobEngine(ABC):
    """What the launcher needs to know about an engine (one instance per engine, stateless)."""

    name: ClassVar[str]                        # --engine
    modules: ClassVar[tuple[str, ...]]         # preflight: --python imports these on every host
    live_status: ClassVar[bool]                # its scheduler answers mxdist status (psnode.launcher.status)
    status_note: ClassVar[str]                 # what mxdist status says instead, when not live
    secured: ClassVar[bool]                    # its processes read the job's secret (else: the job is insecure)
    min_servers: ClassVar[int]                 # -s below this is refused
    passthrough: ClassVar[tuple[str, ...]]     # launcher variables every process gets (besides plan.PASSTHROUGH)
    reserved_env: ClassVar[Mapping[str, str]]  # variables mxdist sets (-e refuses them) -> what sets them

    @abstractmethod
    def admit(self, flags: Sequence[str]) -> list[str]:
        """The launch options given (their flags): notes for those it accepts without acting on
        them; :class:`EngineError` naming every one it cannot run."""

    @abstractmethod
    def daemon_argv(self, python: str) -> tuple[str, ...]:
        """The command of the scheduler and of each server."""

    @abstractmethod
    def worker_argv(self, argv: tuple[str, ...], script: bool) -> tuple[str, ...]:
        """A worker's command, from the one planned (``script``: it runs a ``.py`` file with
        Python, ``argv[0]`` that Python and ``argv[1]`` the file)."""

    @abstractmethod
    def env(self, node: NodeFacts) -> dict[str, str]:
        """The engine's variables for one process (they win over every other layer)."""

    def show_argv(self, argv: Sequence[str]) -> str:
        """A process's command as ``--dry-run`` shows it (a shell line)."""
        return shlex.join(argv)

    @abstractmethod
    def rest_ends_alone(self, ask: Callable[[], bool | None]) -> bool | None:
        """Once every worker exited 0: do the scheduler and servers end by themselves (they get
        ``--finish-grace``)?  ``ask``: the scheduler's answer (psnode's: did the job use it)."""


class PsnodeEngine(JobEngine):
    """psnode's scheduler and servers (``python -m psnode``); see the module docstring."""

    name = "psnode"
    modules = ("psnode", "numpy", "zmq")   # what every process of the job imports
    live_status = True
    status_note = ""
    secured = True
    min_servers = 0
    passthrough = ()
    reserved_env: ClassVar[Mapping[str, str]] = {}   # (every PSNODE_* is refused by mxdist.planning.plan)

    def admit(self, flags: Sequence[str]) -> list[str]:
        return []

    def daemon_argv(self, python: str) -> tuple[str, ...]:
        return (python, "-m", "psnode")

    def worker_argv(self, argv: tuple[str, ...], script: bool) -> tuple[str, ...]:
        return argv

    def env(self, node: NodeFacts) -> dict[str, str]:
        """``NodeConfig(...).to_env()``; psnode.errors.ConfigError for values it refuses."""
        bounds: dict[str, Any] = {k: v for k, v in (("min_workers", node.min_workers),
                                                    ("max_workers", node.max_workers)) if v is not None}
        cfg = NodeConfig(role=node.role, host=node.host, port=node.port, rank=node.rank,  # type: ignore[arg-type]
                         key_file=node.key_file, error_file=node.error_file, timeline=node.timeline,
                         address_file=node.address_file, scheduler_host=node.scheduler,
                         scheduler_port=node.scheduler_port, num_workers=node.num_workers,
                         num_servers=node.num_servers, job_id=node.job_id, **node.node, **bounds)
        return cfg.to_env()

    def rest_ends_alone(self, ask: Callable[[], bool | None]) -> bool | None:
        return ask()


_NO_CHECKPOINTS = "MXNet's servers keep no checkpoints (save from a worker: trainer.save_states, net.save_parameters)"


class MxnetEngine(JobEngine):
    """MXNet's ps-lite scheduler and servers (``python -c "import mxnet"``, ``DMLC_*``); see the
    module docstring."""

    name = "mxnet"
    modules = ("mxnet",)
    live_status = False
    status_note = ("MXNet's scheduler (ps-lite) has no status to ask: each process's state is checked "
                   "on its host; no heartbeats, pushes or rates")
    secured = False
    min_servers = 1
    passthrough = ("MXNET_*", "DMLC_INTERFACE", "PS_*")
    reserved_env: ClassVar[Mapping[str, str]] = {
        "DMLC_ROLE": "each process's role",
        "DMLC_PS_ROOT_URI": "--scheduler (the scheduler host's address)",
        "DMLC_PS_ROOT_PORT": "--port",
        "DMLC_NUM_SERVER": "-s/--num-servers",
        "DMLC_NUM_WORKER": "-n/--num-workers",
        "DMLC_NODE_HOST": "the hosts' addresses (the hosts file)",
    }
    #: flags that ask for what ps-lite cannot do -> why
    REFUSED: ClassVar[Mapping[str, str]] = {
        "--distribution": "MXNet's servers place keys their own way (big arrays split by MXNET_KVSTORE_BIGARRAY_BOUND)",
        "--heartbeat-interval": "ps-lite's heartbeats are set with -e PS_HEARTBEAT_INTERVAL=SECONDS",
        "--heartbeat-liveness": "ps-lite's heartbeats are set with -e PS_HEARTBEAT_TIMEOUT=SECONDS",
        "--log-level": "that is psnode's log level; ps-lite logs more with -e PS_VERBOSE=1 (or 2)",
        "--slice-bytes": "MXNet's servers split big arrays their own way (MXNET_KVSTORE_BIGARRAY_BOUND)",
        "--checkpoint-dir": _NO_CHECKPOINTS,
        "--checkpoint-interval": _NO_CHECKPOINTS,
        "--checkpoint-rounds": _NO_CHECKPOINTS,
        "--resume": _NO_CHECKPOINTS,
        "--replicas": "MXNet's servers keep each key's state once, in their own memory",
        "--skip-nonfinite": "MXNet's servers apply every gradient they get",
        "--max-restarts": "ps-lite cannot take a restarted worker or server back into a running job",
        "--encrypt": "ps-lite neither authenticates nor encrypts its links",
        "--min-workers": "ps-lite's workers are fixed at the start (DMLC_NUM_WORKER)",
        "--max-workers": "ps-lite's workers are fixed at the start (DMLC_NUM_WORKER)",
        "--host-discovery-script": "ps-lite's workers are fixed at the start (DMLC_NUM_WORKER)",
        "--start-timeout": "ps-lite's scheduler waits for its nodes as long as it does (no setting for it)",
        "--stall-warning": "ps-lite's nodes report no waits (the slow worker is named for psnode jobs only)",
        "--backup-workers": "MXNet's servers wait for every worker's push in each dist_sync round",
    }
    #: flags that MXNet's processes satisfy without mxdist doing anything -> why
    ACCEPTED: ClassVar[Mapping[str, str]] = {
        "--no-shm": "MXNet's processes exchange data over ps-lite's TCP links only",
        "--cpu-policy": "MXNet's processes run under the scheduling policy they get (normal)",
        "--insecure": "",
    }
    UNAUTHENTICATED = ("MXNet's ps-lite does not authenticate: anyone who reaches the job's ports can join it "
                       "or send to it (trusted networks only; --insecure says so and drops this note)")

    def admit(self, flags: Sequence[str]) -> list[str]:
        refused = [f"{flag}: {self.REFUSED.get(flag, 'a psnode option')}" for flag in flags
                   if flag not in self.ACCEPTED]
        if refused:
            raise EngineError("--engine mxnet runs MXNet's own scheduler and servers, which cannot honour "
                              + "; ".join(refused))
        notes = [f"--engine mxnet: {flag} needs nothing from mxdist: {self.ACCEPTED[flag]}" for flag in flags
                 if self.ACCEPTED[flag]]
        if "--insecure" not in flags:
            notes.append(self.UNAUTHENTICATED)
        return notes

    def daemon_argv(self, python: str) -> tuple[str, ...]:
        return (python, "-c", "import mxnet")

    def worker_argv(self, argv: tuple[str, ...], script: bool) -> tuple[str, ...]:
        return (argv[0], "-c", MXNET_BOOT, *argv[1:]) if script else argv

    def show_argv(self, argv: Sequence[str]) -> str:
        """The bootstrap's code is shown by its name."""
        return " ".join("MXNET_BOOT" if word == MXNET_BOOT else shlex.quote(word) for word in argv)

    def env(self, node: NodeFacts) -> dict[str, str]:
        return {"DMLC_ROLE": node.role.value, "DMLC_PS_ROOT_URI": node.scheduler,
                "DMLC_PS_ROOT_PORT": str(node.scheduler_port), "DMLC_NUM_SERVER": str(node.num_servers),
                "DMLC_NUM_WORKER": str(node.num_workers), "DMLC_NODE_HOST": node.host}

    def rest_ends_alone(self, ask: Callable[[], bool | None]) -> bool | None:
        return True     # they end when the workers' kvstores close; nothing to ask


PSNODE = PsnodeEngine()
MXNET = MxnetEngine()
ENGINES: Mapping[str, JobEngine] = {e.name: e for e in (PSNODE, MXNET)}


def engine_named(name: str) -> JobEngine:
    """The engine called ``name`` (EngineError naming the choices)."""
    try:
        return ENGINES[name]
    except KeyError:
        raise EngineError(f"--engine {name!r}: choose {' or '.join(ENGINES)}") from None

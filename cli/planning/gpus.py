"""GPUs: what each host shows a job's processes, and which of them each worker gets.

Pure: no I/O.  Inputs are what preflight found on each host (:class:`HostGpus`: a backend reads its
host agent's report into one, :func:`mxdist.backends.base.host_gpus`) and the workers' local ranks;
:mod:`mxdist.planning.plan` puts the results into the workers' environments (:func:`mxdist.planning.plan.with_gpus`).

Contract:

* **Default: visibility is left alone**, as torchrun does.  Every worker sees all of its host's
  GPUs (or the user's ``CUDA_VISIBLE_DEVICES``) and its device is ``cuda:LOCAL_RANK``: the
  seed's ``DDP(model, device_ids=[args.local_rank])`` needs exactly that device to exist.  A
  host that shows GPUs but runs more workers than it has gets a warning (those local ranks have
  no ``cuda:LOCAL_RANK``); a host without GPUs is fine.
* **``--gpus-per-worker N``**: the worker with local rank ``l`` on a host gets entries
  ``l*N .. l*N+N-1`` of that host's GPU list as its ``CUDA_VISIBLE_DEVICES``, so inside it they
  are ``cuda:0 .. cuda:N-1`` (``cuda:LOCAL_RANK`` then exists only for ``l < N``).
* **A host's GPU list** is the ``CUDA_VISIBLE_DEVICES`` its processes get when that is set
  (yours, passed through or given with ``-e``, or the host's own: Slurm sets it for a GPU
  allocation), else nvidia-smi's indices.  Built from nvidia-smi's indices, a worker's
  ``CUDA_VISIBLE_DEVICES`` comes with ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` (unless set), so CUDA
  numbers the GPUs as nvidia-smi does (its default order is fastest first).
* **Too few GPUs** is a :class:`GpuShortage` per host (what it has, what was asked, the fix),
  found before anything starts.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

VISIBLE = "CUDA_VISIBLE_DEVICES"
ORDER = "CUDA_DEVICE_ORDER"


class GpuSource(str, Enum):
    """Where a host's GPU list comes from."""

    SMI = "nvidia-smi"
    ENV = "CUDA_VISIBLE_DEVICES"
    NONE = "none"            # no nvidia-smi and no CUDA_VISIBLE_DEVICES: a CPU host


@dataclass(frozen=True)
class Gpu:
    """One GPU nvidia-smi lists."""

    index: str
    name: str = ""
    memory_mib: int | None = None


@dataclass(frozen=True)
class HostGpus:
    """The GPUs a host shows a job's processes.

    ``devices``: the entries a worker's ``CUDA_VISIBLE_DEVICES`` may take, in order;
    ``listed``: what nvidia-smi listed (all of the host's GPUs); ``problem``: why nvidia-smi
    gave no list (it failed or did not answer), or None.
    """

    devices: tuple[str, ...] = ()
    source: GpuSource = GpuSource.NONE
    listed: tuple[Gpu, ...] = ()
    problem: str | None = None

    @classmethod
    def from_visible(cls, value: str) -> HostGpus:
        """A host whose processes get ``CUDA_VISIBLE_DEVICES=value`` (nvidia-smi not asked)."""
        return cls(parse_visible(value), GpuSource.ENV)

    def describe(self) -> str:
        """``no GPU``, ``2 GPUs 0,1 (2 x NVIDIA H200)``, ``CUDA_VISIBLE_DEVICES=2,3: 2 GPUs``."""
        if self.source is GpuSource.ENV:
            text = f"{VISIBLE}={','.join(self.devices)}: {_count(len(self.devices))}"
            if self.listed:
                text += f" of the {_count(len(self.listed))} nvidia-smi lists"
        elif self.devices:
            text = f"{_count(len(self.devices))} {','.join(self.devices)} ({_models(self.listed)})"
        else:
            text = "no GPU"
        return f"{text} ({self.problem})" if self.problem else text


#: A host without GPUs, and nothing wrong in asking it (what most hosts of a CPU job report).
NO_GPUS = HostGpus()


def _count(n: int) -> str:
    return "no GPU" if n == 0 else f"{n} GPU{'s' if n != 1 else ''}"


def _models(listed: Sequence[Gpu]) -> str:
    names = Counter(g.name or "unnamed" for g in listed)
    memory = {g.memory_mib for g in listed}
    text = ", ".join(f"{n} x {name}" for name, n in names.items())
    each = next(iter(memory)) if len(memory) == 1 else None
    if each:
        text += f", {each / 1024:.0f} GiB each"
    return text


def parse_visible(value: str) -> tuple[str, ...]:
    """``CUDA_VISIBLE_DEVICES`` as CUDA reads it: comma-separated entries up to the first
    invalid one (``-1`` hides the rest); empty: no GPU."""
    out = []
    for entry in value.split(","):
        entry = entry.strip()
        if not entry or entry.startswith("-"):
            break
        out.append(entry)
    return tuple(out)


def worker_slots(local_rank: int, per_worker: int) -> range:
    """Positions in its host's GPU list of the worker with this local rank."""
    return range(local_rank * per_worker, (local_rank + 1) * per_worker)


def worker_env(devices: Sequence[str], host: HostGpus, env: Mapping[str, str]) -> dict[str, str]:
    """The variables that give a worker ``devices`` (added to its ``env``)."""
    out = {VISIBLE: ",".join(devices)}
    if host.source is GpuSource.SMI and ORDER not in env:
        out[ORDER] = "PCI_BUS_ID"
    return out


def cuda_range(per_worker: int) -> str:
    """How a worker given ``per_worker`` GPUs names them: ``cuda:0`` or ``cuda:0-3``."""
    return "cuda:0" if per_worker == 1 else f"cuda:0-{per_worker - 1}"


def describe_worker(local_rank: int, env: Mapping[str, str], per_worker: int | None,
                    devices: Sequence[str] | None, host: HostGpus | None) -> tuple[str, str]:
    """(visible GPUs, the cuda device(s) its LOCAL_RANK maps to) of one worker, for the plan.

    ``devices``: what ``--gpus-per-worker`` gave it (None: not placed yet, or not asked);
    ``host``: its host's GPUs when known (None: nothing is said of them).
    """
    if per_worker:
        if devices is not None:
            return ",".join(devices), cuda_range(per_worker)
        slots = worker_slots(local_rank, per_worker)
        where = f"#{slots.start}" if per_worker == 1 else f"#{slots.start}-{slots.stop - 1}"
        return f"host's {where} (at preflight)", cuda_range(per_worker)
    device = f"cuda:{local_rank}"
    if VISIBLE in env:
        visible = parse_visible(env[VISIBLE])
        shown = ",".join(visible) if visible else "none"
        return shown, device if local_rank < len(visible) else f"{device} (not visible)"
    if host is None:   # not known before preflight (a remote host): nothing to show
        return "", ""
    if not host.devices:
        return "all (no GPU)", "-"
    return "all", device if local_rank < len(host.devices) else f"{device} (host has {len(host.devices)})"


@dataclass(frozen=True)
class GpuShortage:
    """A host whose workers ask for more GPUs than it shows."""

    host: str
    has: HostGpus
    workers: int          # workers on that host
    per_worker: int

    @property
    def needed(self) -> int:
        return self.workers * self.per_worker

    @property
    def reason(self) -> str:
        return (f"has {self.has.describe()}, but its {self.workers} worker{'s' if self.workers != 1 else ''} "
                f"x --gpus-per-worker {self.per_worker} need {_count(self.needed)}")

    @property
    def fix(self) -> str:
        return ("run fewer workers there (-n, or slots=N in the hosts file), lower --gpus-per-worker, "
                "or leave --gpus-per-worker out to give every worker all of its host's GPUs")


def shortages(hosts: Mapping[str, HostGpus], workers: Mapping[str, int], per_worker: int) -> list[GpuShortage]:
    """Every host (in ``workers``' order: label -> its number of workers) without enough GPUs."""
    out = []
    for label, count in workers.items():
        have = hosts.get(label, HostGpus())
        if count * per_worker > len(have.devices):
            out.append(GpuShortage(label, have, count, per_worker))
    return out


def sharing_warnings(hosts: Mapping[str, HostGpus], workers: Mapping[str, int]) -> list[str]:
    """Without ``--gpus-per-worker``: hosts that show GPUs but fewer than their workers."""
    out = []
    for label, count in workers.items():
        have = hosts.get(label)
        n = len(have.devices) if have else 0
        if have is not None and 0 < n < count:
            ranks = f"{n}" if count - n == 1 else f"{n}-{count - 1}"
            out.append(f"{label} runs {count} workers but shows {_count(n)}: cuda:LOCAL_RANK does not "
                       f"exist for local rank{'s' if count - n > 1 else ''} {ranks} (a script using "
                       "device_ids=[args.local_rank] fails there; use LOCAL_RANK % torch.cuda.device_count() "
                       "to share GPUs, or run fewer workers)")
    return out

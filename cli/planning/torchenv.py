"""torchrun's environment contract, for every worker of every backend (pure: no I/O).

Frameworks (PyTorch Lightning, Hugging Face Accelerate, the HF Trainer, plain
``init_process_group``) learn where a process is from the variables torchrun sets; every
mxdist worker gets all of them, computed here from mxdist's placement (:mod:`mxdist.planning.plan`),
whatever the backend (local, ssh, slurm) and the engine:

============================== ================================================================
``RANK``, ``ROLE_RANK``        the worker's rank (mxdist's ``worker-N``)
``WORLD_SIZE``,                the number of workers
``ROLE_WORLD_SIZE``
``LOCAL_RANK``                 its index among the workers of its host, in placement order
``LOCAL_WORLD_SIZE``           the number of workers on its host
``GROUP_RANK``, ``NODE_RANK``  its host's node rank: the hosts with workers, in host order, from 0
``GROUP_WORLD_SIZE``           the number of hosts with workers
``ROLE_NAME``                  ``default`` (torchrun's role name)
``MASTER_ADDR``                the scheduler host's address; rank 0 serves torch's store there
``MASTER_PORT``                ``--port`` + 1 (a port of its own, picked free by default)
``TORCHELASTIC_RUN_ID``        the mxdist job id
``TORCHELASTIC_RESTART_COUNT`` how many times this worker was restarted (``--max-restarts``)
``TORCHELASTIC_MAX_RESTARTS``  ``--max-restarts``
``TORCHELASTIC_ERROR_FILE``    ``<run dir>/worker-N.torch-error.json`` on its host
                               (:func:`psnode.protocol.failure.torch_path_in`): where torch's
                               ``@record`` writes the exception that ended the worker, which the
                               root cause reads (set when the job has a run directory)
============================== ================================================================

``TORCHELASTIC_USE_AGENT_STORE`` is left unset: no agent serves a store, rank 0's
``init_process_group`` does, on ``MASTER_ADDR:MASTER_PORT``.

Elastic membership (``--min-workers``/``--max-workers``): mxdist restarts no running worker when
the membership changes, so every worker keeps the values it started with; a worker started
later (a joiner) gets values that describe the membership it joins: ``WORLD_SIZE`` the target,
``LOCAL_WORLD_SIZE`` the workers on its host after the change, and its host's node rank kept
stable: a host keeps the node rank it got first, a host new to the job takes the next one
(:func:`node_ranks`), and ``GROUP_WORLD_SIZE`` counts the hosts that ever ran a worker of the
job (so ``GROUP_RANK < GROUP_WORLD_SIZE`` always holds).  A restarted worker gets its own values
again with the restart count raised (:func:`restarted`).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from psnode.launcher import torch_path_in

#: torchrun's role name (one role per job).
ROLE_NAME = "default"

#: Every variable :func:`torch_env` sets (``TORCHELASTIC_ERROR_FILE`` only with a run directory).
VARIABLES: tuple[str, ...] = (
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK", "GROUP_WORLD_SIZE",
    "ROLE_RANK", "ROLE_NAME", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_ERROR_FILE",
)

RESTART_COUNT = "TORCHELASTIC_RESTART_COUNT"


@dataclass(frozen=True)
class TorchJob:
    """What every worker of a job shares: the run id (the job id), torch's rendezvous address,
    ``--max-restarts`` and the run directory on the hosts (None: no error files)."""

    run_id: str
    master_addr: str
    master_port: int
    max_restarts: int = 0
    run_dir: str | None = None


@dataclass(frozen=True)
class TorchPlace:
    """Where one worker is, in torchrun's terms (see the module docstring)."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    nodes: int

    def __post_init__(self) -> None:
        if not (0 <= self.local_rank < self.local_world_size and 0 <= self.node_rank < self.nodes
                and self.rank >= 0 and self.world_size >= 1):
            raise ValueError(f"inconsistent placement {self}")


def node_ranks(known: Sequence[str], hosts: Sequence[str]) -> tuple[str, ...]:
    """The host labels in node-rank order: ``known`` (the job's, in their order) first, then each
    label of ``hosts`` not among them, in order of first appearance."""
    order = list(known)
    for label in hosts:
        if label not in order:
            order.append(label)
    return tuple(order)


def places(worker_hosts: Sequence[str]) -> tuple[tuple[str, ...], list[TorchPlace]]:
    """The node order and each worker's place, for workers ``0..n-1`` on ``worker_hosts[rank]``
    (host labels, from the placement): local ranks count a host's workers in rank order."""
    nodes = node_ranks((), worker_hosts)
    per_host = {label: worker_hosts.count(label) for label in nodes}
    seen: dict[str, int] = {}
    out = []
    for rank, label in enumerate(worker_hosts):
        local = seen.get(label, 0)
        seen[label] = local + 1
        out.append(TorchPlace(rank, len(worker_hosts), local, per_host[label], nodes.index(label), len(nodes)))
    return nodes, out


def torch_env(job: TorchJob, place: TorchPlace, name: str, restart_count: int = 0) -> dict[str, str]:
    """The torchrun variables of worker ``name`` (``worker-N``) at ``place``."""
    env = {
        "RANK": str(place.rank),
        "WORLD_SIZE": str(place.world_size),
        "LOCAL_RANK": str(place.local_rank),
        "LOCAL_WORLD_SIZE": str(place.local_world_size),
        "GROUP_RANK": str(place.node_rank),
        "NODE_RANK": str(place.node_rank),
        "GROUP_WORLD_SIZE": str(place.nodes),
        "ROLE_RANK": str(place.rank),
        "ROLE_NAME": ROLE_NAME,
        "ROLE_WORLD_SIZE": str(place.world_size),
        "MASTER_ADDR": job.master_addr,
        "MASTER_PORT": str(job.master_port),
        "TORCHELASTIC_RUN_ID": job.run_id,
        RESTART_COUNT: str(restart_count),
        "TORCHELASTIC_MAX_RESTARTS": str(job.max_restarts),
    }
    if job.run_dir:
        env["TORCHELASTIC_ERROR_FILE"] = torch_path_in(job.run_dir, name)
    return env


def restarted(env: Mapping[str, str], count: int) -> dict[str, str]:
    """``env`` with the restart count ``count`` (unchanged when it has no torchrun variables: a
    server)."""
    return {**env, RESTART_COUNT: str(count)} if RESTART_COUNT in env else dict(env)


__all__ = ["RESTART_COUNT", "ROLE_NAME", "VARIABLES", "TorchJob", "TorchPlace", "node_ranks", "places", "restarted",
           "torch_env"]

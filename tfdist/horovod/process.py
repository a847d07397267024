"""Horovod's process model: which rank this process is, and where its peers are.

Horovod runs one process per device. Each process learns its rank from its launcher's
environment; tfdist reads the same variables, and the peers' addresses from the cluster tfdist
detects (TF_CONFIG, or SLURM), because its collectives are TensorFlow's, which need them:

- `tfdist horovodrun` and `tfdist launch` give each process TF_CONFIG (rank = its index among
  the chief and the workers), and `horovodrun` also Horovod's own HOROVOD_RANK, HOROVOD_SIZE,
  HOROVOD_LOCAL_RANK, ... .
- A SLURM step (`srun`) gives SLURM_PROCID and the node list, from which tfdist's SLURM
  detection builds the cluster (ports from TFDIST_SLURM_PORT).
- HOROVOD_* and Open MPI's OMPI_COMM_WORLD_* variables, when present, must agree with that
  cluster: a disagreement is an error, never a silent pick of one.

`Ranks` is the answer; `ranks_from_environment(env)` computes it. Imports the cluster package
and nothing of TensorFlow.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Mapping, Optional, Tuple

from tfdist.cluster import ClusterSpec, detect_cluster
from tfdist.errors import ClusterConfigError

__all__ = ["Ranks", "ranks_from_environment"]

# The variables that name a rank and a size, by the launcher that sets them (Horovod's own
# first: horovodrun sets them beside the MPI or Gloo ones).
RANK_VARIABLES: Tuple[Tuple[str, str, str, str], ...] = (
    ("HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE"),
    (
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "OMPI_COMM_WORLD_LOCAL_SIZE",
    ),
    ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
)


@dataclasses.dataclass(frozen=True)
class Ranks:
    """Where this process stands in a Horovod-style job.

    Attributes:
        rank / size: this process among all; the number of processes.
        local_rank / local_size: among the processes on this host.
        cross_rank / cross_size: this host among the hosts that run a process with this
            local_rank (Horovod's definition: the number of hosts, in a homogeneous job).
        cluster: ClusterSpec. The job's tasks (the chief, if any, then the workers), with this
            process's task set; None for a job of one process.
        source: str. What gave the ranks ("TF_CONFIG", "SLURM", "single process").
    """

    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int
    cluster: Optional[ClusterSpec]
    source: str

    @property
    def task(self) -> Optional[Tuple[str, int]]:
        """(job, index) of this process in `cluster`."""
        if self.cluster is None:
            return None
        return self.cluster.task_type, self.cluster.task_index


def _host(address: str) -> str:
    host = address.rpartition(":")[0].strip("[]")
    return "127.0.0.1" if host in ("localhost", "::1", "0.0.0.0") else host


def _declared(env: Mapping[str, str]) -> Optional[Tuple[str, int, int, Optional[int]]]:
    """(variable, rank, size, local_rank) from the first launcher whose variables are set."""
    for rank_name, size_name, local_name, _ in RANK_VARIABLES:
        if rank_name in env and size_name in env:
            try:
                rank, size = int(env[rank_name]), int(env[size_name])
                local = int(env[local_name]) if local_name in env else None
            except ValueError as err:
                raise ClusterConfigError(
                    f"{rank_name}={env.get(rank_name)!r} / {size_name}={env.get(size_name)!r} "
                    "are not whole numbers. HINT: unset them, or start the job with tfdist "
                    "horovodrun, which sets them."
                ) from err
            return rank_name, rank, size, local
    return None


def ranks_from_environment(env: Optional[Mapping[str, str]] = None) -> Ranks:
    """This process's ranks, from `env` (default `os.environ`).

    Raises:
        ClusterConfigError: the variables disagree, the cluster has tasks Horovod has no place
            for (ps, evaluator), or a launcher gave a rank but no addresses of the peers.
    """
    env = os.environ if env is None else env
    declared = _declared(env)
    cluster = detect_cluster(env)
    if cluster.is_single_process:
        if declared is not None and declared[2] > 1:
            name, rank, size, _ = declared
            raise ClusterConfigError(
                f"{name}={rank} of size {size}, but tfdist finds no addresses of the other "
                "processes (no TF_CONFIG, no SLURM step). tfdist's Horovod API runs its "
                "collectives over TensorFlow's, which connect the processes by address. HINT: "
                "start the job with `tfdist horovodrun -np N python train.py` on one machine, "
                "with `srun` under SLURM, or give each process a TF_CONFIG."
            )
        return Ranks(0, 1, 0, 1, 0, 1, None, "single process")
    if cluster.num_ps or "evaluator" in cluster.cluster:
        raise ClusterConfigError(
            f"The cluster {cluster.cluster} has ps or evaluator tasks; a Horovod-style job is "
            "one process per device, all alike. HINT: for parameter servers use "
            "tfdist.make_strategy('parameter_server'); here start only workers (tfdist "
            "horovodrun -np N)."
        )
    tasks = [task for task in cluster.tasks if task[0] in ("chief", "worker")]
    me = (cluster.task_type, cluster.task_index)
    if me not in tasks:
        raise ClusterConfigError(
            f"This process is task {cluster.task} of {cluster.cluster}, not a chief or worker "
            "task. HINT: run the Horovod script only in the chief and worker tasks."
        )
    rank, size = tasks.index(me), len(tasks)
    hosts = [_host(cluster.cluster[job][index]) for job, index in tasks]
    local_rank = hosts[:rank].count(hosts[rank])
    local_size = hosts.count(hosts[rank])
    order = list(dict.fromkeys(hosts))
    cross_rank = order.index(hosts[rank])
    cross_size = sum(1 for host in order if hosts.count(host) > local_rank)
    source = "TF_CONFIG" if env.get("TF_CONFIG", "").strip() else "SLURM"
    if declared is not None:
        name, their_rank, their_size, their_local = declared
        if (their_rank, their_size) != (rank, size) or (
            their_local is not None and their_local != local_rank
        ):
            raise ClusterConfigError(
                f"{name} says rank {their_rank} of {their_size}"
                + (f" (local rank {their_local})" if their_local is not None else "")
                + f", but {source} makes this process rank {rank} of {size} (local rank "
                f"{local_rank}, task {cluster.task}). HINT: start every process with the same "
                "launcher (tfdist horovodrun sets both consistently), or unset one of them."
            )
    return Ranks(rank, size, local_rank, local_size, cross_rank, cross_size, cluster, source)

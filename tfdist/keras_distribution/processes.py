"""The processes of a `keras.distribution` job: `keras.distribution.initialize()` on TensorFlow.

On TensorFlow every process runs a gRPC server that every other process connects to, so a job
is a tfdist ClusterSpec of workers, and `initialize` builds its MultiWorkerMirroredStrategy
(through `tfdist.make_strategy`, with its fixes and its bounded wait for the peers). Without
arguments the cluster is `tfdist.detect_cluster()`: TF_CONFIG, `tfdist launch`, or SLURM. With
JAX's explicit form, `job_addresses` must list every process ("host:port,host:port"), not only
the coordinator.

Imports tfdist.cluster, tfdist.errors and tfdist.strategy (TensorFlow inside functions).
"""

from __future__ import annotations

import threading
from typing import Optional

from tfdist.cluster import ClusterSpec, detect_cluster
from tfdist.errors import is_count, is_int

__all__ = ["initialize", "initialize_from_environment", "num_processes", "process_id", "strategy"]

_LOCK = threading.RLock()
_STATE = {"cluster": None, "strategy": None}


def _explicit_cluster(job_addresses, num_processes, process_id) -> ClusterSpec:
    if isinstance(job_addresses, str):
        addresses = [a.strip() for a in job_addresses.split(",") if a.strip()]
    elif isinstance(job_addresses, (list, tuple)):
        addresses = [str(a).strip() for a in job_addresses]
    else:
        raise TypeError(
            f"job_addresses must be a string 'host:port,host:port' (or a list of them). "
            f"Received: job_addresses={job_addresses!r}."
        )
    if num_processes is not None and not is_count(num_processes, 1):
        raise ValueError(
            f"num_processes must be a positive integer. Received: num_processes={num_processes!r}."
        )
    count = num_processes if num_processes is not None else len(addresses)
    if len(addresses) != count:
        raise ValueError(
            f"keras.distribution.initialize(job_addresses={job_addresses!r}, "
            f"num_processes={num_processes!r}): {len(addresses)} address(es) for {count} "
            "processes. On TensorFlow every process connects to every other, so job_addresses "
            "lists all of them in process order (on JAX the coordinator's alone is enough). "
            "HINT: job_addresses='host0:port,host1:port,...', or call initialize() without "
            "arguments under TF_CONFIG, `tfdist launch` or SLURM."
        )
    if not is_int(process_id) or not 0 <= process_id < count:
        raise ValueError(
            f"process_id must be an integer in [0, {count}). Received: process_id={process_id!r}."
            " HINT: pass this process's index in job_addresses (0 for the first)."
        )
    return ClusterSpec.from_hosts(workers=addresses, task_index=process_id)


def initialize(job_addresses=None, num_processes=None, process_id=None) -> None:
    """Joins this process to its job; a no-op in a single process. Called by Keras.

    Raises:
        ValueError / TypeError: explicit arguments that do not describe a job, or a job with
            parameter servers (keras.distribution is synchronous).
        RuntimeError: called again for another job, or after TensorFlow initialised.
    """
    if job_addresses is None and (num_processes not in (None, 1) or process_id not in (None, 0)):
        raise ValueError(
            f"keras.distribution.initialize(num_processes={num_processes!r}, "
            f"process_id={process_id!r}) needs job_addresses on TensorFlow: every process "
            "connects to every other. HINT: also pass job_addresses='host0:port,host1:port', "
            "set KERAS_DISTRIBUTION_JOB_ADDRESSES, or start the job with `tfdist launch` / "
            "TF_CONFIG / SLURM and call initialize() without arguments."
        )
    if job_addresses is None:
        cluster = detect_cluster()
    else:
        cluster = _explicit_cluster(job_addresses, num_processes, process_id)
    _join(cluster)


def initialize_from_environment() -> None:
    """`initialize()` when the environment describes a multi-process job and nobody called it.

    Listing devices or setting a distribution in such a job without `initialize()` would train
    each process alone; on TensorFlow the job is known from the environment, so it is joined.
    """
    if _STATE["cluster"] is None:
        cluster = detect_cluster()
        if not cluster.is_single_process and cluster.num_workers > 1 and not cluster.num_ps:
            _join(cluster)


def _join(cluster: ClusterSpec) -> None:
    with _LOCK:
        if _STATE["cluster"] is not None:
            if _STATE["cluster"] == cluster:
                return
            raise RuntimeError(
                f"keras.distribution.initialize() was already called for {_STATE['cluster']!r}; "
                f"now for {cluster!r}. TensorFlow joins one job per process. HINT: call it once."
            )
        if cluster.num_ps:
            raise ValueError(
                f"keras.distribution runs synchronous training, but the cluster {cluster!r} has "
                "a 'ps' job. HINT: drop the ps tasks for keras.distribution, or use "
                "tfdist.make_strategy('parameter_server') with strategy.scope() for "
                "parameter-server training."
            )
        if cluster.is_single_process or cluster.num_workers == 1:
            _STATE["cluster"] = cluster
            return
        from tfdist.strategy import make_strategy

        _STATE["strategy"] = make_strategy("multi_worker_mirrored", cluster=cluster)
        _STATE["cluster"] = cluster


def num_processes() -> int:
    cluster = _STATE["cluster"]
    return 1 if cluster is None or cluster.is_single_process else cluster.num_workers


def process_id() -> int:
    cluster = _STATE["cluster"]
    if cluster is None or cluster.is_single_process:
        return 0
    index = cluster.task_index or 0  # the chief, if any, is process 0 (as the strategy counts)
    return index + 1 if cluster.has_chief and cluster.task_type == "worker" else index


def strategy() -> Optional[object]:
    """The job's MultiWorkerMirroredStrategy, or None in a single process."""
    return _STATE["strategy"]

"""The worker and ps servers of a parameter-server job: one script serves in every role.

`serve` runs this process as its task's gRPC server (never returns); `start_local_servers`
starts servers inside this process, for tests and demos. Imports the cluster (and TensorFlow
inside functions).
"""

from __future__ import annotations

from typing import Optional, Sequence

from tfdist.cluster import ClusterConfigError, ClusterSpec, detect_cluster

__all__ = ["serve", "server_config", "start_local_servers"]


def server_config(num_workers: int):
    """The ConfigProto for a worker/ps server of a parameter-server cluster.

    On a 2-core host TensorFlow's default inter-op pool is too small: the servers deadlock
    unless inter_op_parallelism_threads >= workers + 1.
    """
    import tensorflow as tf

    config = tf.compat.v1.ConfigProto()
    config.inter_op_parallelism_threads = max(num_workers + 1, 2)
    return config


def start_local_servers(cluster: ClusterSpec, tasks: Optional[Sequence[tuple]] = None) -> list:
    """Starts in-process gRPC servers for `tasks` of `cluster` (default: every worker and ps).

    For tests and demos of parameter-server training in one process. The servers live until
    the process exits (TensorFlow cannot stop them).

    Returns:
        list[tf.distribute.Server]
    """
    import tensorflow as tf

    if tasks is None:
        tasks = [(job, i) for job, i in cluster.tasks if job in ("worker", "ps")]
    config = server_config(cluster.num_workers)
    spec = cluster.to_tf()
    return [
        tf.distribute.Server(
            spec, job_name=job, task_index=index, protocol="grpc", config=config, start=True
        )
        for job, index in tasks
    ]


def serve(cluster: Optional[ClusterSpec] = None) -> None:
    """Runs this process as a worker or ps server of a parameter-server job; never returns.

    Args:
        cluster: ClusterSpec. Defaults to `tfdist.detect_cluster()`.
    """
    if cluster is None:
        cluster = detect_cluster()
    if cluster.task_type not in ("worker", "ps") or not cluster.num_ps:
        raise ClusterConfigError(
            f"serve() runs the worker and ps tasks of a parameter-server job; this task is "
            f"{cluster.task!r} of {cluster!r}."
        )
    server = start_local_servers(cluster, [(cluster.task_type, cluster.task_index)])[0]
    server.join()

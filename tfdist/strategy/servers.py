"""The worker and ps servers of a parameter-server job: one script serves in every role.

`serve` runs this process as its task's gRPC server (never returns); `start_local_servers`
starts servers inside this process, for tests and demos, and warns when they are reachable from
other hosts. Imports the cluster, settings and netns (and TensorFlow inside
functions).
"""

from __future__ import annotations

import warnings
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

    if not isinstance(cluster, ClusterSpec):
        raise TypeError(
            f"start_local_servers(cluster) needs a tfdist.ClusterSpec. Received: {cluster!r} (of "
            f"type {type(cluster).__name__}). HINT: e.g. tfdist.ClusterSpec.local(workers=2, "
            "ps=1) for a cluster on this host."
        )
    if tasks is None:
        tasks = [(job, i) for job, i in cluster.tasks if job in ("worker", "ps")]
    warn_if_reachable(cluster)
    config = server_config(cluster.num_workers)
    spec = cluster.to_tf()
    return [
        tf.distribute.Server(
            spec, job_name=job, task_index=index, protocol="grpc", config=config, start=True
        )
        for job, index in tasks
    ]


_LOOPBACK_HOSTS = ("localhost", "::1", "[::1]")


def _is_loopback(address: str) -> bool:
    host = address.rpartition(":")[0]
    return host.startswith("127.") or host in _LOOPBACK_HOSTS


_WARNED = []


def warn_if_reachable(cluster: ClusterSpec) -> bool:
    """Warns once when servers of a cluster on loopback would be reachable from other hosts.

    TensorFlow's servers listen on every interface ("0.0.0.0:PORT", whatever host the cluster
    names). A local cluster is closed only where its processes run in a private network
    namespace (`tfdist launch` and `run_cluster` start their tasks in one); servers started in
    any other process are open to every host that reaches this one. A cluster on real hosts
    needs them open: no warning.

    Returns:
        bool: True when it warned (now or before).
    """
    from tfdist import netns, settings

    addresses = [a for job in cluster.cluster.values() for a in job]
    if not addresses or not all(_is_loopback(a) for a in addresses) or netns.is_isolated():
        return False
    if settings.NETWORK_NAMESPACE.get() == "off":
        return False  # the user chose the host's network for local jobs
    if not _WARNED:
        _WARNED.append(True)
        warnings.warn(
            "tfdist: the TensorFlow servers of this local cluster listen on every interface "
            "of this host (TensorFlow binds 0.0.0.0:PORT, although the cluster names "
            f"{addresses[0]}), so other hosts that reach it can connect to them. HINT: run "
            "the program with `tfdist launch` (or tfdist.testing.run_cluster), whose tasks run "
            "in a private network namespace, or firewall the ports "
            f"({', '.join(a.rpartition(':')[2] for a in addresses)}).",
            RuntimeWarning,
            stacklevel=3,
        )
    return True


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
    from tfdist import profiler, training_report

    training_report.answer_stack_requests()  # at a stall, the launcher asks every task
    profiler.follow_the_chief()  # with --profile, this server traces when the chief does
    server.join()

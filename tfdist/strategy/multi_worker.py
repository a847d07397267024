"""MultiWorkerMirroredStrategy: built once per process, with a bounded start-up, and an exit
barrier so that no worker leaves while its peers still all-reduce.

TensorFlow configures collectives once per process, at start-up: the strategy is cached here,
and tfdist configures the coordination service first, with a finite registration timeout.
Imports the cluster, settings, flavour, the TensorFlow fix records and the sibling modules
devices, communication and peers.
"""

from __future__ import annotations

import contextlib
import logging
import re
import threading
from typing import Dict

from tfdist import flavour, settings, signals
from tfdist.cluster import ClusterSpec
from tfdist.strategy.communication import collective_options
from tfdist.strategy.compression import PIECE_BYTES, compress_multi_worker, compression_of
from tfdist.strategy.devices import context, runtime_initialized
from tfdist.strategy.peers import answers, guarded, interruptible, wait_for_peers

__all__ = [
    "build_multi_worker",
    "configure_coordination",
    "exit_barrier",
    "has_built_one",
    "wait_for_the_cluster",
]

log = logging.getLogger("tfdist")

# One multi-worker strategy per process: TensorFlow configures collectives once, at startup.
_MWMS_CACHE: Dict[tuple, object] = {}


_MWMS_LOCK = threading.Lock()


def has_built_one() -> bool:
    """True once this process built a multi_worker_mirrored strategy (which configured
    TensorFlow's collectives: nothing else can configure them again)."""
    return bool(_MWMS_CACHE)


def build_multi_worker(
    *,
    cluster,
    found,
    communication,
    communication_options=None,
    bytes_per_pack=None,
    timeout_seconds=None,
    startup_timeout=None,
    compression=None,
    **_,
):
    import tensorflow as tf

    if communication_options is not None:
        if communication != "auto" or bytes_per_pack is not None or timeout_seconds is not None:
            raise ValueError(
                "Pass either communication_options= or communication= / bytes_per_pack= / "
                "timeout_seconds=, not both."
            )
        # the exported constructor returns collective_util.Options: check against that type
        options_type = type(tf.distribute.experimental.CommunicationOptions())
        if not isinstance(communication_options, options_type):
            raise TypeError(
                "communication_options must be a tf.distribute.experimental.CommunicationOptions."
                f" Received: {communication_options!r}."
            )
        options = communication_options
    else:
        options = collective_options(
            communication, found, bytes_per_pack=bytes_per_pack, timeout_seconds=timeout_seconds
        )
    if cluster.is_single_process or cluster.num_workers == 1:
        key = ("local",)
        resolver = None if cluster.is_single_process else cluster.resolver()
    else:
        key = (cluster, options.implementation, communication == "gloo")
        resolver = cluster.resolver()
    gloo = len(key) == 3 and key[2]  # one process: nothing to send
    if gloo:
        from tfdist.strategy import gloo as gloo_transport

        gloo_transport.require_torch()  # before TensorFlow starts: a missing extra fails fast
    with _MWMS_LOCK:
        if key in _MWMS_CACHE:
            strategy = _MWMS_CACHE[key]
            if compression_of(strategy) != compression:
                raise RuntimeError(
                    "This process already built a multi_worker_mirrored strategy with "
                    f"gradient_compression={compression_of(strategy)!r}; asked now for "
                    f"{compression!r}. TensorFlow configures collectives once per process. "
                    "HINT: build one strategy and reuse it, or start a new process."
                )
            return strategy
        if _MWMS_CACHE:
            raise RuntimeError(
                "This process already built a multi_worker_mirrored strategy for another "
                "cluster or communication; TensorFlow configures collectives once per process. "
                "HINT: build one strategy and reuse it, or start a new process."
            )
        if resolver is not None and runtime_initialized():
            raise RuntimeError(
                "multi_worker_mirrored must be built before TensorFlow initialises (it "
                "configures collective ops at program startup), but an op, device query or "
                "another strategy already ran in this process. HINT: call "
                "tfdist.make_strategy() first thing, before creating tensors, models or "
                "datasets."
            )
        if resolver is not None:
            if startup_timeout is None:
                startup_timeout = settings.STARTUP_TIMEOUT.get()
            wait_for_the_cluster(cluster, startup_timeout)
            configure_coordination(cluster, startup_timeout)
        try:
            # every peer answered; TensorFlow's own wait (registration, then its device
            # barrier of an hour on the leader) holds the GIL and swallows SIGTERM: guard it
            guard = (
                guarded(cluster.task, "waited for its peers", 2 * startup_timeout + 30)
                if resolver is not None
                else contextlib.nullcontext()
            )
            with guard:
                strategy = tf.distribute.MultiWorkerMirroredStrategy(
                    cluster_resolver=resolver, communication_options=options
                )
        except (tf.errors.DeadlineExceededError, tf.errors.UnavailableError) as err:
            raise RuntimeError(_startup_failure(cluster, err)) from err
        # tensors of more than PIECES_AFTER pieces are all-reduced in pieces of PIECE_BYTES (ring
        # only, and only with tfdist's options: communication_options= is TensorFlow's behaviour)
        nccl = tf.distribute.experimental.CommunicationImplementation.NCCL
        ring = options.implementation != nccl
        tuned = ring and communication_options is None and options.bytes_per_pack
        pieces = PIECE_BYTES if tuned else 0  # bytes_per_pack=0: TensorFlow's one pack, whole
        compress_multi_worker(strategy, compression, pieces)
        if gloo:
            group = gloo_transport.join(cluster, options.timeout_seconds, startup_timeout)
            gloo_transport.attach(strategy, group)
        _MWMS_CACHE[key] = strategy
        if resolver is not None:
            _register_exit_barrier()
            flavour.quiet_progress_off_the_chief(cluster.is_chief)
            # TensorFlow's coordination service just installed its SIGTERM handler, which
            # swallows the signal: SIGTERM ends the task again (or notifies BackupAndRestore)
            signals.take_sigterm(cluster.task)
        return strategy


def wait_for_the_cluster(cluster: ClusterSpec, startup_timeout: float) -> None:
    """Waits, bounded and interruptibly, until every worker (and the chief) answers.

    TensorFlow's own wait, next, holds the GIL and swallows SIGTERM (`tfdist.strategy.peers`);
    with every peer there, it is short. An evaluator waits for them all and answers no one:
    nothing waits for it.
    """
    coordinated = [task for task in cluster.tasks if task[0] in ("chief", "worker")]
    me = (cluster.task_type, cluster.task_index)
    wait_for_peers(
        cluster,
        [task for task in coordinated if task != me],
        startup_timeout,
        purpose="form the multi-worker cluster",
        listen=me in coordinated,
    )


def configure_coordination(cluster: ClusterSpec, startup_timeout) -> None:
    """Sets up TensorFlow's coordination service with a finite registration timeout.

    MultiWorkerMirroredStrategy configures the same service itself, but with no limit on how
    long it waits for a peer that never joins. tfdist configures it first, bounded.
    """
    from tfdist.fixes.tensorflow import COORDINATION_CONFIG

    coordination_config_pb2 = COORDINATION_CONFIG.get()

    if startup_timeout is None:
        startup_timeout = settings.STARTUP_TIMEOUT.get()
    jobs = [
        coordination_config_pb2.CoordinatedJob(name=job, num_tasks=len(addresses))
        for job, addresses in cluster.cluster.items()
        if job in ("chief", "worker")
    ]
    leader_job = "chief" if cluster.has_chief else "worker"
    context().configure_coordination_service(
        service_type="standalone",
        service_leader=f"/job:{leader_job}/replica:0/task:0",
        cluster_register_timeout_in_ms=int(startup_timeout * 1000),
        heartbeat_timeout_in_ms=0,
        coordinated_jobs=jobs,
    )


def _startup_failure(cluster: ClusterSpec, err: Exception) -> str:
    missing = sorted(set(re.findall(r"/job:(\w+)/replica:\d+/task:(\d+)", str(err))))
    named = ", ".join(f"{job}:{task}" for job, task in missing) or "unknown"
    return (
        f"Task {cluster.task} could not form the multi-worker cluster {cluster.cluster}: "
        f"{type(err).__name__}. Tasks named in TensorFlow's error: {named}. HINT: start every "
        "task of the cluster (each with its own TF_CONFIG), check that the addresses are "
        "reachable and the ports free, or raise startup_timeout= / TFDIST_STARTUP_TIMEOUT. "
        f"TensorFlow said: {str(err).strip().splitlines()[0] if str(err).strip() else ''}"
    )


def exit_barrier(timeout: float = 120.0) -> None:
    """Waits until every worker of this process's multi-worker strategy reaches this point.

    A worker that exits while its peers still run aborts their collectives (the leader's
    exit: "Failed to send RPC to coordination service", "Socket closed"). tfdist runs this at
    interpreter exit of every process that built a multi-worker strategy (unless it is dying
    of an uncaught exception); calling it earlier is harmless. A no-op without such a strategy.

    Args:
        timeout: float. Seconds to wait for the peers before giving up.
    """
    import tensorflow as tf

    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(
            f"exit_barrier(timeout) must be a positive number of seconds. Received: "
            f"timeout={timeout!r}. HINT: e.g. timeout=120, the default."
        )
    options = tf.distribute.experimental.CommunicationOptions(timeout_seconds=timeout)
    for key, strategy in list(_MWMS_CACHE.items()):
        if key == ("local",):
            continue
        # TensorFlow's SIGTERM handler (the preemption notifier) would swallow a SIGTERM here
        with interruptible(key[0].task, "waited for its peers in the exit barrier"):
            strategy.run(
                lambda: tf.distribute.get_replica_context().all_reduce(
                    tf.distribute.ReduceOp.SUM, tf.constant(1.0), options=options
                )
            )


_DYING = []


def _note_uncaught_exception(hook):
    def excepthook(*args):
        _DYING.append(True)
        hook(*args)

    return excepthook


def _barrier_at_exit() -> None:
    if _DYING:
        return  # the launcher stops the peers; waiting for them would only delay that
    try:
        exit_barrier()
    except Exception as err:  # a peer already failed: nothing left to protect
        log.warning("tfdist: the exit barrier did not complete: %s", err)
        return
    for key in list(_MWMS_CACHE):
        if key != ("local",):
            leader_leaves_last(key[0])


def leader_leaves_last(cluster: ClusterSpec, timeout: float = 10.0) -> list:
    """On the coordination service's leader, waits until every peer's server is gone.

    After the exit barrier the peers still heartbeat to the leader while their interpreters
    shut down; a leader that exits first makes their coordination agents log an error and
    abort their collectives ("failed to connect to all addresses", "StartAbort"). A peer whose
    server port refuses connections has exited. Other tasks return at once; the wait is
    bounded. Returns the peers still answering when the wait ended.
    """
    import time

    if not cluster.is_chief:  # the leader: the chief, else worker 0
        return []
    peers = [
        address
        for job in ("chief", "worker")
        for index, address in enumerate(cluster.cluster.get(job, []))
        if (job, index) != (cluster.task_type, cluster.task_index)
    ]
    deadline = time.monotonic() + timeout
    while peers and time.monotonic() < deadline:
        # refused (or unreachable): that peer's server is gone
        peers = [address for address in peers if answers(address, 0.5)]
        if peers:
            time.sleep(0.05)
    return peers


def _register_exit_barrier() -> None:
    import atexit
    import sys

    sys.excepthook = _note_uncaught_exception(sys.excepthook)
    atexit.register(_barrier_at_exit)

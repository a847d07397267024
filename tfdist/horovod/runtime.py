"""`init()`, `shutdown()` and the ranks: the state of the Horovod API in this process.

`init()` reads this process's ranks (`tfdist.horovod.process`), pins it to its GPU (GPU
`local_rank`, with memory growth unless TFDIST_GPU_MEMORY_GROWTH=0, as Horovod scripts do by
hand; the script's own pinning to the same GPU is then a no-op), and in a job of several
processes configures TensorFlow's collective ops for the cluster: first a bounded wait for
every peer, then the coordination service (dead peers are detected by heartbeats), the
collective leader and the gRPC server. TensorFlow accepts that only before it starts: `init()`
must come before the first op, as in Horovod.

The collectives of `tfdist.horovod.collectives` then run over one TensorFlow collective group
of all the processes, with TensorFlow's own instance keys and ordering token (the launcher
MultiWorkerMirroredStrategy uses), so that they work eagerly and inside `tf.function`, in the
same order on every rank. With TFDIST_COMMUNICATION=gloo (CPU processes), their sums go through
Gloo instead (`tfdist.strategy.gloo`); gathers, broadcasts, min/max stay on TensorFlow's.
Imports TensorFlow only inside functions.
"""

from __future__ import annotations

import atexit
import copy
import sys
import threading
from typing import Optional

from tfdist import settings, signals
from tfdist.fixes.record import Internal
from tfdist.horovod.process import Ranks, ranks_from_environment

__all__ = [
    "cross_rank",
    "cross_size",
    "init",
    "is_initialized",
    "local_rank",
    "local_size",
    "payload_bytes",
    "rank",
    "runtime",
    "shutdown",
    "size",
]

# TensorFlow's launcher of collectives (instance keys per call, also inside functions, and the
# ordering token that keeps them in program order): the one MultiWorkerMirroredStrategy uses.
REPLICA_LAUNCHER = Internal(
    name="CollectiveReplicaLauncher",
    used_for="the collectives of tfdist.horovod",
    paths=("tensorflow.python.distribute.cross_device_utils:CollectiveReplicaLauncher",),
)
COLLECTIVE_KEYS = Internal(
    name="CollectiveKeys",
    used_for="the collectives of tfdist.horovod",
    paths=("tensorflow.python.distribute.cross_device_utils:CollectiveKeys",),
)
COLLECTIVE_OPS = Internal(
    name="collective_ops",
    used_for="the collectives of tfdist.horovod",
    paths=("tensorflow.python.ops.collective_ops:all_reduce_v2",),
)
SERVER_PB2 = Internal(
    name="tensorflow_server_pb2",
    used_for="the gRPC server of a tfdist.horovod job",
    paths=("tensorflow.core.protobuf.tensorflow_server_pb2:ServerDef",),
)

# Far from the keys MultiWorkerMirroredStrategy starts at (1), in case a process has both.
GROUP_KEY_START = 0x7D00


class Runtime:
    """The collective group of this process (see the module's doc). `runtime()` returns it."""

    def __init__(self, ranks: Ranks):
        self.ranks = ranks
        self.initialized = True
        self.device = None
        self._launcher = None
        self._group_key = None
        self._payload = None
        self._lock = threading.Lock()
        self.gloo = None  # the Gloo group (TFDIST_COMMUNICATION=gloo), `tfdist.strategy.gloo`

    @property
    def size(self) -> int:
        return self.ranks.size

    def launcher(self):
        """TensorFlow's replica launcher for the group, built at the first collective."""
        with self._lock:
            if self._launcher is None:
                import tensorflow as tf

                job, index = self.ranks.task
                gpus = tf.config.list_logical_devices("GPU")
                kind = "GPU" if gpus else "CPU"
                self.device = f"/job:{job}/replica:0/task:{index}/device:{kind}:0"
                keys = COLLECTIVE_KEYS.get()(group_key_start=GROUP_KEY_START)
                self._group_key = keys.get_group_key([self.device])
                timeout = settings.COLLECTIVE_TIMEOUT.get() or None
                options = tf.distribute.experimental.CommunicationOptions(
                    implementation=tf.distribute.experimental.CommunicationImplementation.RING
                    if kind == "CPU"
                    else tf.distribute.experimental.CommunicationImplementation.AUTO,
                    timeout_seconds=timeout,
                )
                self._launcher = REPLICA_LAUNCHER.get()(
                    self._group_key, self.size, keys, self.device, options
                )
                self.options = options
            return self._launcher

    def reduce(self, tensor, merge_op: str = "Add", counted: bool = False):
        """One all-reduce of `tensor` over every rank ("Add", "Min", "Max" or "Mul");
        `counted`: its bytes are already in `payload_bytes`."""
        launcher = self.launcher()
        all_reduce_v2 = COLLECTIVE_OPS.get()
        import tensorflow as tf

        if not counted:
            self.count(tensor)
        if self.gloo is not None and merge_op == "Add" and "CPU" in self.device:
            from tfdist.strategy.gloo import dense

            if dense(tensor):
                with tf.device(self.device):
                    return self.gloo.reduce([tensor], False, None)[0]
        instance_key = launcher._next_instance_key()  # pylint: disable=protected-access
        token = launcher._get_ordering_token()  # pylint: disable=protected-access
        with tf.device(self.device):
            return all_reduce_v2(
                tensor,
                self.size,
                self._group_key,
                instance_key,
                merge_op=merge_op,
                final_op="Id",
                communication_hint=self.options.implementation.value,
                timeout=self.options.timeout_seconds or 0,
                ordering_token=token,
            )

    def gather(self, tensor):
        """All-gather along the first dimension; every rank's first dimension is the same."""
        launcher = self.launcher()
        self.count(tensor)
        return launcher._all_gather(tensor, None)  # pylint: disable=protected-access

    def count(self, tensor) -> None:
        """Adds the bytes of `tensor` to `payload_bytes` (when the step runs)."""
        import tensorflow as tf

        if self._payload is None:
            with tf.init_scope(), tf.device("/cpu:0"):
                self._payload = tf.Variable(
                    tf.constant(0, tf.int64), trainable=False, name="tfdist_horovod_payload"
                )
        self._payload.assign_add(tf.size(tensor, out_type=tf.int64) * tensor.dtype.size)

    def payload_bytes(self) -> int:
        return 0 if self._payload is None else int(self._payload.numpy())


_RUNTIME: Optional[Runtime] = None
_INIT_LOCK = threading.Lock()


def _not_initialized() -> ValueError:
    return ValueError(
        "Horovod has not been initialized; use hvd.init(). HINT: call hvd.init() first "
        "thing in the script, before any TensorFlow op."
    )


def runtime() -> Runtime:
    """The runtime of an initialized process; ValueError before `init()` (as Horovod)."""
    if _RUNTIME is None or not _RUNTIME.initialized:
        raise _not_initialized()
    return _RUNTIME


def _pin_gpu(local_rank: int) -> None:
    """Makes GPU `local_rank` the only one this process sees, growing the memory it takes
    (unless TFDIST_GPU_MEMORY_GROWTH=0: then TensorFlow reserves it, as by default)."""
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return
    if local_rank >= len(gpus):
        raise RuntimeError(
            f"This process has local rank {local_rank}, but the host has {len(gpus)} GPUs. "
            "HINT: start at most one process per GPU on each host (tfdist horovodrun -np N)."
        )
    try:
        if settings.GPU_MEMORY_GROWTH.get():
            for gpu in gpus:
                tf.config.experimental.set_memory_growth(gpu, True)
        tf.config.set_visible_devices(gpus[local_rank], "GPU")
    except RuntimeError:
        pass  # the process already started TensorFlow; the check below says what to do


def _configure_collectives(ranks: Ranks) -> None:
    import tensorflow as tf

    from tfdist.strategy.devices import context, runtime_initialized
    from tfdist.strategy.multi_worker import (
        configure_coordination,
        has_built_one,
        wait_for_the_cluster,
    )
    from tfdist.strategy.peers import guarded

    cluster = ranks.cluster
    if has_built_one():
        raise RuntimeError(
            "This process already built a multi_worker_mirrored strategy, which configured "
            "TensorFlow's collectives; hvd.init() cannot configure them again. HINT: use one "
            "of the two in a process: the Horovod API, or tfdist.make_strategy()."
        )
    if runtime_initialized():
        raise RuntimeError(
            "hvd.init() must run before TensorFlow starts (it configures collective ops at "
            "program startup), but an op, a device query or a model already ran in this "
            "process. HINT: call hvd.init() first thing, right after the imports."
        )
    timeout = settings.STARTUP_TIMEOUT.get()
    wait_for_the_cluster(cluster, timeout)
    configure_coordination(cluster, timeout)
    leader = "chief" if cluster.has_chief else "worker"
    ctx = context()
    ctx.configure_collective_ops(
        collective_leader=f"/job:{leader}/replica:0/task:0",
        scoped_allocator_enabled_ops=("CollectiveReduce",),
        device_filters=(f"/job:{cluster.task_type}/task:{cluster.task_index}",),
    )
    port = int(cluster.address.rpartition(":")[2])
    server_def = SERVER_PB2.get()(
        cluster=cluster.to_tf().as_cluster_def(),
        default_session_config=copy.deepcopy(ctx.config),
        job_name=cluster.task_type,
        task_index=cluster.task_index,
        protocol="grpc",
        port=port,
    )
    ctx.enable_collective_ops(server_def)
    try:
        with guarded(cluster.task, "waited for its peers", 2 * timeout + 30):
            ctx.ensure_initialized()
    except (tf.errors.DeadlineExceededError, tf.errors.UnavailableError) as err:
        raise RuntimeError(
            f"Rank {ranks.rank} (task {cluster.task}) could not join its peers "
            f"{cluster.cluster}: {type(err).__name__}. HINT: start every process of the job "
            "(tfdist horovodrun -np N starts them all), or raise TFDIST_STARTUP_TIMEOUT."
        ) from err
    sys.excepthook = _note_uncaught(sys.excepthook)
    signals.take_sigterm(cluster.task)


def init(comm=None, process_sets=None) -> None:
    """Starts the Horovod API in this process (Horovod's `hvd.init()`).

    Args:
        comm: unsupported (an MPI communicator): tfdist's processes are not MPI processes.
        process_sets: unsupported: every collective runs over all the processes.

    Raises:
        NotImplementedError: for `comm` or `process_sets`.
        ClusterConfigError: the environment's ranks disagree or name no peers.
        RuntimeError: TensorFlow already started in this process, or the peers never came.
    """
    global _RUNTIME
    from tfdist.horovod.unsupported import unsupported

    if comm is not None:
        raise unsupported("init(comm=...)", "the processes of `tfdist horovodrun -np N`")
    if process_sets not in (None, [], ()):
        raise unsupported("process sets", "collectives over all the processes")
    with _INIT_LOCK:
        if _RUNTIME is not None:
            _RUNTIME.initialized = True
            return
        ranks = ranks_from_environment()
        _pin_gpu(ranks.local_rank)
        if ranks.size > 1:
            _configure_collectives(ranks)
        _RUNTIME = Runtime(ranks)
        if ranks.size > 1 and settings.COMMUNICATION.get() == "gloo":
            _RUNTIME.gloo = _join_gloo(ranks)


def _join_gloo(ranks: Ranks):
    """The Gloo group for the sums of `allreduce` and friends (TFDIST_COMMUNICATION=gloo)."""
    from tfdist.strategy import gloo

    collective_timeout = settings.COLLECTIVE_TIMEOUT.get() or None
    return gloo.join(ranks.cluster, collective_timeout, settings.STARTUP_TIMEOUT.get())


def shutdown() -> None:
    """Waits for every rank (a barrier), then ends the API in this process; `init()` again
    resumes it (TensorFlow's collectives stay configured for the process)."""
    if _RUNTIME is None or not _RUNTIME.initialized:
        return
    barrier()
    _RUNTIME.initialized = False


def is_initialized() -> bool:
    return _RUNTIME is not None and _RUNTIME.initialized


def barrier() -> None:
    """Returns when every rank reached it (one small all-reduce)."""
    rt = runtime()
    if rt.size == 1:
        return
    import tensorflow as tf

    rt.reduce(tf.constant(1, tf.int32))


def size() -> int:
    return runtime().ranks.size


def rank() -> int:
    return runtime().ranks.rank


def local_size() -> int:
    return runtime().ranks.local_size


def local_rank() -> int:
    return runtime().ranks.local_rank


def cross_size() -> int:
    return runtime().ranks.cross_size


def cross_rank() -> int:
    return runtime().ranks.cross_rank


def payload_bytes() -> int:
    """Bytes this process handed to collectives since `init()`: what it put on the wire
    (compressed gradients count at their compressed size). 0 in a job of one process."""
    return runtime().payload_bytes()


def _note_uncaught(hook):
    def excepthook(*args):
        _DYING.append(True)
        hook(*args)

    return excepthook


_DYING = []


def _at_exit() -> None:
    if _DYING or _RUNTIME is None or not _RUNTIME.initialized:
        return
    try:
        barrier()
    except Exception as err:  # a peer already failed: nothing left to protect
        print(f"tfdist: the exit barrier did not complete: {err}", file=sys.stderr)


atexit.register(_at_exit)

"""The strategy factory: one name -> one real `tf.distribute.Strategy`.

    strategy = tfdist.make_strategy()            # "auto": decided by the cluster and devices
    strategy = tfdist.make_strategy("mirrored", devices=["/cpu:0", "/cpu:1"])

The names ("auto", "one_device", "mirrored", "multi_worker_mirrored", "parameter_server",
"default" alias "off") live in `STRATEGY_NAMES`; the CLI builds its choices from it. The
communication vocabulary of each strategy is a small table below, one per strategy.
"""

from __future__ import annotations

import logging
import re
import threading
from typing import Callable, Dict, Mapping, Optional, Sequence

from tfdist import settings
from tfdist.cluster import ClusterConfigError, ClusterSpec, detect_cluster
from tfdist.errors import is_count

__all__ = [
    "COMMUNICATIONS",
    "STRATEGY_NAMES",
    "local_devices",
    "make_strategy",
    "resolve_strategy_name",
    "start_local_servers",
    "virtual_cpus",
]

log = logging.getLogger("tfdist")

# Public names, in the order they are documented. "off" is an alias of "default".
STRATEGY_NAMES = (
    "auto",
    "one_device",
    "mirrored",
    "multi_worker_mirrored",
    "parameter_server",
    "default",
)
_ALIASES = {"off": "default"}

# The `communication=` values each strategy understands.
COMMUNICATIONS = {
    "multi_worker_mirrored": ("auto", "ring", "nccl"),
    "mirrored": ("auto", "nccl", "hierarchical_copy", "reduce_to_one_device"),
    "parameter_server": ("auto",),
    "one_device": ("auto",),
    "default": ("auto",),
}

# Keyword options of TensorFlow's own constructors (and tfdist's few extras) per strategy.
_OPTIONS = {
    "one_device": (),
    "default": (),
    "mirrored": ("cross_device_ops",),
    "multi_worker_mirrored": (
        "communication_options",
        "bytes_per_pack",
        "timeout_seconds",
        "startup_timeout",
    ),
    "parameter_server": (
        "variable_partitioner",
        "min_shard_bytes",
        "max_shard_bytes",
        "max_shards",
    ),
}


# ------------------------------------------------------------------------------- devices


def _context():
    from tensorflow.python.eager import context  # the one private handle tfdist needs

    return context.context()


def runtime_initialized() -> bool:
    """True once TensorFlow has initialised its devices (no more device configuration)."""
    return bool(_context()._initialized)  # pylint: disable=protected-access


def local_devices() -> list:
    """The devices replicas would run on in this process: GPUs if any, else the logical CPUs.

    Does not initialise the TensorFlow runtime, so it may be called before `virtual_cpus` or
    before building a multi-worker strategy.
    """
    import tensorflow as tf

    if runtime_initialized():
        gpus = tf.config.list_logical_devices("GPU")
        devices = gpus or tf.config.list_logical_devices("CPU")
        return [_short_name(d.name) for d in devices]
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        count = sum(len(tf.config.get_logical_device_configuration(g) or [None]) for g in gpus)
        return [f"/gpu:{i}" for i in range(count)]
    cpu = tf.config.list_physical_devices("CPU")[0]
    count = len(tf.config.get_logical_device_configuration(cpu) or [None])
    return [f"/cpu:{i}" for i in range(count)]


def _short_name(name: str) -> str:
    match = re.search(r"device:([A-Z]+):(\d+)$", name)
    return f"/{match.group(1).lower()}:{match.group(2)}" if match else name


def virtual_cpus(n: int) -> list:
    """Splits the host CPU into `n` logical devices, for mirrored training on a CPU-only host.

    Must run before TensorFlow initialises its devices (before the first op, device query or
    strategy). Calling it again with the same `n` is a no-op.

    Args:
        n: int. Number of logical CPUs (>= 1).

    Returns:
        list[str]: the logical CPU names, "/cpu:0" ... "/cpu:{n-1}".

    Raises:
        ValueError: `n` is not a positive integer.
        RuntimeError: TensorFlow already initialised its devices with another count.
    """
    import tensorflow as tf

    if not is_count(n, 1):
        raise ValueError(f"virtual_cpus(n) needs a positive integer. Received: n={n!r}.")
    names = [f"/cpu:{i}" for i in range(n)]
    cpu = tf.config.list_physical_devices("CPU")[0]
    if runtime_initialized():
        have = len(tf.config.list_logical_devices("CPU"))
        if have == n:
            return names
        raise RuntimeError(
            f"virtual_cpus({n}) was called after TensorFlow initialised its devices, with {have} "
            "logical CPU(s). HINT: call tfdist.virtual_cpus() first thing in the program, before "
            "any TensorFlow op, device query or strategy (in pytest: the session-scoped "
            "`virtual_cpus` fixture of tfdist.testing, or run the test in a subprocess)."
        )
    current = tf.config.get_logical_device_configuration(cpu)
    if current and len(current) == n:
        return names
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(n)]
    )
    return names


# ------------------------------------------------------------------------ name resolution


def _canonical_name(name) -> str:
    if not isinstance(name, str):
        hint = " HINT: YAML reads a bare off/no as False; quote it: 'off'." if name is False else ""
        raise TypeError(
            f"The strategy name must be a string. Received: name={name!r} "
            f"(of type {type(name).__name__}).{hint}"
        )
    key = name.strip().lower().replace("-", "_")
    key = _ALIASES.get(key, key)
    if key not in STRATEGY_NAMES:
        choices = ", ".join(STRATEGY_NAMES + tuple(_ALIASES))
        raise ValueError(f"strategy={name!r} is not a known strategy. Choose one of: {choices}.")
    return key


def resolve_strategy_name(name: str, cluster: ClusterSpec, devices: Sequence[str]) -> str:
    """Returns the concrete strategy name for `name` on `cluster` with local `devices`.

    A pure function. "auto": a ps job -> parameter_server; more than one worker (or a chief
    plus workers) -> multi_worker_mirrored; more than one local GPU or logical CPU -> mirrored;
    else one_device. An explicit name that contradicts the cluster is refused.

    Raises:
        TypeError: `name` is not a string.
        ValueError: unknown name, or a name the cluster contradicts.
    """
    key = _canonical_name(name)
    multi_worker = not cluster.is_single_process and cluster.num_workers > 1
    if key == "auto":
        if cluster.num_ps:
            return "parameter_server"
        if multi_worker:
            return "multi_worker_mirrored"
        return "mirrored" if len(devices) > 1 else "one_device"
    if key == "parameter_server" and not cluster.num_ps:
        raise ValueError(
            f"strategy='parameter_server' needs a cluster with a 'ps' job, but the cluster is "
            f"{cluster!r}. HINT: add ps tasks (TF_CONFIG, --ps host:port, or "
            "ClusterSpec.local(workers=2, ps=1)), or pick strategy='auto'."
        )
    if cluster.num_ps and key in ("mirrored", "multi_worker_mirrored", "one_device"):
        raise ValueError(
            f"strategy={name!r} does not use the cluster's 'ps' job ({cluster!r}). HINT: use "
            "strategy='parameter_server' (or 'auto'), or remove the ps tasks."
        )
    if multi_worker and key in ("mirrored", "one_device"):
        raise ValueError(
            f"strategy={name!r} trains in one process, but the cluster has {cluster.num_workers} "
            f"workers ({cluster!r}, from TF_CONFIG or the launcher). HINT: use "
            "strategy='multi_worker_mirrored' (or 'auto'), or unset TF_CONFIG for local training."
        )
    return key


# ---------------------------------------------------------------------- communication


def _check_communication(strategy: str, communication) -> str:
    choices = COMMUNICATIONS[strategy]
    key = communication.strip().lower() if isinstance(communication, str) else communication
    if key not in choices:
        raise ValueError(
            f"communication={communication!r} is not valid for strategy {strategy!r}. Choose "
            f"one of: {', '.join(choices)}."
        )
    return key


def _all_gpus(devices: Sequence[str]) -> bool:
    return bool(devices) and all("gpu" in d.lower() for d in devices)


def _require_gpus_for_nccl(strategy: str, devices: Sequence[str]) -> None:
    if not _all_gpus(devices):
        raise ValueError(
            f"communication='nccl' needs every replica on a GPU, but strategy {strategy!r} "
            f"would run on {list(devices)}. HINT: use communication='ring' or 'auto' "
            "(NCCL is then picked only where every replica is a GPU)."
        )


def mirrored_cross_device_ops(communication: str, devices: Sequence[str]):
    """The CrossDeviceOps for MirroredStrategy: NCCL on all-GPU replicas, else one device."""
    import tensorflow as tf

    communication = _check_communication("mirrored", communication)
    if communication == "auto":
        communication = "nccl" if _all_gpus(devices) else "reduce_to_one_device"
    if communication == "nccl":
        _require_gpus_for_nccl("mirrored", devices)
        return tf.distribute.NcclAllReduce()
    if communication == "hierarchical_copy":
        return tf.distribute.HierarchicalCopyAllReduce()
    # On CPU replicas TensorFlow's default would probe NCCL-incapable paths; reducing on one
    # device is the reduction that works there.
    return tf.distribute.ReductionToOneDevice()


def collective_options(
    communication: str,
    devices: Sequence[str],
    *,
    bytes_per_pack: int = 0,
    timeout_seconds: Optional[float] = None,
):
    """The `CommunicationOptions` for MultiWorkerMirroredStrategy."""
    import tensorflow as tf

    implementation = tf.distribute.experimental.CommunicationImplementation
    communication = _check_communication("multi_worker_mirrored", communication)
    if communication == "auto":
        communication = "nccl" if _all_gpus(devices) else "ring"
    if communication == "nccl":
        _require_gpus_for_nccl("multi_worker_mirrored", devices)
    if timeout_seconds is None:
        timeout_seconds = settings.COLLECTIVE_TIMEOUT.get()  # default 0: no limit
    return tf.distribute.experimental.CommunicationOptions(
        bytes_per_pack=bytes_per_pack,
        timeout_seconds=timeout_seconds or None,
        implementation=implementation.NCCL if communication == "nccl" else implementation.RING,
    )


# ------------------------------------------------------------------------------ factory

# One multi-worker strategy per process: TensorFlow configures collectives once, at startup.
_MWMS_CACHE: Dict[tuple, object] = {}
_MWMS_LOCK = threading.Lock()


def make_strategy(
    name: str = "auto",
    *,
    cluster: Optional[ClusterSpec] = None,
    devices: Optional[Sequence[str]] = None,
    communication: str = "auto",
    **options,
):
    """Returns a `tf.distribute.Strategy` for `name`, on `cluster` and `devices`.

    Build it first thing in the program: a multi-worker strategy must configure TensorFlow's
    collectives before any op runs. Then build and compile the Keras model inside
    `strategy.scope()`.

    Args:
        name: str. "auto", "one_device", "mirrored", "multi_worker_mirrored",
            "parameter_server" or "default" (alias "off": TensorFlow's default strategy).
            Defaults to "auto", which yields to TFDIST_STRATEGY when that is set (as by
            `tfdist launch --strategy NAME`).
        cluster: ClusterSpec. Defaults to `tfdist.detect_cluster()` (TF_CONFIG, SLURM, local).
        devices: list of device strings ("/gpu:0", "/cpu:1"). Defaults to every local GPU, else
            every logical CPU. `one_device` uses the first.
        communication: str. How replicas all-reduce. multi_worker_mirrored: "auto" (NCCL when
            every replica is a GPU, else ring), "ring", "nccl". mirrored: "auto", "nccl",
            "hierarchical_copy", "reduce_to_one_device". Defaults to "auto", which yields to
            TFDIST_COMMUNICATION when that names a choice valid for the strategy.
        **options: TensorFlow's own options, validated and passed through:
            mirrored: `cross_device_ops`.
            multi_worker_mirrored: `communication_options`, or `bytes_per_pack` and
                `timeout_seconds` (per-collective timeout; default TFDIST_COLLECTIVE_TIMEOUT or
                none: dead peers are detected by heartbeats), and `startup_timeout` (seconds
                to wait for every worker
                to join; default TFDIST_STARTUP_TIMEOUT or 300 s).
            parameter_server: `variable_partitioner` (a TensorFlow partitioner, or "min_size" /
                "max_size" / "fixed"), with `min_shard_bytes` (min_size), `max_shard_bytes`
                (max_size) and `max_shards` (default: the number of ps tasks) for the strings.

    Returns:
        tf.distribute.Strategy: a real TensorFlow strategy. In the worker and ps tasks of a
        parameter-server job (with a chief) it never returns: those tasks serve, so the same
        script runs unchanged in every role.

    Raises:
        TypeError: a wrong type, or an option the strategy does not take.
        ValueError: unknown name or communication, or one the cluster/devices contradict.
        RuntimeError: a multi-worker strategy requested after TensorFlow initialised.

    Example, the same script in every process of a 2-worker job (TF_CONFIG set per process):

    ```python
    strategy = tfdist.make_strategy()    # multi_worker_mirrored, from TF_CONFIG
    with strategy.scope():
        model = build_model()
        model.compile(...)
    model.fit(dataset, epochs=3)
    ```
    """
    key = _canonical_name(name)
    from_env = settings.STRATEGY.get() if key == "auto" else None  # `tfdist launch --strategy`
    if from_env:
        key = _canonical_name(from_env)
    if cluster is None:
        cluster = detect_cluster()
    elif not isinstance(cluster, ClusterSpec):
        raise TypeError(
            f"cluster must be a tfdist.ClusterSpec. Received: {cluster!r} (of type "
            f"{type(cluster).__name__}). HINT: tfdist.ClusterSpec.from_tf_config(...)."
        )
    if devices is not None:
        devices = _check_devices(devices)
    found = list(devices) if devices is not None else local_devices()
    key = resolve_strategy_name(key, cluster, found)
    unknown = sorted(set(options) - set(_OPTIONS[key]))
    if unknown:
        accepted = ", ".join(_OPTIONS[key]) or "none"
        raise TypeError(
            f"make_strategy({key!r}) got unexpected option(s) {unknown}. Options accepted for "
            f"{key!r}: {accepted}."
        )
    from_env = settings.COMMUNICATION.get()
    if communication == "auto" and from_env in COMMUNICATIONS[key]:
        communication = from_env  # a job-wide choice; where it does not apply, "auto" stays
    if key != "parameter_server":
        _check_communication(key, communication)
    if key != "default":
        from tfdist.fixes import apply_fixes

        apply_fixes()  # the plain Keras idiom works on what tfdist makes
    strategy = _BUILDERS[key](
        cluster=cluster, devices=devices, found=found, communication=communication, **options
    )
    from tfdist import _report

    _report.install()  # under `tfdist launch`: the steps/s of the summary line
    return strategy


def _check_devices(devices) -> list:
    if isinstance(devices, str) or not isinstance(devices, (list, tuple)):
        raise TypeError(
            f"devices must be a list of device strings like ['/gpu:0', '/gpu:1']. Received: "
            f"{devices!r}."
        )
    if not devices:
        raise ValueError("devices=[] names no device. HINT: leave devices out to use all.")
    bad = [
        d
        for d in devices
        if not isinstance(d, str) or not re.search(r"(cpu|gpu|tpu):\d+$", d.lower())
    ]
    if bad:
        raise ValueError(f"devices {bad!r} are not device strings like '/gpu:0' or '/cpu:1'.")
    if len(set(d.lower() for d in devices)) != len(devices):
        raise ValueError(f"devices={list(devices)!r} names a device twice.")
    return list(devices)


def _build_default(**_):
    import tensorflow as tf

    return tf.distribute.get_strategy()


def _build_one_device(*, devices, found, **_):
    import tensorflow as tf

    if devices is not None and len(devices) != 1:
        raise ValueError(
            f"one_device takes exactly one device. Received: devices={devices!r}. HINT: use "
            "'mirrored' for several devices."
        )
    return tf.distribute.OneDeviceStrategy((devices or found)[0])


def _build_mirrored(*, devices, found, communication, cross_device_ops=None, **_):
    import tensorflow as tf

    if cross_device_ops is not None and communication != "auto":
        raise ValueError(
            f"Pass either communication={communication!r} or cross_device_ops=, not both."
        )
    if cross_device_ops is None:
        cross_device_ops = mirrored_cross_device_ops(communication, found)
    return tf.distribute.MirroredStrategy(
        devices=devices or found, cross_device_ops=cross_device_ops
    )


def _build_multi_worker(
    *,
    cluster,
    found,
    communication,
    communication_options=None,
    bytes_per_pack=0,
    timeout_seconds=None,
    startup_timeout=None,
    **_,
):
    import tensorflow as tf

    if communication_options is not None:
        if communication != "auto" or bytes_per_pack or timeout_seconds is not None:
            raise ValueError(
                "Pass either communication_options= or communication= / bytes_per_pack= / "
                "timeout_seconds=, not both."
            )
        if not isinstance(communication_options, tf.distribute.experimental.CommunicationOptions):
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
        key = (cluster, options.implementation)
        resolver = cluster.resolver()
    with _MWMS_LOCK:
        if key in _MWMS_CACHE:
            return _MWMS_CACHE[key]
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
            _configure_coordination(cluster, startup_timeout)
        try:
            strategy = tf.distribute.MultiWorkerMirroredStrategy(
                cluster_resolver=resolver, communication_options=options
            )
        except (tf.errors.DeadlineExceededError, tf.errors.UnavailableError) as err:
            raise RuntimeError(_startup_failure(cluster, err)) from err
        _MWMS_CACHE[key] = strategy
        if resolver is not None:
            _register_exit_barrier()
            from tfdist import flavour

            flavour.quiet_progress_off_the_chief(cluster.is_chief)
        return strategy


def _configure_coordination(cluster: ClusterSpec, startup_timeout) -> None:
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
    _context().configure_coordination_service(
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


def _partitioner(
    variable_partitioner, num_ps: int, min_shard_bytes=None, max_shard_bytes=None, max_shards=None
):
    import tensorflow as tf

    partitioners = tf.distribute.experimental.partitioners
    sizes = {
        "min_shard_bytes": min_shard_bytes,
        "max_shard_bytes": max_shard_bytes,
        "max_shards": max_shards,
    }
    if not isinstance(variable_partitioner, str):
        given = sorted(k for k, v in sizes.items() if v is not None)
        if given:
            raise ValueError(
                f"{', '.join(given)} go(es) with variable_partitioner='min_size', 'max_size' "
                "or 'fixed', not with a partitioner object."
            )
        return variable_partitioner
    shards = num_ps if max_shards is None else max_shards
    table: Dict[str, Callable] = {
        "min_size": lambda: partitioners.MinSizePartitioner(
            min_shard_bytes=256 << 10 if min_shard_bytes is None else min_shard_bytes,
            max_shards=shards,
        ),
        "max_size": lambda: partitioners.MaxSizePartitioner(
            max_shard_bytes=256 << 10 if max_shard_bytes is None else max_shard_bytes,
            max_shards=max_shards,
        ),
        "fixed": lambda: partitioners.FixedShardsPartitioner(num_shards=shards),
    }
    if variable_partitioner not in table:
        raise ValueError(
            f"variable_partitioner={variable_partitioner!r} is not known. Choose one of: "
            f"{', '.join(table)}, or pass a tf.distribute.experimental.partitioners object."
        )
    return table[variable_partitioner]()


def _build_parameter_server(
    *,
    cluster,
    communication,
    variable_partitioner=None,
    min_shard_bytes=None,
    max_shard_bytes=None,
    max_shards=None,
    **_,
):
    import tensorflow as tf

    if communication != "auto":
        raise ValueError(
            f"communication={communication!r} is not valid for strategy 'parameter_server' "
            "(variables live on the ps tasks; there is no all-reduce). Choose: auto."
        )
    if cluster.task_type in ("worker", "ps") and cluster.has_chief:
        # In a parameter-server job only the chief runs the training code; worker and ps tasks
        # serve. Serving here lets one script run unchanged in every role (a Kubernetes TFJob
        # starts the same command in each replica).
        log.info(
            "tfdist: task %s of a parameter-server job serves until the job ends.", cluster.task
        )
        serve(cluster)
    partitioner = _partitioner(
        variable_partitioner, cluster.num_ps, min_shard_bytes, max_shard_bytes, max_shards
    )
    spec = cluster.to_tf()
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        spec,
        task_type="chief" if cluster.has_chief else None,
        task_id=0 if cluster.has_chief else None,
        rpc_layer="grpc",
    )
    return tf.distribute.ParameterServerStrategy(resolver, variable_partitioner=partitioner)


_BUILDERS: Mapping[str, Callable] = {
    "default": _build_default,
    "one_device": _build_one_device,
    "mirrored": _build_mirrored,
    "multi_worker_mirrored": _build_multi_worker,
    "parameter_server": _build_parameter_server,
}


# ------------------------------------------------------------------------ local servers


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

    options = tf.distribute.experimental.CommunicationOptions(timeout_seconds=timeout)
    for key, strategy in list(_MWMS_CACHE.items()):
        if key != ("local",):
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


def _register_exit_barrier() -> None:
    import atexit
    import sys

    sys.excepthook = _note_uncaught_exception(sys.excepthook)
    atexit.register(_barrier_at_exit)

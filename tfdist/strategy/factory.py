"""`make_strategy`: one name -> one real `tf.distribute.Strategy`.

    strategy = tfdist.make_strategy()            # "auto": decided by the cluster and devices
    strategy = tfdist.make_strategy("mirrored", devices=["/cpu:0", "/cpu:1"])

Resolves the name against the cluster and devices (`resolve_strategy_name`, a pure function),
checks every argument against the strategy's record, applies tfdist's Keras fixes, sets the
task context, and calls the record's builder. Imports the registry, devices, the cluster,
settings, the fixes, the task context and the launcher's report.
"""

from __future__ import annotations

from typing import Optional, Sequence

from tfdist import settings, task
from tfdist.cluster import ClusterSpec, detect_cluster
from tfdist.strategy.communication import check_communication
from tfdist.strategy.compression import check_compression
from tfdist.strategy.devices import check_devices, local_devices
from tfdist.strategy.registry import STRATEGIES, canonical_name

__all__ = ["make_strategy", "resolve_strategy_name"]


def resolve_strategy_name(name: str, cluster: ClusterSpec, devices: Sequence[str]) -> str:
    """Returns the concrete strategy name for `name` on `cluster` with local `devices`.

    A pure function. "auto": a ps job -> parameter_server; more than one worker (or a chief
    plus workers) -> multi_worker_mirrored; more than one local GPU or logical CPU -> mirrored;
    else one_device. An explicit name that contradicts the cluster is refused.

    Raises:
        TypeError: `name` is not a string.
        ValueError: unknown name, or a name the cluster contradicts.
    """
    key = canonical_name(name)
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


def make_strategy(
    name: str = "auto",
    *,
    cluster: Optional[ClusterSpec] = None,
    devices: Optional[Sequence[str]] = None,
    communication: str = "auto",
    gradient_compression: Optional[str] = None,
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
        gradient_compression: "bf16", "fp16" or None. mirrored and multi_worker_mirrored: cast
            float32 gradients (tensors of 1024 elements or more; never IndexedSlices) to that
            type for the all-reduce and back after it; "fp16" divides by the number of replicas
            before the cast so that the sum cannot overflow. None yields to
            TFDIST_GRADIENT_COMPRESSION (ignored by other strategies), else no compression;
            "none" is no compression whatever the variable says.
        **options: TensorFlow's own options, validated and passed through:
            mirrored: `cross_device_ops`.
            multi_worker_mirrored: `communication_options`, or `bytes_per_pack` (default 4
                MiB on the ring: gradients packed by 4 MiB, tensors over 64 MiB all-reduced in
                16 MiB pieces; 0 is TensorFlow's one pack, tensors whole) and
                `timeout_seconds` (per-collective timeout; default TFDIST_COLLECTIVE_TIMEOUT or
                none: dead peers are detected by heartbeats), and `startup_timeout` (seconds
                to wait for every worker
                to join; default TFDIST_STARTUP_TIMEOUT or 300 s).
            parameter_server: `variable_partitioner` (a TensorFlow partitioner, or "min_size" /
                "max_size" / "fixed"), with `min_shard_bytes` (min_size), `max_shard_bytes`
                (max_size) and `max_shards` (default: the number of ps tasks) for the strings;
                `startup_timeout` (seconds the chief waits for every worker and ps to answer;
                default TFDIST_STARTUP_TIMEOUT or 300 s).

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
    key = canonical_name(name)
    from_env = settings.STRATEGY.get() if key == "auto" else None  # `tfdist launch --strategy`
    if from_env:
        key = canonical_name(from_env)
    if cluster is None:
        cluster = detect_cluster()
    elif not isinstance(cluster, ClusterSpec):
        raise TypeError(
            f"cluster must be a tfdist.ClusterSpec. Received: {cluster!r} (of type "
            f"{type(cluster).__name__}). HINT: tfdist.ClusterSpec.from_tf_config(...)."
        )
    if devices is not None:
        devices = check_devices(devices)
    found = list(devices) if devices is not None else local_devices()
    key = resolve_strategy_name(key, cluster, found)
    record = STRATEGIES[key]
    unknown = sorted(set(options) - set(record.options))
    if unknown:
        accepted = ", ".join(record.options) or "none"
        raise TypeError(
            f"make_strategy({key!r}) got unexpected option(s) {unknown}. Options accepted for "
            f"{key!r}: {accepted}."
        )
    from_env = settings.COMMUNICATION.get()
    if communication == "auto" and from_env in record.communications:
        communication = from_env  # a job-wide choice; where it does not apply, "auto" stays
    if key != "parameter_server":
        check_communication(key, communication, record.communications)
    if gradient_compression is None:
        from_env = settings.GRADIENT_COMPRESSION.get()  # job-wide: where it does not apply, off
        compression = from_env if key in ("mirrored", "multi_worker_mirrored") else None
    else:
        compression = check_compression(key, gradient_compression)
    if key != "default":
        from tfdist.fixes import apply_fixes

        apply_fixes()  # the plain Keras idiom works on what tfdist makes
    task.set_current(cluster, key)
    strategy = record.build(
        cluster=cluster,
        devices=devices,
        found=found,
        communication=communication,
        compression=compression,
        **options,
    )
    from tfdist import training_report as report

    report.install()  # under `tfdist launch`: the steps/s of the summary line
    return strategy

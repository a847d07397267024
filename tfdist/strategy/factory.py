"""`make_strategy`: one name -> one real `tf.distribute.Strategy`.

    strategy = tfdist.make_strategy()            # "auto": decided by the cluster and devices
    strategy = tfdist.make_strategy("mirrored", devices=["/cpu:0", "/cpu:1"])

Resolves the name against the cluster and devices (`resolve_strategy_name`, a pure function),
checks every argument against the strategy's record (`tfdist.strategy.registry`), then builds
it in one step that holds everything making a strategy does to the process
(`_build_in_this_process`).
"""

from __future__ import annotations

import logging
from typing import Optional, Sequence

from tfdist import settings, task
from tfdist.cluster import ClusterSpec, detect_cluster
from tfdist.strategy import builders
from tfdist.strategy.communication import check_communication
from tfdist.strategy.compression import check_compression
from tfdist.strategy.devices import check_devices, local_devices, take_slurm_gpu_share
from tfdist.strategy.registry import (
    AUTO,
    STRATEGIES,
    Strategy,
    auto_case,
    canonical_name,
    known_name,
)
from tfdist.strategy.servers import serve

__all__ = ["make_strategy", "resolve_strategy_name"]

log = logging.getLogger("tfdist")


def resolve_strategy_name(name: str, cluster: ClusterSpec, devices: Sequence[str]) -> str:
    """Returns the concrete strategy name for `name` on `cluster` with local `devices`.

    A pure function. "auto": a ps job -> parameter_server; more than one worker (or a chief
    plus workers) -> multi_worker_mirrored; more than one local GPU or logical CPU -> mirrored;
    else one_device (`tfdist.strategy.registry.AUTO_CASES` and each record's `auto`). An
    explicit name that contradicts the cluster is refused: one that needs a ps job where there
    is none, one that does not use the cluster's ps job, one that trains in one process where
    the cluster has several workers (the records' `uses_ps` and `multi_process`).

    Raises:
        TypeError: `name` is not a string.
        ValueError: unknown name, or a name the cluster contradicts.
    """
    key = canonical_name(name)
    case = auto_case(cluster, devices)
    if key == "auto":
        return AUTO[case]
    record = STRATEGIES[key]
    if not record.distributes:
        return key  # distributes nothing: fits any cluster
    if record.uses_ps and not cluster.num_ps:
        raise ValueError(
            f"strategy={key!r} needs a cluster with a 'ps' job, but the cluster is "
            f"{cluster!r}. HINT: add ps tasks (TF_CONFIG, --ps host:port, or "
            "ClusterSpec.local(workers=2, ps=1)), or pick strategy='auto'."
        )
    if cluster.num_ps and not record.uses_ps:
        raise ValueError(
            f"strategy={name!r} does not use the cluster's 'ps' job ({cluster!r}). HINT: use "
            f"strategy={AUTO['ps_job']!r} (or 'auto'), or remove the ps tasks."
        )
    if case == "workers" and not record.multi_process:
        raise ValueError(
            f"strategy={name!r} trains in one process, but the cluster has {cluster.num_workers} "
            f"workers ({cluster!r}, from TF_CONFIG or the launcher). HINT: use "
            f"strategy={AUTO['workers']!r} (or 'auto'), or unset TF_CONFIG for local training."
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

    Besides returning the strategy, it changes this process: it applies tfdist's fixes, sets
    the task context (`tfdist.task`), starts the server of a task that only serves, configures
    TensorFlow's runtime and collectives, takes SIGTERM back and sets an exit barrier
    (multi_worker_mirrored), and counts the steps of every fit for `tfdist launch`. All of it
    happens in one step after every argument is checked, `_build_in_this_process` in
    tfdist/strategy/factory.py, whose docstring lists each effect, its order and why.

    Args:
        name: str. "auto", or a strategy of `tfdist.strategy.registry.STRATEGIES`:
            "one_device", "mirrored", "multi_worker_mirrored", "parameter_server" or "default"
            (alias "off": TensorFlow's default strategy). Defaults to "auto", which yields to
            TFDIST_STRATEGY when that is set (as by `tfdist launch --strategy NAME`).
        cluster: ClusterSpec. Defaults to `tfdist.detect_cluster()` (TF_CONFIG, SLURM, local).
        devices: list of device strings ("/gpu:0", "/cpu:1"). Defaults to every local GPU, else
            every logical CPU. `one_device` uses the first.
        communication: str. How replicas all-reduce. multi_worker_mirrored: "auto" (NCCL when
            every replica is a GPU, else ring), "ring", "nccl", "gloo" (CPU workers: the
            gradients' all-reduce through torch.distributed's Gloo, the extra tfdist[gloo];
            `tfdist.strategy.gloo`). mirrored: "auto", "nccl",
            "hierarchical_copy", "reduce_to_one_device". Defaults to "auto", which yields to
            TFDIST_COMMUNICATION when that names a choice valid for the strategy.
        gradient_compression: "bf16", "fp16" or None. mirrored and multi_worker_mirrored: cast
            float32 gradients (tensors of 1024 elements or more; never IndexedSlices) to that
            type for the all-reduce and back after it; "fp16" divides by the number of replicas
            before the cast so that the sum cannot overflow. None yields to
            TFDIST_GRADIENT_COMPRESSION (ignored by other strategies), else no compression;
            "none" is no compression whatever the variable says.
        **options: TensorFlow's own options, validated against the strategy's record
            (`Strategy.options`) and passed through:
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
    if key == "auto":  # `tfdist launch --strategy`
        key = settings.STRATEGY.get(check=known_name) or key
    if cluster is None:
        cluster = detect_cluster()
    elif not isinstance(cluster, ClusterSpec):
        raise TypeError(
            f"cluster must be a tfdist.ClusterSpec. Received: {cluster!r} (of type "
            f"{type(cluster).__name__}). HINT: tfdist.ClusterSpec.from_tf_config(...)."
        )
    if devices is not None:
        devices = check_devices(devices)
    found = list(devices) if devices is not None else (take_slurm_gpu_share() or local_devices())
    record = STRATEGIES[resolve_strategy_name(key, cluster, found)]
    unknown = sorted(set(options) - set(record.options))
    if unknown:
        accepted = ", ".join(record.options) or "none"
        raise TypeError(
            f"make_strategy({record.name!r}) got unexpected option(s) {unknown}. Options "
            f"accepted for {record.name!r}: {accepted}."
        )
    from_env = settings.COMMUNICATION.get()
    if communication == "auto" and from_env in record.communications:
        communication = from_env  # a job-wide choice; where it does not apply, "auto" stays
    check_communication(
        record.name, communication, record.communications, record.without_all_reduce
    )
    if gradient_compression is None:
        from_env = settings.GRADIENT_COMPRESSION.get()  # job-wide: where it does not apply, off
        compression = from_env if record.all_reduce else None
    else:
        compression = check_compression(record.name, gradient_compression)
    return _build_in_this_process(
        record,
        cluster=cluster,
        devices=devices,
        found=found,
        communication=communication,
        compression=compression,
        **options,
    )


def _build_in_this_process(record: Strategy, *, cluster: ClusterSpec, **arguments):
    """Builds `record`'s strategy from checked `arguments`, with everything that making a
    strategy does to this process. Those effects, in their order:

    1. tfdist's fixes are applied (`tfdist.fixes.apply_fixes`, once per process; it reads
       TFDIST_KERAS_FIXES): they patch Keras 3 and TensorFlow internals so that the plain
       Keras idiom works on the strategy. Not for a strategy that distributes nothing
       (`default`): Keras on one device is never changed.
    2. The task context is set (`tfdist.task.set_current`): the cluster given to make_strategy,
       not only the environment's, decides who is the chief (progress bars, once-per-job
       messages, the sharding warning).
    3. A task that only serves (`Strategy.serving_tasks`: a worker or ps task of a
       parameter-server job with a chief) starts its gRPC server here and never returns, so
       that one script runs unchanged in every role (a Kubernetes TFJob starts the same
       command in each replica).
    4. The builder runs (`Strategy.build`, `tfdist.strategy.builders`). Constructing a
       strategy initialises TensorFlow's runtime: no device can be configured after it. A
       parameter-server chief first waits, bounded, until every worker and ps answers
       (TFDIST_STARTUP_TIMEOUT). The first multi_worker_mirrored strategy of a process with
       peers (`tfdist.strategy.multi_worker.build_multi_worker`) also waits for its peers
       while answering on its own port, configures TensorFlow's coordination service with a
       finite registration timeout, configures the collectives (once per process: it is
       cached), marks its all-reduce for compression and pieces (the fix record
       `tfdist.fixes.collectives.ALL_REDUCE`), registers the exit barrier (atexit, skipped
       after an uncaught exception), hides Keras' progress bars off the chief
       (TFDIST_PROGRESS), and takes SIGTERM back from the coordination service's handler.
       Those stay in the builder: they bracket TensorFlow's constructor, under the lock of
       its once-per-process cache.
    5. Under `tfdist launch` (TFDIST_REPORT_FILE), every fit's steps and time are counted for
       the launcher's summary line (`tfdist.training_report.install`); after the build, so
       that tasks that only serve count nothing. The workers of a multi_worker_mirrored job
       check at each fit that they train the same model the same way
       (`tfdist.fit_agreement.install`). With TFDIST_PROFILE, a profiler trace of the steps
       it names is captured (`tfdist.profiler.install`).

    Before this step make_strategy only reads: TFDIST_STRATEGY, TFDIST_COMMUNICATION and
    TFDIST_GRADIENT_COMPRESSION (`tfdist.settings`), the cluster (`tfdist.detect_cluster`:
    TF_CONFIG, SLURM; it never writes TF_CONFIG) and the local devices (which imports
    TensorFlow, but does not initialise its runtime), with one exception: in a SLURM step
    whose tasks on a node all see the same GPUs, it first narrows the GPUs this task sees to
    its share (`tfdist.strategy.devices.take_slurm_gpu_share`), since the devices decide the
    strategy.
    """
    if record.distributes:
        from tfdist.fixes import apply_fixes

        apply_fixes()
    task.set_current(cluster, record.name)
    if cluster.task_type in record.serving_tasks and cluster.has_chief:
        log.info(
            "tfdist: task %s of a %s job serves until the job ends.", cluster.task, record.name
        )
        serve(cluster)
    strategy = getattr(builders, record.build)(cluster=cluster, **arguments)
    from tfdist import training_report as report

    report.install(watch_stalls=not cluster.is_single_process, task=cluster.task or "")
    if record.name == "multi_worker_mirrored" and cluster.num_workers > 1:
        from tfdist import fit_agreement

        fit_agreement.install()
    from tfdist import profiler

    profiler.install()  # with TFDIST_PROFILE only
    return strategy

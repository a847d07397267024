"""The local devices replicas run on: GPUs, or logical CPUs made with `virtual_cpus`.

Queries never initialise the TensorFlow runtime, so devices can still be configured after them.
Imports only tfdist.errors (and TensorFlow inside functions).
"""

from __future__ import annotations

import re

from tfdist.errors import is_count

__all__ = [
    "available_devices",
    "check_devices",
    "gpus_share_a_device",
    "local_devices",
    "runtime_initialized",
    "slurm_tasks_share_gpus",
    "take_slurm_gpu_share",
    "virtual_cpus",
]


def context():
    from tensorflow.python.eager import context  # the one private handle tfdist needs

    return context.context()


def runtime_initialized() -> bool:
    """True once TensorFlow has initialised its devices (no more device configuration)."""
    return bool(context()._initialized)  # pylint: disable=protected-access


def local_devices() -> list:
    """The devices replicas would run on in this process: GPUs if any, else the logical CPUs.

    Does not initialise the TensorFlow runtime, so it may be called before `virtual_cpus` or
    before building a multi-worker strategy.
    """
    devices = available_devices()
    gpus = [d for d in devices if d.startswith("/gpu:")]
    return gpus or [d for d in devices if d.startswith("/cpu:")]


def _short_name(name: str) -> str:
    match = re.search(r"device:([A-Z]+):(\d+)$", name)
    return f"/{match.group(1).lower()}:{match.group(2)}" if match else name


MAX_VIRTUAL_CPUS = 1024  # 1,024: a strategy in 14 s and 0.8 GB; 10**6 never returned


def virtual_cpus(n: int) -> list:
    """Splits the host CPU into `n` logical devices, for mirrored training on a CPU-only host.

    Must run before TensorFlow initialises its devices (before the first op, device query or
    strategy). Calling it again with the same `n` is a no-op.

    Args:
        n: int. Number of logical CPUs, 1 to `MAX_VIRTUAL_CPUS` (1024).

    Returns:
        list[str]: the logical CPU names, "/cpu:0" ... "/cpu:{n-1}".

    Raises:
        ValueError: `n` is not an integer from 1 to 1024.
        RuntimeError: TensorFlow already initialised its devices with another count.
    """
    import tensorflow as tf

    if not is_count(n, 1):
        raise ValueError(f"virtual_cpus(n) needs a positive integer. Received: n={n!r}.")
    if n > MAX_VIRTUAL_CPUS:
        raise ValueError(
            f"virtual_cpus(n) makes at most {MAX_VIRTUAL_CPUS} logical CPUs: each costs memory "
            f"and start-up time in every strategy built on them. Received: n={n!r}. HINT: a "
            "test of distributed code needs a few replicas (2 to 8); for many, run a "
            "multi-worker job (tfdist launch --workers N)."
        )
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


def slurm_tasks_share_gpus(env=None, seen=None) -> bool:
    """True where this process is a task of a SLURM step that shares a GPU with another task
    of its node: SLURM bound no GPUs to tasks (`tfdist.cluster.slurm.unbound_gpu_tasks`) and
    the node has fewer GPUs than tasks (`tfdist.gpus.share`). NCCL refuses two ranks on one
    GPU, so multi_worker_mirrored's "auto" all-reduces on the ring there.

    Args:
        env: mapping. Defaults to `os.environ`.
        seen: int. The GPUs the tasks of the node see. Defaults to the physical GPUs
            TensorFlow lists (which does not initialise its runtime).
    """
    import os

    from tfdist import gpus
    from tfdist.cluster.slurm import unbound_gpu_tasks

    task = unbound_gpu_tasks(os.environ if env is None else env)
    if task is None:
        return False
    if seen is None:
        import tensorflow as tf

        seen = len(tf.config.list_physical_devices("GPU"))
    local, tasks = task
    return seen > 0 and gpus.share(seen, tasks, local)[1]


def take_slurm_gpu_share(env=None):
    """In a SLURM step with several tasks on a node that see the same GPUs, makes this task
    see only its share (`tfdist.gpus.share`), growing its memory where tasks share GPUs
    (unless TFDIST_GPU_MEMORY_GROWTH=0). Returns the replica devices it leaves ("/gpu:0",
    ...), or None where it changed nothing. Must run before TensorFlow initialises its
    devices; after, it warns and changes nothing.
    """
    import logging
    import os

    import tensorflow as tf

    from tfdist import gpus, settings
    from tfdist.cluster.slurm import unbound_gpu_tasks

    env = os.environ if env is None else env
    task = unbound_gpu_tasks(env)
    if task is None:
        return None
    physical = tf.config.list_physical_devices("GPU")
    if not physical:
        return None
    local, tasks = task
    indices, shared = gpus.share(len(physical), tasks, local)
    grow = shared and settings.GPU_MEMORY_GROWTH.get(env)
    log = logging.getLogger("tfdist")
    if runtime_initialized():
        log.warning(
            "tfdist: this SLURM task shares its node's %d GPUs with other tasks, but TensorFlow "
            "already initialised them, so it keeps all. HINT: call make_strategy() before any "
            "TensorFlow op, or give each task its own GPUs (srun --gpus-per-task).",
            len(physical),
        )
        return None
    kept = [physical[i] for i in indices]
    tf.config.set_visible_devices(kept, "GPU")
    if grow:
        for gpu in kept:
            tf.config.experimental.set_memory_growth(gpu, True)
    log.info(
        "tfdist: SLURM task %s of its node takes GPU(s) %s of %d%s.",
        local,
        indices,
        len(physical),
        (
            f", shared with other tasks ({'memory growth; ' if grow else ''}communication "
            "'auto' all-reduces on the ring)"
        )
        if shared
        else "",
    )
    return [f"/gpu:{i}" for i in range(len(kept))]


def gpus_share_a_device(devices, per_physical=None) -> bool:
    """True when two GPUs of `devices` are logical GPUs carved from one physical GPU.

    NCCL refuses two ranks on one GPU, so "auto" all-reduces such replicas another way.

    Args:
        devices: list of device strings ("/gpu:0", "/cpu:1"); only GPUs count.
        per_physical: list of int. The logical GPUs of each physical GPU, in order (TensorFlow
            numbers logical GPUs physical GPU by physical GPU). Defaults to TensorFlow's
            configuration of this process.
    """
    if per_physical is None:
        import tensorflow as tf

        per_physical = [
            len(tf.config.get_logical_device_configuration(gpu) or [None])
            for gpu in tf.config.list_physical_devices("GPU")
        ]
    owner = [physical for physical, n in enumerate(per_physical) for _ in range(n)]
    indices = [
        int(m.group(1)) for m in (re.search(r"gpu:(\d+)$", str(d).lower()) for d in devices) if m
    ]
    owners = [owner[i] for i in indices if i < len(owner)]
    return len(set(owners)) < len(owners)


def check_devices(devices) -> list:
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
        raise ValueError(
            f"devices={list(devices)!r} names a device twice. HINT: list each device once."
        )
    local = [d for d in devices if "/job:" not in d.lower() and "tpu:" not in d.lower()]
    if local:
        existing = available_devices()
        missing = [d for d in local if _canonical(d) not in existing]
        if missing:
            raise ValueError(
                f"devices {missing!r} do not exist in this process, which has: "
                f"{', '.join(existing)}. HINT: pick from those, leave devices out to use all, "
                "or call tfdist.virtual_cpus(n) first thing for n logical CPUs."
            )
    return list(devices)


def _canonical(device: str) -> str:
    """ "/device:GPU:1", "GPU:1", "/gpu:1" -> "/gpu:1"."""
    kind, index = re.search(r"(cpu|gpu|tpu):(\d+)$", device.lower()).groups()
    return f"/{kind}:{int(index)}"


def available_devices() -> list:
    """Every local GPU and logical CPU, as "/gpu:0", "/cpu:0"... Does not initialise the runtime."""
    import tensorflow as tf

    if runtime_initialized():
        return [
            _short_name(d.name)
            for kind in ("GPU", "CPU")
            for d in tf.config.list_logical_devices(kind)
        ]
    gpus = tf.config.list_physical_devices("GPU")
    count = sum(len(tf.config.get_logical_device_configuration(g) or [None]) for g in gpus)
    cpu = tf.config.list_physical_devices("CPU")[0]
    cpus = len(tf.config.get_logical_device_configuration(cpu) or [None])
    return [f"/gpu:{i}" for i in range(count)] + [f"/cpu:{i}" for i in range(cpus)]

"""How replicas all-reduce: the `communication=` vocabulary of each strategy, and the TensorFlow
options it becomes (CrossDeviceOps for mirrored, CommunicationOptions for multi-worker).

NCCL is picked only where every replica is a GPU that no other rank uses; asking for it where a
replica is a CPU is refused with the choices that strategy accepts. TensorFlow is imported
inside functions only.
"""

from __future__ import annotations

from typing import Optional, Sequence, Tuple

from tfdist import settings

__all__ = [
    "MIRRORED",
    "MULTI_WORKER",
    "NONE",
    "RING_BYTES_PER_PACK",
    "check_communication",
    "collective_implementation",
    "collective_options",
    "mirrored_cross_device_ops",
]

# The `communication=` values each kind of strategy understands ("auto" decides by the devices).
MULTI_WORKER: Tuple[str, ...] = ("auto", "ring", "nccl", "gloo")
MIRRORED: Tuple[str, ...] = ("auto", "nccl", "hierarchical_copy", "reduce_to_one_device")
NONE: Tuple[str, ...] = ("auto",)  # no all-reduce to choose (one device, parameter servers)


# tfdist's pack size for ring all-reduces (bytes_per_pack=None): TensorFlow's default (0) packs
# every gradient of a step into one concatenated tensor; on the ring, one large message costs
# more per byte than several of a few MiB (benchmarks/bench_allreduce.py --knobs: a 128 MiB
# payload all-reduced as 32 tensors of 4 MiB was 2.2x as fast as one tensor, and 4 MiB is the
# size TensorFlow's ring itself cuts its chunks to). NCCL keeps TensorFlow's default.
RING_BYTES_PER_PACK = 4 << 20


def check_communication(strategy: str, communication, choices: Sequence[str], why: str = "") -> str:
    """`communication` folded to lower case, when it is one of `choices` of `strategy`.

    `why` says, in the message, why the choices are so few (a strategy without all-reduce).
    """
    key = communication.strip().lower() if isinstance(communication, str) else communication
    if key not in choices:
        raise ValueError(
            f"communication={communication!r} is not valid for strategy {strategy!r}. Choose "
            f"one of: {', '.join(choices)}" + (f" ({why})." if why else ".")
        )
    return key


def _all_gpus(devices: Sequence[str]) -> bool:
    return bool(devices) and all("gpu" in d.lower() for d in devices)


def _require_gpus_for_nccl(strategy: str, devices: Sequence[str], choices: Sequence[str]) -> None:
    if not _all_gpus(devices):
        others = " or ".join(repr(c) for c in choices if c != "nccl")
        raise ValueError(
            f"communication='nccl' needs every replica on a GPU, but strategy {strategy!r} "
            f"would run on {list(devices)}. HINT: use communication={others} (for "
            f"{strategy!r}; 'auto' picks NCCL only where every replica is a GPU)."
        )


def _chosen(
    strategy: str, communication: str, devices: Sequence[str], shared: bool, otherwise: str
) -> str:
    """`communication` checked against `strategy`'s choices, "auto" resolved: NCCL where every
    replica is a GPU that nothing else uses (`shared`: another replica or task uses one of
    them), else `otherwise`; NCCL only where every replica is a GPU."""
    choices = MIRRORED if strategy == "mirrored" else MULTI_WORKER
    communication = check_communication(strategy, communication, choices)
    if communication == "auto":
        communication = "nccl" if _all_gpus(devices) and not shared else otherwise
    if communication == "nccl":
        _require_gpus_for_nccl(strategy, devices, choices)
    return communication


def mirrored_cross_device_ops(
    communication: str, devices: Sequence[str], gpus_share_a_device: bool = False
):
    """The CrossDeviceOps for MirroredStrategy: "auto" is NCCL on all-GPU replicas, each on a
    GPU of its own, else reducing on one device (CPU replicas; logical GPUs carved from one
    GPU, `tfdist.strategy.devices.gpus_share_a_device`, where NCCL would see one GPU twice)."""
    import tensorflow as tf

    communication = _chosen(
        "mirrored", communication, devices, gpus_share_a_device, "reduce_to_one_device"
    )
    if communication == "nccl":
        return tf.distribute.NcclAllReduce()
    if communication == "hierarchical_copy":
        return tf.distribute.HierarchicalCopyAllReduce()
    # On CPU replicas TensorFlow's default would probe NCCL-incapable paths; reducing on one
    # device is the reduction that works there.
    return tf.distribute.ReductionToOneDevice()


def collective_implementation(
    communication: str, devices: Sequence[str], tasks_share_gpus: bool = False
) -> str:
    """What multi_worker_mirrored all-reduces with: "nccl", "ring" or "gloo", checked.

    "auto" is NCCL where every replica is a GPU and no other task of the node uses the same
    GPU, else the ring: NCCL refuses two ranks on one GPU ("Duplicate GPU detected"), as in a
    SLURM step with fewer GPUs than tasks on a node (`tasks_share_gpus`,
    `tfdist.strategy.devices.slurm_tasks_share_gpus`). A choice of the caller's own is kept.

    Raises:
        ValueError: an unknown choice, NCCL with a CPU replica, Gloo with a GPU replica.
    """
    communication = _chosen(
        "multi_worker_mirrored", communication, devices, tasks_share_gpus, "ring"
    )
    if communication == "gloo" and any("gpu" in d.lower() for d in devices):
        raise ValueError(
            f"communication='gloo' all-reduces between processes on their CPUs, but this "
            f"worker's replicas are {list(devices)}. HINT: use communication='nccl' (or "
            "'auto') on GPUs; 'gloo' is for CPU workers, one replica each."
        )
    return communication


def collective_options(
    communication: str,
    devices: Sequence[str],
    *,
    bytes_per_pack: Optional[int] = None,
    timeout_seconds: Optional[float] = None,
    tasks_share_gpus: Optional[bool] = None,
):
    """The `CommunicationOptions` for MultiWorkerMirroredStrategy
    (`collective_implementation` decides between NCCL and the ring).

    bytes_per_pack: None picks tfdist's default: `RING_BYTES_PER_PACK` (4 MiB) for the ring,
    TensorFlow's 0 (one pack) for NCCL. 0 is TensorFlow's own default.
    "gloo" gives the ring's options: TensorFlow's collectives still carry what Gloo does not
    (variable broadcasts at start-up, gathers, sparse gradients; `tfdist.strategy.gloo`).
    tasks_share_gpus: None asks `tfdist.strategy.devices.slurm_tasks_share_gpus` (where every
    replica is a GPU).
    """
    import tensorflow as tf

    implementation = tf.distribute.experimental.CommunicationImplementation
    if tasks_share_gpus is None:
        from tfdist.strategy.devices import slurm_tasks_share_gpus

        tasks_share_gpus = _all_gpus(devices) and slurm_tasks_share_gpus()
    communication = collective_implementation(communication, devices, tasks_share_gpus)
    if bytes_per_pack is None:
        bytes_per_pack = 0 if communication == "nccl" else RING_BYTES_PER_PACK
    if timeout_seconds is None:
        timeout_seconds = settings.COLLECTIVE_TIMEOUT.get()  # default 0: no limit
    return tf.distribute.experimental.CommunicationOptions(
        bytes_per_pack=bytes_per_pack,
        timeout_seconds=timeout_seconds or None,
        implementation=implementation.NCCL if communication == "nccl" else implementation.RING,
    )

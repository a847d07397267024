"""Keras device names ("cpu:0", "gpu:3") and the TensorFlow devices they stand for.

Keras numbers devices globally, as JAX does: in a job of several processes, `list_devices()`
returns every process's devices, process 0's first. Here that list follows what the job's
MultiWorkerMirroredStrategy trains on: each process's GPUs, or one CPU per process (the
strategy uses one CPU device per worker, whatever logical CPUs exist). In one process the list
is the local logical devices, "cpu:0" ... as Keras's own TensorFlow prototype names them.

Imports tfdist.keras_distribution.processes (TensorFlow inside functions).
"""

from __future__ import annotations

import re
from typing import Optional, Sequence

from tfdist.keras_distribution import processes

__all__ = ["list_devices", "parse", "local_tf_devices"]

_NAME = re.compile(r"(?:^|[/:])(cpu|gpu|tpu):(\d+)$", re.IGNORECASE)


def parse(name) -> tuple:
    """("cpu", 3) for "cpu:3", "CPU:3", "/device:CPU:3" or "/cpu:3".

    Raises:
        ValueError: not a device name of that form.
    """
    match = _NAME.search(str(name)) if isinstance(name, str) else None
    if match is None:
        raise ValueError(
            f"Device {name!r} of the DeviceMesh is not a Keras device name like 'cpu:0' or "
            "'gpu:1'. HINT: build the mesh from keras.distribution.list_devices()."
        )
    return match.group(1).lower(), int(match.group(2))


def _local(device_type: Optional[str]) -> list:
    import tensorflow as tf

    kind = device_type.upper() if device_type else None
    found = tf.config.list_logical_devices(kind)
    cpus = [d for d in found if d.device_type == "CPU"]
    others = [d for d in found if d.device_type not in ("CPU", "TPU_SYSTEM")]
    chosen = found if kind else (others or cpus)
    return [f"{d.device_type.lower()}:{d.name.split(':')[-1]}" for d in chosen]


def list_devices(device_type: Optional[str] = None) -> list:
    """Every device of the job of the given type (default: GPUs if any, else CPUs).

    In a multi-process job (after `keras.distribution.initialize()`, which runs here when the
    environment describes such a job), process p's devices come after those of processes < p.
    """
    if device_type is not None and (
        not isinstance(device_type, str) or device_type.lower() not in ("cpu", "gpu", "tpu")
    ):
        raise ValueError(
            f"device_type must be 'cpu', 'gpu' or 'tpu'. Received: device_type={device_type!r}."
        )
    processes.initialize_from_environment()
    count = processes.num_processes()
    local = _local(device_type)
    if count == 1:
        return local
    kind = device_type.lower() if device_type else (local[0].split(":")[0] if local else "cpu")
    per_process = 1 if kind == "cpu" else len(local)
    return [f"{kind}:{p * per_process + i}" for p in range(count) for i in range(per_process)]


def local_tf_devices(names: Sequence[str]) -> list:
    """["/cpu:0", "/cpu:1"] for Keras names of this process's devices ["cpu:0", "cpu:1"]."""
    return [f"/{kind}:{index}" for kind, index in map(parse, names)]

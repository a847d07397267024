"""What runs a Keras `Distribution` on TensorFlow, or why it cannot run: `plan_for`.

- Replicas: `DataParallel`, and a `ModelParallel` whose layouts shard no variable. The model is
  replicated on every device of the mesh and each replica trains on its share of the batch:
  MirroredStrategy over those devices in one process, the job's MultiWorkerMirroredStrategy
  over several (the mesh must then hold every device of the job).
- Row-sharded: a `ModelParallel` whose variable layouts split the first dimension over one mesh
  axis, e.g. `layout_map["embedding/embeddings"] = ("model", None)`. TensorFlow's sharded
  variable (ShardedVariable) is split by rows only. Each row shard lives on its own device of
  that axis and one replica trains synchronously, in one process; the mesh's batch axis must
  have size 1 (TensorFlow cannot also replicate a sharded variable across devices).
- Anything else (a column or 2-D split, a variable sharded over the batch axis, a mesh across
  processes with row shards) is refused with a message naming what TensorFlow can do.

Layouts of intermediate tensors (keys ending in "output") are hints for XLA's partitioner on
JAX; TensorFlow's strategies compute whole activations per replica, so they are accepted and
have no effect.

Imports the sibling modules devices and processes.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Tuple

from tfdist.keras_distribution import devices as keras_devices
from tfdist.keras_distribution import processes

__all__ = ["Plan", "batch_axis", "plan_for", "row_sharding"]


@dataclasses.dataclass(frozen=True)
class Plan:
    """How a distribution runs.

    Attributes:
        replicas: tuple of Keras device names the model is replicated on (empty when
            row-sharded: one replica on the default device).
        multi_process: bool. The replicas span the job's processes.
        shard_devices: dict-like tuple of (mesh axis, Keras device names along it) for
            row-sharded variables; empty otherwise.
    """

    replicas: Tuple[str, ...] = ()
    multi_process: bool = False
    shard_devices: Tuple[Tuple[str, Tuple[str, ...]], ...] = ()

    @property
    def row_sharded(self) -> bool:
        return bool(self.shard_devices)


_ROW_HINT = (
    "TensorFlow shards a variable by rows only: the first dimension over one mesh axis, the "
    "others whole, e.g. layout_map['embedding/embeddings'] = ('model', None), in one process "
    "with a mesh whose batch axis has size 1. HINT: use such a layout or leave the variable "
    "replicated (all None); for sharded variables across machines use "
    "tfdist.make_strategy('parameter_server', variable_partitioner=...); for other layouts "
    "the JAX backend."
)


def _classes():
    from keras.src.distribution import distribution_lib

    return distribution_lib.DataParallel, distribution_lib.ModelParallel


def _mesh_devices(distribution) -> list:
    names = [str(d) for d in distribution.device_mesh.devices.flatten()]
    parsed = [keras_devices.parse(name) for name in names]
    kinds = {kind for kind, _ in parsed}
    if len(kinds) > 1:
        raise ValueError(
            f"The DeviceMesh of {distribution!r} mixes device types ({sorted(kinds)}): "
            f"{names}. HINT: build it from keras.distribution.list_devices('gpu') or ('cpu')."
        )
    canonical = [f"{kind}:{index}" for kind, index in parsed]
    twice = sorted({d for d in canonical if canonical.count(d) > 1})
    if twice:
        raise ValueError(
            f"The DeviceMesh of {distribution!r} names {twice} more than once. HINT: list each "
            "device once, e.g. from keras.distribution.list_devices()."
        )
    available = keras_devices.list_devices(kinds.pop())
    missing = [d for d in canonical if d not in available]
    if missing:
        raise ValueError(
            f"The DeviceMesh of {distribution!r} names device(s) {missing} that this job does "
            f"not have; it has {available} (keras.distribution.list_devices()). HINT: build the "
            "mesh from list_devices(); on a CPU-only host, tfdist.virtual_cpus(n) first thing "
            "gives n logical CPUs."
        )
    if processes.num_processes() > 1 and set(canonical) != set(available):
        raise ValueError(
            f"The DeviceMesh of {distribution!r} holds {canonical}, but this job of "
            f"{processes.num_processes()} processes trains on {available}: a multi-process "
            "job replicates the model on every process's devices. HINT: build the mesh from "
            "keras.distribution.list_devices()."
        )
    return canonical


def _variable_layouts(distribution) -> list:
    """(key, axes) of the LayoutMap entries that lay out variables (not "...output" tensors)."""
    layout_map = getattr(distribution, "_layout_map", None)
    if layout_map is None:
        raise ValueError(
            f"{distribution!r} has no layout map tfdist can read on this Keras release. HINT: "
            "use DataParallel, or report this Keras release as an issue."
        )
    return [
        (key, tuple(layout_map[key].axes))
        for key in layout_map
        if not key.rstrip("$").endswith("output")
    ]


def batch_axis(distribution) -> str:
    """The mesh axis the batch is split over (a property from Keras 3.8, an attribute before)."""
    return getattr(distribution, "batch_dim_name", None) or distribution._batch_dim_name


def _shard_axes(distribution) -> list:
    """The mesh axes that row-shard some variable; refuses every other sharded layout."""
    batch = batch_axis(distribution)
    axes = []
    for key, layout in _variable_layouts(distribution):
        if all(axis is None for axis in layout):
            continue
        if not layout or layout[0] is None or any(a is not None for a in layout[1:]):
            raise ValueError(
                f"ModelParallel layout {key!r}: {layout} cannot run on TensorFlow. " + _ROW_HINT
            )
        if layout[0] == batch:
            raise ValueError(
                f"ModelParallel layout {key!r}: {layout} shards a variable over the batch axis "
                f"{batch!r} (fully sharded data parallel), which TensorFlow's strategies cannot "
                "do. " + _ROW_HINT
            )
        if layout[0] not in axes:
            axes.append(layout[0])
    return axes


def plan_for(distribution) -> Optional[Plan]:
    """The Plan for `distribution` (None: no distribution).

    Raises:
        ValueError: a mesh or layout TensorFlow cannot carry; the message says what can.
        TypeError: a Distribution class tfdist does not know.
    """
    if distribution is None:
        return None
    data_parallel, model_parallel = _classes()
    if not isinstance(distribution, (data_parallel, model_parallel)):
        raise TypeError(
            f"tfdist carries keras.distribution.DataParallel and ModelParallel on TensorFlow. "
            f"Received: {distribution!r} (of type {type(distribution).__name__}). HINT: use one "
            "of those, or tfdist.make_strategy() with strategy.scope()."
        )
    names = _mesh_devices(distribution)
    multi_process = processes.num_processes() > 1
    axes = _shard_axes(distribution) if isinstance(distribution, model_parallel) else []
    if not axes:
        return Plan(replicas=tuple(names), multi_process=multi_process)
    mesh = distribution.device_mesh
    batch = batch_axis(distribution)
    batch_size = mesh.shape[list(mesh.axis_names).index(batch)] if batch in mesh.axis_names else 1
    if batch_size != 1 or multi_process:
        raise ValueError(
            f"{distribution!r} row-shards variables over {axes} and also "
            + (
                f"replicates them over the batch axis {batch!r} of size {batch_size}"
                if batch_size != 1
                else f"spans {processes.num_processes()} processes"
            )
            + ". TensorFlow runs row-sharded variables as one replica in one process. HINT: "
            "give the batch axis size 1, e.g. DeviceMesh((1, n), ['batch', 'model']), or use "
            "DataParallel for replicas; across machines use "
            "tfdist.make_strategy('parameter_server', variable_partitioner=...)."
        )
    grid = mesh.devices
    shard_devices = []
    for axis in axes:
        position = list(mesh.axis_names).index(axis)
        index = [0] * grid.ndim
        along = []
        for i in range(grid.shape[position]):
            index[position] = i
            kind, number = keras_devices.parse(str(grid[tuple(index)]))
            along.append(f"{kind}:{number}")
        shard_devices.append((axis, tuple(along)))
    return Plan(shard_devices=tuple(shard_devices))


def row_sharding(distribution, plan: Plan, variable) -> Optional[Tuple[str, ...]]:
    """The Keras devices `variable`'s row shards go to under `plan`, or None (not sharded).

    Reads the layout map by the variable's path (its shape is not known yet while Keras
    creates it).
    """
    if plan is None or not plan.row_sharded:
        return None
    layout = getattr(variable, "_layout", None) or distribution._layout_map[variable.path]
    axes = tuple(getattr(layout, "axes", ()) or ())
    if not axes or axes[0] is None:
        return None
    devices = dict(plan.shard_devices).get(axes[0])
    return devices if devices is not None and len(devices) > 1 else None

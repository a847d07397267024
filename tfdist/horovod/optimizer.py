"""`DistributedOptimizer`: a Keras optimizer that averages its gradients over the processes
before it applies them, for Keras 3 and tf_keras (Keras 2) optimizers alike.

As in Horovod, the result is a new optimizer of a subclass with the original's class name and
module (a saved model loads without tfdist), made from the original's config. The subclass
reduces the gradients in the method each Keras calls with them: `apply` (Keras 3; its
`apply_gradients` calls `apply`) or `apply_gradients` (tf_keras, both its optimizers).

`backward_passes_per_step=N` adds each step's gradients to local accumulators and only every
N-th step all-reduces the sum (divided by N with `average_aggregated_gradients=True`) and
applies it; on the other steps the optimizer does nothing, its `iterations` included, as in
Horovod. Imports TensorFlow.
"""

from __future__ import annotations

from typing import Dict, List, Optional

import tensorflow as tf

from tfdist.errors import is_count
from tfdist.horovod.collectives import Average, check_process_set
from tfdist.horovod.compression import Compression
from tfdist.horovod.gradients import GradientReduction

__all__ = ["DistributedOptimizer", "distribute_optimizer_in_place"]


class _Aggregation:
    """The local accumulators of `backward_passes_per_step` (kept out of the optimizer's
    tracked variables, so that checkpoints look as without tfdist)."""

    def __init__(self, passes: int, average: bool):
        self.passes = passes
        self.average = average
        self.counter = None
        self.sums: Optional[List] = None

    def ensure(self, variables) -> None:
        if self.sums is not None:
            return
        with tf.init_scope():
            self.counter = tf.Variable(0, dtype=tf.int64, trainable=False)
            self.sums = [
                tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False) for v in variables
            ]


def _is_keras3(cls) -> bool:
    return hasattr(cls, "apply") and hasattr(cls, "stateless_apply")


def _variables_of(optimizer, variables):
    if variables is not None:
        return list(variables)
    return list(getattr(optimizer, "_trainable_variables", []))


def _build_first(optimizer, variables) -> None:
    """Builds the optimizer before a `tf.cond` (no variable may be created in a branch)."""
    with tf.init_scope():
        if _is_keras3(type(optimizer)):
            if not optimizer.built:
                optimizer.build(variables)
                optimizer.built = True
        elif hasattr(optimizer, "_create_all_weights"):  # tf_keras' legacy optimizers
            optimizer._create_all_weights(variables)
        elif not getattr(optimizer, "_built", False):
            optimizer.build(variables)


@tf.autograph.experimental.do_not_convert
def _reduced_apply(optimizer, apply, grads, variables):
    """Reduces `grads` and calls `apply(grads, variables)`, every step or every N-th."""
    reduction: GradientReduction = optimizer._tfdist_reduction
    aggregation: Optional[_Aggregation] = optimizer._tfdist_aggregation
    grads = list(grads)
    if aggregation is None:
        return apply(reduction(grads), variables)
    variables = _variables_of(optimizer, variables)
    if len(variables) != len(grads):
        raise ValueError(
            f"backward_passes_per_step needs one variable per gradient; received "
            f"{len(grads)} gradients and {len(variables)} variables. HINT: pass the "
            "trainable variables with the gradients."
        )
    aggregation.ensure(variables)
    _build_first(optimizer, variables)
    for total, grad in zip(aggregation.sums, grads):
        if grad is not None:
            total.assign_add(tf.convert_to_tensor(grad))
    count = aggregation.counter.assign_add(1)

    def apply_the_sum():
        scale = 1.0 / aggregation.passes if aggregation.average else 1.0
        summed = [
            None if grad is None else total.read_value() * tf.cast(scale, total.dtype)
            for total, grad in zip(aggregation.sums, grads)
        ]
        apply(reduction(summed), variables)
        with tf.control_dependencies([s for s in summed if s is not None]):
            for total in aggregation.sums:
                total.assign(tf.zeros_like(total))
        return tf.constant(True)

    return tf.cond(
        tf.equal(count % aggregation.passes, 0), apply_the_sum, lambda: tf.constant(False)
    )


_CLASSES: Dict[type, type] = {}


def _distributed_class(base: type) -> type:
    """The subclass of `base` that reduces gradients (one per optimizer class)."""
    if base in _CLASSES or getattr(base, "_tfdist_distributed", False):
        return _CLASSES.get(base, base)
    if _is_keras3(base):

        def apply(self, grads, trainable_variables=None):
            return _reduced_apply(
                self,
                lambda g, v: base.apply(self, g, v),
                grads,
                trainable_variables,
            )

        namespace = {"apply": apply}
    else:

        def apply_gradients(self, grads_and_vars, *args, **kwargs):
            pairs = list(grads_and_vars)
            grads = [g for g, _ in pairs]
            variables = [v for _, v in pairs]
            return _reduced_apply(
                self,
                lambda g, v: base.apply_gradients(self, list(zip(g, v)), *args, **kwargs),
                grads,
                variables,
            )

        namespace = {"apply_gradients": apply_gradients}
    namespace.update(__module__=base.__module__, _tfdist_distributed=True)
    _CLASSES[base] = type(base.__name__, (base,), namespace)
    return _CLASSES[base]


def _check_keras_optimizer(optimizer) -> None:
    cls = type(optimizer)
    if _is_keras3(cls) or hasattr(cls, "apply_gradients") and hasattr(optimizer, "get_config"):
        if hasattr(optimizer, "get_config") and not _is_tf1_optimizer(optimizer):
            return
    raise TypeError(
        f"DistributedOptimizer wraps a Keras optimizer (Keras 3 or tf_keras). Received: "
        f"{optimizer!r}. HINT: for a TensorFlow 1 optimizer or a custom loop use "
        "hvd.DistributedGradientTape(tape)."
    )


def _is_tf1_optimizer(optimizer) -> bool:
    return isinstance(optimizer, tf.compat.v1.train.Optimizer)


def _settings(
    op, compression, sparse_as_dense, gradient_predivide_factor, passes, average_aggregated
):
    if not is_count(passes, 1):
        raise ValueError(
            f"backward_passes_per_step must be a whole number >= 1. Received: "
            f"backward_passes_per_step={passes!r}."
        )
    reduction = GradientReduction(op, compression, sparse_as_dense, gradient_predivide_factor)
    aggregation = _Aggregation(passes, bool(average_aggregated)) if passes > 1 else None
    return reduction, aggregation


def DistributedOptimizer(  # noqa: N802  (Horovod's name)
    optimizer,
    name: Optional[str] = None,
    use_locking: bool = False,
    device_dense: str = "",
    device_sparse: str = "",
    compression=Compression.none,
    sparse_as_dense: bool = False,
    backward_passes_per_step: int = 1,
    op=Average,
    gradient_predivide_factor: float = 1.0,
    average_aggregated_gradients: bool = False,
    num_groups: int = 0,
    groups=None,
    process_set=None,
    scale_local_gradients: bool = True,
):
    """A copy of the Keras `optimizer` whose gradients are averaged over the processes before
    they are applied (Horovod's `hvd.DistributedOptimizer`).

    Args:
        optimizer: a Keras 3 or tf_keras optimizer (its config makes the copy).
        name: str. The copy's name; defaults to the original's.
        compression: hvd.Compression.none / fp16 / bf16.
        sparse_as_dense: bool. All-reduce IndexedSlices gradients as dense tensors.
        backward_passes_per_step: int. Apply every N-th step the (summed) gradients of N.
        op: hvd.Average (default) or hvd.Sum.
        gradient_predivide_factor: float. With Average: divide by it before the sum and by
            size / factor after.
        average_aggregated_gradients: bool. With backward_passes_per_step > 1, divide the sum
            of the N steps by N.
        device_dense, device_sparse, use_locking, num_groups, groups, scale_local_gradients:
            accepted for compatibility (one all-reduce per dtype takes every gradient).

    Raises:
        TypeError: `optimizer` is not a Keras optimizer.
        NotImplementedError: op=hvd.Adasum, process sets.
    """
    check_process_set(process_set)
    _check_keras_optimizer(optimizer)
    if getattr(type(optimizer), "_tfdist_distributed", False):
        raise ValueError(
            f"{optimizer!r} is already a DistributedOptimizer; wrapping it again would reduce "
            "the gradients twice. HINT: wrap the plain optimizer once."
        )
    reduction, aggregation = _settings(
        op,
        compression,
        sparse_as_dense,
        gradient_predivide_factor,
        backward_passes_per_step,
        average_aggregated_gradients,
    )
    config = optimizer.get_config()
    if name is not None:
        config["name"] = name
    cls = _distributed_class(type(optimizer))
    distributed = cls.from_config(config)
    distributed._tfdist_reduction = reduction
    distributed._tfdist_aggregation = aggregation
    return distributed


def distribute_optimizer_in_place(optimizer, compression=Compression.none, op=Average):
    """Turns an existing optimizer (with its state, as `load_model` restores it) into a
    DistributedOptimizer, by class."""
    _check_keras_optimizer(optimizer)
    if not getattr(type(optimizer), "_tfdist_distributed", False):
        optimizer.__class__ = _distributed_class(type(optimizer))
    optimizer._tfdist_reduction = GradientReduction(op, compression)
    optimizer._tfdist_aggregation = None
    return optimizer

"""Gradients averaged over the processes: `DistributedGradientTape`, and the reduction that it
and `DistributedOptimizer` share (`GradientReduction`).

Dense gradients go in one fused all-reduce per dtype; IndexedSlices (the gradient of an
embedding lookup) are gathered, as in Horovod, unless `sparse_as_dense=True`.
`gradient_predivide_factor=f` (with op=Average) divides by f before the sum and by size / f
after. Imports TensorFlow.
"""

from __future__ import annotations

import dataclasses
from typing import List, Sequence

import tensorflow as tf

from tfdist.horovod.collectives import (
    Average,
    Sum,
    check_process_set,
    grouped_allreduce,
    resolve_op,
)
from tfdist.horovod.compression import Compression
from tfdist.horovod.runtime import runtime

__all__ = ["DistributedGradientTape", "GradientReduction"]


@dataclasses.dataclass
class GradientReduction:
    """How gradients are reduced: op, compression, sparse_as_dense, predivide factor."""

    op: object = Average
    compression: object = Compression.none
    sparse_as_dense: bool = False
    gradient_predivide_factor: float = 1.0

    def __post_init__(self):
        self.op = resolve_op(self.op)
        factor = self.gradient_predivide_factor
        if not isinstance(factor, (int, float)) or isinstance(factor, bool) or factor <= 0:
            raise ValueError(
                f"gradient_predivide_factor must be a number > 0. Received: {factor!r}."
            )
        if factor != 1.0 and self.op is not Average:
            raise ValueError(
                f"gradient_predivide_factor={factor} needs op=hvd.Average (received op="
                f"{self.op!r}). HINT: drop gradient_predivide_factor, or use hvd.Average."
            )

    @tf.autograph.experimental.do_not_convert
    def __call__(self, gradients: Sequence) -> List:
        """The reduced gradients, None where a gradient is None."""
        gradients = list(gradients)
        if runtime().size == 1:
            return gradients
        present = [i for i, g in enumerate(gradients) if g is not None]
        values = []
        for i in present:
            grad = gradients[i]
            if self.sparse_as_dense and isinstance(grad, tf.IndexedSlices):
                grad = tf.convert_to_tensor(grad)
            values.append(grad)
        factor = self.gradient_predivide_factor
        if factor != 1.0:
            size = runtime().size
            reduced = grouped_allreduce(
                values,
                op=Sum,
                compression=self.compression,
                prescale_factor=1.0 / factor,
                postscale_factor=factor / size,
            )
        else:
            reduced = grouped_allreduce(values, op=self.op, compression=self.compression)
        out = list(gradients)
        for i, value in zip(present, reduced):
            out[i] = value
        return out


_TAPE_CLASSES = {}


def _distributed_tape_class(base):
    if base not in _TAPE_CLASSES:

        @tf.autograph.experimental.do_not_convert
        def gradient(self, target, sources, output_gradients=None, **kwargs):
            grads = base.gradient(self, target, sources, output_gradients, **kwargs)
            flat = tf.nest.flatten(grads, expand_composites=False)
            return tf.nest.pack_sequence_as(grads, self._tfdist_reduction(flat))

        _TAPE_CLASSES[base] = type(
            base.__name__, (base,), {"gradient": gradient, "__module__": base.__module__}
        )
    return _TAPE_CLASSES[base]


def DistributedGradientTape(  # noqa: N802  (Horovod's name)
    gradtape,
    device_dense: str = "",
    device_sparse: str = "",
    compression=Compression.none,
    sparse_as_dense: bool = False,
    op=Average,
    gradient_predivide_factor: float = 1.0,
    num_groups: int = 0,
    groups=None,
    process_set=None,
    scale_local_gradients: bool = True,
):
    """A `tf.GradientTape` whose `gradient()` returns gradients averaged over the processes.

    Wraps a tape that has recorded (or records) the computation: `tape =
    hvd.DistributedGradientTape(tape)`. The result is still a `tf.GradientTape`.
    `num_groups` and `groups` are accepted: every gradient of one dtype goes in one all-reduce.
    """
    check_process_set(process_set)
    if not isinstance(gradtape, tf.GradientTape):
        raise TypeError(
            f"DistributedGradientTape wraps a tf.GradientTape. Received: {gradtape!r}. "
            "HINT: with tf.GradientTape() as tape: ...; tape = hvd.DistributedGradientTape(tape)"
        )
    reduction = GradientReduction(op, compression, sparse_as_dense, gradient_predivide_factor)
    tape = object.__new__(_distributed_tape_class(type(gradtape)))
    tape.__dict__.update(gradtape.__dict__)
    tape._tfdist_reduction = reduction
    return tape

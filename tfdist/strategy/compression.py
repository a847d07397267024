"""Gradient compression: float32 values cast to bfloat16 or float16 for the all-reduce between
replicas, and back to float32 after it.

`make_strategy(..., gradient_compression="bf16" | "fp16" | None)` (or TFDIST_GRADIENT_COMPRESSION,
or `tfdist launch --gradient-compression`) halves the bytes every all-reduce of the strategy
carries. It acts where TensorFlow's strategies reduce, their cross-device ops, so it covers every
path that reduces through the strategy: Keras 3 and tf_keras `model.fit`, `tfdist.fit`, and
custom loops (`optimizer.apply_gradients`, `ReplicaContext.all_reduce`, `strategy.reduce`).

What is cast:
- dense float32 tensors of at least `MIN_ELEMENTS` elements (a statically known shape);
  scalars and small tensors (loss and metric totals, example counts, most biases) stay float32,
  so reported losses and metrics keep their precision and the bytes saved are unchanged;
- `tf.IndexedSlices` (sparse gradients of embeddings) stay uncompressed: their indices could not
  be compressed and their values are already only the rows touched.

float16 has 5 exponent bits (largest finite value 65504): the sum of the replicas' gradients
could overflow where each one does not. "fp16" therefore divides each value by the number of
replicas before the cast (the sum of the scaled values is then the mean, never larger than the
largest of them) and multiplies by it after the cast back. Values smaller than float16's smallest
subnormal (6e-8) times the number of replicas become 0. bfloat16 keeps float32's exponent range
(8 bits) with 8 bits of mantissa: no scaling, about 3 significant digits per value.

multi_worker_mirrored: TensorFlow's MultiWorkerMirroredStrategy takes no cross-device ops; its
`CollectiveAllReduce` casts through tfdist's fix record `tfdist.fixes.collectives.ALL_REDUCE`
(which also all-reduces a dense tensor of more than `PIECES_AFTER` pieces of `PIECE_BYTES`,
over 64 MiB, in 16 MiB pieces: TensorFlow's ring moves one large message at a fraction of the
speed of several smaller ones, docs/concepts/communication.md).
`compress_multi_worker` marks the strategy's object for it.
The collectives themselves are TensorFlow's (CollectiveReduceV2 has bfloat16 and float16 CPU and
GPU kernels in every supported release). mirrored: a `CrossDeviceOps` wrapper around the one tfdist
(or you) picked, passed through MirroredStrategy's public `cross_device_ops=`.

Which strategies take compression, and why the others do not, are their records'
(`tfdist.strategy.registry`: `Strategy.all_reduce`). Imports nothing of TensorFlow at import
time.
"""

from __future__ import annotations

from typing import Optional

from tfdist.fixes.collectives import (
    ALL_REDUCE,
    MIN_ELEMENTS,
    PIECE_BYTES,
    PIECES_AFTER,
    compress,
    compressible,
    decompress,
)
from tfdist.fixes.record import APPLIED
from tfdist.strategy.registry import STRATEGIES, WITH_ALL_REDUCE, quoted

__all__ = [
    "COMPRESSIONS",
    "MIN_ELEMENTS",
    "PIECES_AFTER",
    "PIECE_BYTES",
    "check_compression",
    "compress_multi_worker",
    "compressed_cross_device_ops",
    "compression_of",
    "patched_collectives",
]

# The values of `gradient_compression=`; None (or "none") is no compression.
COMPRESSIONS = ("bf16", "fp16")
_SPELLINGS = {
    "bf16": "bf16",
    "bfloat16": "bf16",
    "fp16": "fp16",
    "float16": "fp16",
    "half": "fp16",
    "none": None,
    "off": None,
    "": None,
}


def check_compression(strategy: Optional[str], value) -> Optional[str]:
    """`value` as "bf16", "fp16" or None; ValueError for anything else or another strategy.

    `strategy` None checks the spelling only (the CLI and the environment variable).
    """
    if value is None or value is False:
        return None
    key = value.strip().lower() if isinstance(value, str) else value
    if not isinstance(key, str) or key not in _SPELLINGS:
        raise ValueError(
            f"gradient_compression={value!r} is not a known compression. Choose one of: "
            "'bf16', 'fp16', or None (no compression). HINT: 'bf16' keeps float32's range "
            "and needs no scaling; 'fp16' is scaled by 1/replicas against overflow."
        )
    mode = _SPELLINGS[key]
    if mode is not None and strategy is not None and strategy not in WITH_ALL_REDUCE:
        record = STRATEGIES.get(strategy)
        why = f" ({record.without_all_reduce})" if record is not None else ""
        raise ValueError(
            f"gradient_compression={value!r} applies to the all-reduce of "
            f"{quoted(WITH_ALL_REDUCE)}, but the strategy is {strategy!r}{why}. HINT: drop "
            "gradient_compression= (or unset TFDIST_GRADIENT_COMPRESSION / "
            "--gradient-compression) for this strategy."
        )
    return mode


def compress_multi_worker(strategy, mode: Optional[str], piece_bytes: Optional[int] = None) -> None:
    """Makes `strategy` (a MultiWorkerMirroredStrategy) cast its all-reduces for `mode`, and
    all-reduce dense tensors larger than `piece_bytes` in pieces (None: unchanged; 0: whole).

    Both are the fix record `tfdist.fixes.collectives.ALL_REDUCE`, applied by make_strategy.
    Where it is not applied (turned off with TFDIST_KERAS_FIXES, or its TensorFlow targets
    changed), pieces are silently left out (the same values) and compression is refused.

    Raises:
        RuntimeError: `mode` is set, but the record is not applied, or this TensorFlow's
            strategy does not reduce through a CollectiveAllReduce; the message says which,
            instead of training uncompressed.
    """
    ops = patched_collectives(strategy, f"gradient_compression={mode!r}" if mode else None)
    if ops is None:
        return
    ops._tfdist_compression = mode
    if piece_bytes is not None:
        ops._tfdist_piece_bytes = int(piece_bytes)


def patched_collectives(strategy, needed_for: Optional[str]):
    """The CollectiveAllReduce of a MultiWorkerMirroredStrategy, once tfdist's fix record
    `tfdist.fixes.collectives.ALL_REDUCE` patches it (applying the fixes if need be).

    needed_for: what needs the patch (e.g. "gradient_compression='bf16'"), named in the
    error; None returns None instead of raising where the patch is not there.

    Raises:
        RuntimeError: `needed_for` is set, and the record is not applied, or this TensorFlow's
            strategy does not reduce through a CollectiveAllReduce; the message says which.
    """
    from tensorflow.python.distribute import cross_device_ops as cdo

    from tfdist.fixes import registry

    ops = getattr(strategy.extended, "_cross_device_ops", None)
    if not isinstance(ops, cdo.CollectiveAllReduce) or not hasattr(ops, "_group_size"):
        if needed_for is None:
            return None
        raise RuntimeError(
            f"{needed_for} needs MultiWorkerMirroredStrategy to reduce through TensorFlow's "
            "CollectiveAllReduce (strategy.extended._cross_device_ops), but this TensorFlow's "
            f"strategy has {type(ops).__name__}. HINT: leave {needed_for.split('=')[0]}= at its "
            "default with this TensorFlow release, and report it to tfdist."
        )
    registry.apply_fixes()
    status = registry.status(ALL_REDUCE.name) or next(
        s for s in registry.report() if s.name == ALL_REDUCE.name
    )
    if status.state != APPLIED:
        if needed_for is None:
            return None
        raise RuntimeError(
            f"{needed_for} on multi_worker_mirrored needs tfdist's fix {ALL_REDUCE.name!r} of "
            f"TensorFlow's CollectiveAllReduce, which is {status.state} ({status.reason}). "
            f"HINT: remove -{ALL_REDUCE.name} from TFDIST_KERAS_FIXES (or unset "
            f"TFDIST_KERAS_FIXES=0), or leave {needed_for.split('=')[0]}= at its default."
        )
    return ops


def compression_of(strategy) -> Optional[str]:
    """The compression a strategy made by tfdist applies (None when none)."""
    ops = getattr(getattr(strategy, "extended", None), "_cross_device_ops", None)
    return getattr(ops, "_tfdist_compression", None)


def compressed_cross_device_ops(inner, mode: str):
    """A `tf.distribute.CrossDeviceOps` that reduces like `inner`, with float32 values cast."""
    from tensorflow.python.distribute import cross_device_ops as cdo
    from tensorflow.python.distribute import distribute_utils
    from tensorflow.python.distribute import values as value_lib

    class CompressedCrossDeviceOps(cdo.CrossDeviceOps):
        """`inner`'s reductions of float32 values, cast for the copy between replicas."""

        def __init__(self):
            super().__init__()
            self.inner = inner
            self._tfdist_compression = mode

        def _pack(self, value):
            import tensorflow as tf

            if isinstance(value, value_lib.PerReplica):
                parts = list(value.values)
            else:
                parts = [value]
            if not all(compressible(p) for p in parts):
                return value, None
            n = len(parts)
            cast = []
            for p in parts:
                with tf.device(p.device):
                    cast.append(compress(p, mode, n))
            packed = (
                value_lib.PerReplica(cast) if isinstance(value, value_lib.PerReplica) else cast[0]
            )
            return packed, n

        def _unpack(self, result, n):
            import tensorflow as tf

            if n is None:
                return result
            if isinstance(result, value_lib.DistributedValues):
                back = []
                for v in result.values:
                    with tf.device(v.device):
                        back.append(decompress(v, mode, n))
                return distribute_utils.regroup(back, wrap_class=value_lib.Mirrored)
            with tf.device(result.device):
                return decompress(result, mode, n)

        def reduce_implementation(self, reduce_op, per_replica_value, destinations, options):
            packed, n = self._pack(per_replica_value)
            result = inner.reduce_implementation(reduce_op, packed, destinations, options)
            return self._unpack(result, n)

        def batch_reduce_implementation(self, reduce_op, value_destination_pairs, options):
            packed = [(self._pack(v), d) for v, d in value_destination_pairs]
            results = inner.batch_reduce_implementation(
                reduce_op, [(p, d) for (p, _), d in packed], options
            )
            return [self._unpack(r, n) for r, ((_, n), _) in zip(results, packed)]

        def broadcast_implementation(self, tensor, destinations):
            return inner.broadcast_implementation(tensor, destinations)

    return CompressedCrossDeviceOps()

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

multi_worker_mirrored: TensorFlow's MultiWorkerMirroredStrategy takes no cross-device ops, so
tfdist gives the `CollectiveAllReduce` object it built (`strategy.extended._cross_device_ops`,
checked to be one) the subclass below, which casts in `_all_reduce` (the method every reduction
of that strategy goes through: batched gradients, `ReplicaContext.all_reduce`, `strategy.reduce`).
The same subclass all-reduces a dense tensor larger than `PIECES_AFTER` times the ring's
`bytes_per_pack` (tfdist's default 4 MiB: tensors over 32 MiB) in pieces of a pack, one pack
each: TensorFlow's ring moves one large message at a fraction of the speed of several of a few
MiB (docs/concepts/communication.md).
The collectives themselves are TensorFlow's (CollectiveReduceV2 has bfloat16 and float16 CPU and
GPU kernels in every supported release). mirrored: a `CrossDeviceOps` wrapper around the one tfdist
(or you) picked, passed through MirroredStrategy's public `cross_device_ops=`.

Imports nothing of TensorFlow at import time.
"""

from __future__ import annotations

from typing import Optional

__all__ = [
    "COMPRESSIONS",
    "MIN_ELEMENTS",
    "check_compression",
    "compress_multi_worker",
    "compressed_cross_device_ops",
    "compression_of",
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
# Smaller tensors stay float32 (see the module docstring).
MIN_ELEMENTS = 1024
_STRATEGIES = ("mirrored", "multi_worker_mirrored")


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
    if mode is not None and strategy is not None and strategy not in _STRATEGIES:
        raise ValueError(
            f"gradient_compression={value!r} applies to the all-reduce of 'mirrored' and "
            f"'multi_worker_mirrored', but the strategy is {strategy!r}"
            + (
                " (variables live on the ps tasks; there is no all-reduce)"
                if strategy == "parameter_server"
                else " (one replica: nothing to all-reduce)"
                if strategy in ("one_device", "default")
                else ""
            )
            + ". HINT: drop gradient_compression= (or unset TFDIST_GRADIENT_COMPRESSION / "
            "--gradient-compression) for this strategy."
        )
    return mode


def _wire_dtype(mode: str):
    import tensorflow as tf

    return tf.bfloat16 if mode == "bf16" else tf.float16


def _compressible(value) -> bool:
    import tensorflow as tf

    if not isinstance(value, tf.Tensor) or value.dtype != tf.float32:
        return False  # IndexedSlices, other dtypes, variables passed as such
    elements = value.shape.num_elements()
    return elements is not None and elements >= MIN_ELEMENTS


def _compress(value, mode: str, group_size: int):
    import tensorflow as tf

    if mode == "fp16":
        value = value * (1.0 / group_size)
    return tf.cast(value, _wire_dtype(mode))


def _decompress(value, mode: str, group_size: int):
    import tensorflow as tf

    value = tf.cast(value, tf.float32)
    if mode == "fp16":
        value = value * float(group_size)
    return value


# A dense tensor of more than this many packs is all-reduced in pieces of a pack: on the ring,
# 128 MiB as 4 MiB pieces was 2.2x as fast as whole, 16 MiB as 4 MiB pieces no faster than
# whole once the split and concatenation are paid (benchmarks/bench_allreduce.py).
PIECES_AFTER = 8


def _pieces(value, limit: int) -> int:
    """How many pieces of at most `limit` bytes a dense tensor is cut into (1: not cut)."""
    import tensorflow as tf

    if not limit or not isinstance(value, tf.Tensor):
        return 1
    elements = value.shape.num_elements()
    if elements is None or elements * value.dtype.size <= PIECES_AFTER * limit:
        return 1
    return -(-elements * value.dtype.size // limit)


def _collective_class():
    from tensorflow.python.distribute import collective_util
    from tensorflow.python.distribute import cross_device_ops as cdo
    from tensorflow.python.util import nest

    global _COLLECTIVE
    if _COLLECTIVE is not None:
        return _COLLECTIVE

    class TunedCollectiveAllReduce(cdo.CollectiveAllReduce):
        """TensorFlow's CollectiveAllReduce, with float32 values cast for the wire and large
        tensors all-reduced in pieces."""

        _tfdist_compression: Optional[str] = None
        _tfdist_piece_bytes: int = 0

        def _all_reduce(self, reduce_op, value, replica_id, options):
            import tensorflow as tf

            mode = self._tfdist_compression
            flat = nest.flatten(value)
            marks = [mode is not None and _compressible(v) for v in flat]
            if not any(marks):
                if not any(_pieces(v, self._tfdist_piece_bytes) > 1 for v in flat):
                    return super()._all_reduce(reduce_op, value, replica_id, options)
                back = self._in_pieces(reduce_op, flat, replica_id, options)
                return nest.pack_sequence_as(value, back)
            # two batches: TensorFlow packs a batch into one concatenated tensor, one dtype
            with tf.device(self._devices[replica_id]):
                sent = [_compress(v, mode, self._group_size) for v, m in zip(flat, marks) if m]
            kept = [v for v, m in zip(flat, marks) if not m]
            reduced = self._in_pieces(reduce_op, sent, replica_id, options)
            with tf.device(self._devices[replica_id]):
                reduced = [_decompress(v, mode, self._group_size) for v in reduced]
            if kept:
                kept = self._in_pieces(reduce_op, kept, replica_id, options)
            back = [reduced.pop(0) if m else kept.pop(0) for m in marks]
            return nest.pack_sequence_as(value, back)

        def _in_pieces(self, reduce_op, values, replica_id, options):
            """All-reduces `values` (a list), tensors larger than the piece size in pieces,
            each piece its own pack; returns the list of results."""
            import tensorflow as tf

            limit = self._tfdist_piece_bytes
            counts = [_pieces(v, limit) for v in values]
            if max(counts, default=1) == 1:
                return list(super()._all_reduce(reduce_op, list(values), replica_id, options))
            sent = []
            with tf.device(self._devices[replica_id]):
                for v, count in zip(values, counts):
                    if count == 1:
                        sent.append(v)
                        continue
                    flat_v = tf.reshape(v, [-1])
                    size = flat_v.shape[0]
                    step = -(-size // count)
                    sizes = [step] * (size // step) + ([size % step] if size % step else [])
                    sent += tf.split(flat_v, sizes)
            # a pack closes once it holds more than bytes_per_pack: one piece a pack
            options = (options or collective_util.Options()).merge(
                collective_util.Options(bytes_per_pack=max(limit - 1, 1))
            )
            reduced = list(super()._all_reduce(reduce_op, sent, replica_id, options))
            out = []
            with tf.device(self._devices[replica_id]):
                for v, count in zip(values, counts):
                    parts, reduced = reduced[:count], reduced[count:]
                    out.append(parts[0] if count == 1 else tf.reshape(tf.concat(parts, 0), v.shape))
            return out

    _COLLECTIVE = TunedCollectiveAllReduce
    return _COLLECTIVE


_COLLECTIVE = None


def compress_multi_worker(strategy, mode: Optional[str], piece_bytes: Optional[int] = None) -> None:
    """Makes `strategy` (a MultiWorkerMirroredStrategy) cast its all-reduces for `mode`, and
    all-reduce dense tensors larger than `piece_bytes` in pieces (None: unchanged; 0: whole).

    Raises:
        RuntimeError: this TensorFlow's strategy does not reduce through a CollectiveAllReduce
            (the only form tfdist knows); the message says so instead of training uncompressed.
    """
    from tensorflow.python.distribute import cross_device_ops as cdo

    ops = getattr(strategy.extended, "_cross_device_ops", None)
    if not isinstance(ops, cdo.CollectiveAllReduce) or not hasattr(ops, "_group_size"):
        raise RuntimeError(
            "gradient_compression needs MultiWorkerMirroredStrategy to reduce through "
            "TensorFlow's CollectiveAllReduce (strategy.extended._cross_device_ops), but this "
            f"TensorFlow's strategy has {type(ops).__name__}. HINT: use gradient_compression="
            "None with this TensorFlow release, and report it to tfdist."
        )
    cls = _collective_class()
    if mode is None and not piece_bytes and type(ops) is not cls:
        return
    if type(ops) is not cls:
        ops.__class__ = cls  # keeps the launchers, keys and lock TensorFlow set up
    ops._tfdist_compression = mode
    if piece_bytes is not None:
        ops._tfdist_piece_bytes = int(piece_bytes)


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
            if not all(_compressible(p) for p in parts):
                return value, None
            n = len(parts)
            cast = []
            for p in parts:
                with tf.device(p.device):
                    cast.append(_compress(p, mode, n))
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
                        back.append(_decompress(v, mode, n))
                return distribute_utils.regroup(back, wrap_class=value_lib.Mirrored)
            with tf.device(result.device):
                return _decompress(result, mode, n)

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

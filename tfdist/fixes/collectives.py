"""TensorFlow's collective all-reduce: values cast for the wire, large tensors sent in pieces.

MultiWorkerMirroredStrategy takes no cross-device ops: it reduces through the
`CollectiveAllReduce` it builds itself, which has no compression (tensorflow/tensorflow#40468,
closed unanswered) and sends each pack as one message however large (on TensorFlow's gRPC ring a
128 MiB tensor as one message moves at two thirds of the speed of 16 MiB pieces;
docs/concepts/communication.md). The record below patches `CollectiveAllReduce._all_reduce`,
the method every reduction of that strategy goes through (batched gradients,
`ReplicaContext.all_reduce`, `strategy.reduce`). The patched method acts only on an object
`tfdist.strategy.compression.compress_multi_worker` marked; any other is reduced as upstream.

The casts (shared with the mirrored strategy's wrapper, `tfdist.strategy.compression`):
- dense float32 tensors of at least `MIN_ELEMENTS` elements (a statically known shape) go as
  bfloat16 or float16; scalars and small tensors (loss and metric totals, example counts, most
  biases) stay float32, so reported losses and metrics keep their precision;
- `tf.IndexedSlices` stay uncompressed (their indices could not be, their values are only the
  rows touched);
- "fp16" divides by the number of replicas before the cast and multiplies after it: the sum on
  the wire is then the mean, never larger than the largest value (float16 ends at 65504).

Nothing here imports TensorFlow at import time.
"""

from __future__ import annotations

from tfdist.fixes.record import Fix, Target

__all__ = [
    "ALL_REDUCE",
    "FIXES",
    "MIN_ELEMENTS",
    "PIECES_AFTER",
    "PIECE_BYTES",
    "compress",
    "compressible",
    "decompress",
    "piece_sizes",
    "pieces",
]

# Smaller tensors stay float32 (see above).
MIN_ELEMENTS = 1024
# On TensorFlow's gRPC ring a dense tensor of more than PIECES_AFTER pieces is all-reduced in
# pieces of PIECE_BYTES, one collective each: 128 MiB as 16 MiB pieces was 1.6x as fast as
# whole; up to 64 MiB, pieces of 4-16 MiB were no faster than whole once the split and the
# concatenation are paid (2 processes on loopback; benchmarks/bench_allreduce.py).
PIECE_BYTES = 16 << 20
PIECES_AFTER = 4


def wire_dtype(mode: str):
    import tensorflow as tf

    return tf.bfloat16 if mode == "bf16" else tf.float16


def compressible(value) -> bool:
    """A dense float32 tensor of at least MIN_ELEMENTS elements."""
    import tensorflow as tf

    if not isinstance(value, tf.Tensor) or value.dtype != tf.float32:
        return False  # IndexedSlices, other dtypes, variables passed as such
    elements = value.shape.num_elements()
    return elements is not None and elements >= MIN_ELEMENTS


def compress(value, mode: str, group_size: int):
    import tensorflow as tf

    if mode == "fp16":
        value = value * (1.0 / group_size)
    return tf.cast(value, wire_dtype(mode))


def decompress(value, mode: str, group_size: int):
    import tensorflow as tf

    value = tf.cast(value, tf.float32)
    if mode == "fp16":
        value = value * float(group_size)
    return value


def pieces(value, limit: int) -> int:
    """How many pieces of at most `limit` bytes a dense tensor is cut into (1: not cut)."""
    import tensorflow as tf

    if not limit or not isinstance(value, tf.Tensor):
        return 1
    elements = value.shape.num_elements()
    if elements is None or elements * value.dtype.size <= PIECES_AFTER * limit:
        return 1
    return -(-elements * value.dtype.size // limit)


def piece_sizes(elements: int, count: int) -> list:
    """`elements` split into `count` pieces that differ by at most one element, largest first."""
    return [elements // count + (1 if i < elements % count else 0) for i in range(count)]


ALL_REDUCE = Fix(
    name="multi_worker_all_reduce_compressed_in_pieces",
    summary=(
        "MultiWorkerMirroredStrategy cannot compress its all-reduce (it takes no cross-device "
        "ops), and its ring sends a large tensor as one message, far slower than in pieces."
    ),
    upstream="tensorflow/tensorflow#40468 (compression); none found for the pieces",
    strategies=("multi_worker_mirrored",),
    consequence=(
        "gradient_compression= is refused on multi_worker_mirrored, and a tensor over 64 MiB "
        "is all-reduced as one message (the same values, slower on the ring)."
    ),
    library="tensorflow",
)


@ALL_REDUCE.variant(
    "2.16",
    targets=[
        Target(
            "tensorflow.python.distribute.cross_device_ops:CollectiveAllReduce._all_reduce",
            ("self", "reduce_op", "value", "replica_id", "options"),
        ),
        Target("tensorflow.python.distribute.collective_util:Options.merge", ("self", "options")),
        "tensorflow.python.util.nest:flatten",
        "tensorflow.python.util.nest:pack_sequence_as",
    ],
)
def _fix_all_reduce():
    # CollectiveAllReduce._all_reduce (tensorflow/python/distribute/cross_device_ops.py) takes
    # one replica's nest of tensors, packs them by `options.bytes_per_pack` (a pack is closed
    # once it holds more, so a single tensor is never cut) and launches one CollectiveReduceV2
    # per pack. The patch casts the marked float32 tensors before that call and back after it
    # (one call for them, one for the rest: a pack is one dtype), and cuts a tensor of more
    # than PIECES_AFTER pieces into pieces, one pack each. Unmarked objects: unchanged.
    import tensorflow as tf
    from tensorflow.python.distribute import collective_util
    from tensorflow.python.distribute import cross_device_ops as cdo
    from tensorflow.python.util import nest

    cls = cdo.CollectiveAllReduce
    original = cls._all_reduce

    def through(self, reduce_op, values, replica_id, options):
        """The list `values` all-reduced: through Gloo where the object has a group
        (`tfdist.strategy.gloo`), else through TensorFlow's collectives."""
        gloo = getattr(self, "_tfdist_gloo", None)
        if gloo is None:
            return list(original(self, reduce_op, list(values), replica_id, options))
        with tf.device(self._devices[replica_id]):
            return gloo.reduce(
                list(values),
                reduce_op == tf.distribute.ReduceOp.MEAN,
                lambda rest: list(original(self, reduce_op, rest, replica_id, options)),
            )

    def in_pieces(self, reduce_op, values, replica_id, options, limit):
        """All-reduces the list `values`, each tensor of more than PIECES_AFTER pieces of
        `limit` bytes in pieces, one pack each; returns the list of results."""
        counts = [pieces(v, limit) for v in values]
        if max(counts, default=1) == 1:
            return through(self, reduce_op, values, replica_id, options)
        sent, smallest = [], limit
        with tf.device(self._devices[replica_id]):
            for v, count in zip(values, counts):
                if count == 1:
                    sent.append(v)
                    continue
                sizes = piece_sizes(v.shape.num_elements(), count)
                sent += tf.split(tf.reshape(v, [-1]), sizes)
                smallest = min(smallest, sizes[-1] * v.dtype.size)
        # TensorFlow closes a pack once it holds more than bytes_per_pack (walking the tensors
        # from the last): with less than the smallest piece, every piece is a pack of its own
        options = (options or collective_util.Options()).merge(
            collective_util.Options(bytes_per_pack=max(smallest - 1, 1))
        )
        reduced = through(self, reduce_op, sent, replica_id, options)
        out = []
        with tf.device(self._devices[replica_id]):
            for v, count in zip(values, counts):
                parts, reduced = reduced[:count], reduced[count:]
                out.append(parts[0] if count == 1 else tf.reshape(tf.concat(parts, 0), v.shape))
        return out

    def _all_reduce(self, reduce_op, value, replica_id, options):
        mode = getattr(self, "_tfdist_compression", None)
        gloo = getattr(self, "_tfdist_gloo", None)
        limit = 0 if gloo is not None else getattr(self, "_tfdist_piece_bytes", 0)
        if mode is None and not limit and gloo is None:
            return original(self, reduce_op, value, replica_id, options)
        flat = nest.flatten(value)
        marks = [mode is not None and compressible(v) for v in flat]
        if not any(marks):
            if gloo is None and not any(pieces(v, limit) > 1 for v in flat):
                return original(self, reduce_op, value, replica_id, options)
            back = in_pieces(self, reduce_op, flat, replica_id, options, limit)
            return nest.pack_sequence_as(value, back)
        with tf.device(self._devices[replica_id]):
            sent = [compress(v, mode, self._group_size) for v, m in zip(flat, marks) if m]
        kept = [v for v, m in zip(flat, marks) if not m]
        reduced = in_pieces(self, reduce_op, sent, replica_id, options, limit)
        with tf.device(self._devices[replica_id]):
            reduced = [decompress(v, mode, self._group_size) for v in reduced]
        if kept:
            kept = in_pieces(self, reduce_op, kept, replica_id, options, limit)
        back = [reduced.pop(0) if m else kept.pop(0) for m in marks]
        return nest.pack_sequence_as(value, back)

    cls._all_reduce = _all_reduce


FIXES = (ALL_REDUCE,)

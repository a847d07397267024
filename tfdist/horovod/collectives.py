"""Horovod's collectives over TensorFlow's: allreduce, grouped_allreduce, allgather, broadcast,
broadcast_variables, broadcast_object, allgather_object, alltoall and join.

Each works eagerly and inside `tf.function`, and every rank must call the same collectives in
the same order (as in Horovod; inside a function, TensorFlow's ordering token keeps them in
program order). In a job of one process they return their input (scaled as asked) without
communicating.

- A grouped all-reduce packs the tensors of one wire dtype into one buffer: one collective per
  dtype, whatever the number of tensors (Horovod's tensor fusion); a buffer of more than 64 MiB
  goes in pieces of 16 MiB, as the strategy's own all-reduce does.
- `allgather` takes tensors whose first dimension differs between ranks (it gathers the sizes,
  pads to the largest, gathers, then drops the padding).
- `broadcast` is an all-reduce of the root's tensor with zeros from the others: exact for every
  value, NaN and infinities included.
- dtypes TensorFlow's collectives lack travel as a wider integer and come back: bool, int8,
  int16, uint8 and uint16 as int32; uint32 as int64.

Imports TensorFlow.
"""

from __future__ import annotations

import pickle
import time
from typing import Any, List, Optional, Sequence

import tensorflow as tf

from tfdist.fixes.collectives import PIECE_BYTES, piece_sizes, pieces
from tfdist.horovod.compression import Compression
from tfdist.horovod.runtime import runtime
from tfdist.horovod.unsupported import unsupported

__all__ = [
    "Adasum",
    "Average",
    "Max",
    "Min",
    "Product",
    "Sum",
    "allgather",
    "allgather_object",
    "allreduce",
    "alltoall",
    "broadcast",
    "broadcast_object",
    "broadcast_variables",
    "grouped_allreduce",
    "join",
]


class ReduceOp:
    """A reduction of Horovod's: `Average`, `Sum`, `Min`, `Max`, `Product`, `Adasum`."""

    def __init__(self, name: str, merge_op: Optional[str]):
        self.name = name
        self.merge_op = merge_op

    def __repr__(self):
        return f"hvd.{self.name}"


Average = ReduceOp("Average", "Add")
Sum = ReduceOp("Sum", "Add")
Min = ReduceOp("Min", "Min")
Max = ReduceOp("Max", "Max")
Product = ReduceOp("Product", "Mul")
Adasum = ReduceOp("Adasum", None)
OPS = (Average, Sum, Min, Max, Product, Adasum)

_WIDER = {"bool": "int32", "int8": "int32", "int16": "int32", "uint8": "int32"}
_WIDER.update({"uint16": "int32", "uint32": "int64"})


def resolve_op(op, average=None) -> ReduceOp:
    """The ReduceOp for Horovod's `op=` / deprecated `average=` arguments (default Average)."""
    if op is not None and average is not None:
        raise ValueError(
            f"Give op= or average=, not both (received op={op!r}, average={average!r}). "
            "HINT: average= is deprecated in Horovod; use op=hvd.Average or op=hvd.Sum."
        )
    if op is None:
        return Sum if average is False else Average
    if op is Adasum:
        raise unsupported("op=hvd.Adasum", "op=hvd.Average")
    if op not in OPS:
        raise ValueError(
            f"op must be one of hvd.Average, hvd.Sum, hvd.Min, hvd.Max, hvd.Product. "
            f"Received: op={op!r}."
        )
    return op


def check_process_set(process_set) -> None:
    if process_set is not None and getattr(process_set, "process_set_id", 0) != 0:
        raise unsupported("process sets", "collectives over all the processes")


def _check_compression(compression) -> None:
    if not (hasattr(compression, "compress") and hasattr(compression, "decompress")):
        raise TypeError(
            f"compression must be a Compressor such as hvd.Compression.fp16. Received: "
            f"{compression!r}. HINT: hvd.Compression.none, hvd.Compression.fp16 or "
            "hvd.Compression.bf16."
        )


def _on_wire(tensor):
    wider = _WIDER.get(tensor.dtype.name)
    if wider is None:
        return tensor, None
    return tf.cast(tensor, wider), tensor.dtype


def _scale(tensor, factor):
    if factor == 1.0:
        return tensor
    if tensor.dtype.is_floating or tensor.dtype.is_complex:
        return tensor * tf.cast(factor, tensor.dtype)
    return tf.cast(tf.cast(tensor, tf.float64) * factor, tensor.dtype)


def _reduce_flat(flat, merge_op: str):
    """All-reduces a flat tensor: as one collective, or, past `PIECES_AFTER` pieces, in pieces
    of `PIECE_BYTES` (TensorFlow's ring moves several messages of 16 MiB faster than one large
    one: the strategy's own default, docs/concepts/communication.md)."""
    rt = runtime()
    count = pieces(flat, PIECE_BYTES)
    if count == 1:
        return rt.reduce(flat, merge_op)
    rt.count(flat)
    parts = tf.split(flat, piece_sizes(flat.shape.num_elements(), count))
    return tf.concat([rt.reduce(part, merge_op, counted=True) for part in parts], axis=0)


def _reduce_packed(tensors: List, merge_op: str) -> List:
    """All-reduces `tensors` packed by dtype: each dtype's tensors flattened and concatenated
    into one buffer (Horovod's tensor fusion), reduced by `_reduce_flat`."""
    out: List = [None] * len(tensors)
    by_dtype = {}
    for i, tensor in enumerate(tensors):
        by_dtype.setdefault(tensor.dtype, []).append(i)
    for _, indices in sorted(by_dtype.items(), key=lambda item: item[0].name):
        flats = [tf.reshape(tensors[i], [-1]) for i in indices]
        flat = flats[0] if len(flats) == 1 else tf.concat(flats, axis=0)
        sizes = [tf.size(tensors[i]) for i in indices]
        reduced = _reduce_flat(flat, merge_op)
        parts = tf.split(reduced, sizes) if len(indices) > 1 else [reduced]
        for i, piece in zip(indices, parts):
            out[i] = tf.reshape(piece, tf.shape(tensors[i]))
    return out


@tf.autograph.experimental.do_not_convert
def grouped_allreduce(
    tensors: Sequence,
    average=None,
    device_dense: str = "",
    device_sparse: str = "",
    compression=Compression.none,
    op=None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    process_set=None,
    ignore_name_scope: bool = False,
    name: Optional[str] = None,
):
    """All-reduces a list of tensors (IndexedSlices included) in one fused operation.

    `op=Average` (default) divides the sum by the number of processes; `prescale_factor`
    multiplies each tensor before, `postscale_factor` the result after. With a compression,
    floating tensors are cast for the wire and back.

    Returns:
        list: the reduced tensors, in order, with the input dtypes.
    """
    op = resolve_op(op, average)
    check_process_set(process_set)
    _check_compression(compression)
    rt = runtime()
    size = rt.size
    results: List = [None] * len(tensors)
    dense, contexts = [], []
    for i, value in enumerate(tensors):
        if isinstance(value, tf.IndexedSlices):
            results[i] = _allreduce_slices(value, op, prescale_factor, postscale_factor)
            continue
        tensor = tf.convert_to_tensor(value)
        average_first = op is Average and tensor.dtype.is_floating and size > 1
        wire = _scale(tensor, prescale_factor / size if average_first else prescale_factor)
        wire, compressed = compression.compress(wire) if size > 1 else (wire, None)
        wire, widened = _on_wire(wire)
        dense.append((i, wire))
        contexts.append((tensor.dtype, average_first, compressed, widened))
    if size > 1 and dense:
        reduced = _reduce_packed([wire for _, wire in dense], op.merge_op)
    else:
        reduced = [wire for _, wire in dense]
    for (i, _), value, (dtype, average_first, compressed, widened) in zip(dense, reduced, contexts):
        if widened is not None:
            value = tf.cast(value, widened)
        value = compression.decompress(value, compressed)
        if op is Average and not average_first and size > 1:
            if dtype.is_integer:
                value = tf.math.floordiv(value, tf.cast(size, dtype))
            else:
                value = value / tf.cast(size, dtype)
        results[i] = _scale(value, postscale_factor)
    return results


@tf.autograph.experimental.do_not_convert
def allreduce(
    tensor,
    average=None,
    device_dense: str = "",
    device_sparse: str = "",
    compression=Compression.none,
    op=None,
    prescale_factor: float = 1.0,
    postscale_factor: float = 1.0,
    name: Optional[str] = None,
    process_set=None,
    ignore_name_scope: bool = False,
):
    """All-reduces one tensor (or IndexedSlices) over every process: see `grouped_allreduce`."""
    return grouped_allreduce(
        [tensor],
        average=average,
        compression=compression,
        op=op,
        prescale_factor=prescale_factor,
        postscale_factor=postscale_factor,
        process_set=process_set,
    )[0]


@tf.autograph.experimental.do_not_convert
def _allreduce_slices(slices, op, prescale_factor, postscale_factor):
    """IndexedSlices, as Horovod: the values and indices of every process, gathered."""
    if op not in (Average, Sum):
        raise ValueError(
            f"IndexedSlices (sparse gradients) reduce with hvd.Average or hvd.Sum only, not "
            f"{op!r}. HINT: convert it to a dense tensor first (tf.convert_to_tensor)."
        )
    size = runtime().size
    values = allgather(_scale(slices.values, prescale_factor))
    indices = allgather(slices.indices)
    factor = postscale_factor / size if op is Average else postscale_factor
    return tf.IndexedSlices(_scale(values, factor), indices, slices.dense_shape)


@tf.autograph.experimental.do_not_convert
def allgather(
    tensor, name: Optional[str] = None, ignore_name_scope: bool = False, process_set=None
):
    """Concatenates every process's tensor along the first dimension, in rank order. The first
    dimensions may differ between processes; the others must agree."""
    check_process_set(process_set)
    tensor = tf.convert_to_tensor(tensor)
    if tensor.shape.rank == 0:
        raise ValueError(
            "allgather needs a tensor of rank 1 or more; received a scalar. HINT: "
            "hvd.allgather(tf.reshape(x, [1]))."
        )
    rt = runtime()
    if rt.size == 1:
        return tensor
    wire, widened = _on_wire(tensor)
    counts = rt.gather(tf.shape(wire, out_type=tf.int64)[:1])
    longest = tf.reduce_max(counts)
    rest = tf.shape(wire, out_type=tf.int64)[1:]
    padding = tf.concat(
        [
            [[0, longest - tf.shape(wire, out_type=tf.int64)[0]]],
            tf.zeros([tf.size(rest), 2], tf.int64),
        ],
        axis=0,
    )
    gathered = rt.gather(tf.pad(wire, padding))
    gathered = tf.reshape(gathered, tf.concat([[rt.size, longest], rest], axis=0))
    out = tf.boolean_mask(gathered, tf.sequence_mask(counts, longest))
    return out if widened is None else tf.cast(out, widened)


@tf.autograph.experimental.do_not_convert
def broadcast(
    tensor,
    root_rank: int,
    name: Optional[str] = None,
    ignore_name_scope: bool = False,
    process_set=None,
):
    """The tensor of `root_rank`, on every process (the shapes must agree)."""
    return _broadcast_many([tensor], root_rank, process_set)[0]


def _check_root(root_rank) -> int:
    size = runtime().size
    if not isinstance(root_rank, int) or isinstance(root_rank, bool) or not 0 <= root_rank < size:
        raise ValueError(
            f"root_rank must be a rank of this job, 0 to {size - 1}. Received: "
            f"root_rank={root_rank!r}. HINT: hvd.broadcast(x, root_rank=0)."
        )
    return root_rank


@tf.autograph.experimental.do_not_convert
def _broadcast_many(tensors: Sequence, root_rank: int, process_set=None) -> List:
    check_process_set(process_set)
    _check_root(root_rank)
    rt = runtime()
    tensors = [tf.convert_to_tensor(t) for t in tensors]
    if rt.size == 1:
        return tensors
    mine = rt.ranks.rank == root_rank
    wires = []
    for tensor in tensors:
        wire, widened = _on_wire(tensor)
        wires.append((wire if mine else tf.zeros_like(wire), widened))
    reduced = _reduce_packed([wire for wire, _ in wires], "Add")
    return [
        value if widened is None else tf.cast(value, widened)
        for value, (_, widened) in zip(reduced, wires)
    ]


@tf.autograph.experimental.do_not_convert
def broadcast_variables(variables, root_rank: int, process_set=None, inplace: bool = False):
    """Assigns every variable the value it has on `root_rank` (one collective per dtype).

    Returns:
        The grouped assign operations inside a `tf.function`; None eagerly.
    """
    variables = list(variables)
    if not variables:
        return None
    values = _broadcast_many(
        [v.read_value() if hasattr(v, "read_value") else v for v in variables],
        root_rank,
        process_set,
    )
    assigns = [v.assign(value) for v, value in zip(variables, values)]
    if tf.executing_eagerly():
        return None
    # Keras 3.3-3.x variables return None from assign (the assign still runs, in order)
    return tf.group(*[a for a in assigns if a is not None])


def _bytes_to_words(data: bytes):
    import numpy as np

    padded = data + b"\0" * (-len(data) % 4)
    return np.frombuffer(padded, dtype=np.int32)


def _eager_only(what: str) -> None:
    if not tf.executing_eagerly():
        raise RuntimeError(
            f"{what} works eagerly only (it pickles a Python object). HINT: call it outside "
            "tf.function, e.g. before training."
        )


def broadcast_object(
    obj: Any, root_rank: int = 0, session=None, name=None, process_set=None
) -> Any:
    """The Python object of `root_rank` (pickled), on every process. Eager only."""
    _eager_only("broadcast_object")
    check_process_set(process_set)
    _check_root(root_rank)
    rt = runtime()
    if rt.size == 1:
        return obj
    data = pickle.dumps(obj) if rt.ranks.rank == root_rank else b""
    length = int(broadcast(tf.constant([len(data)], tf.int64), root_rank).numpy()[0])
    words = _bytes_to_words(data) if data else None
    count = (length + 3) // 4
    sent = broadcast(
        tf.constant(words) if words is not None else tf.zeros([count], tf.int32), root_rank
    )
    return pickle.loads(sent.numpy().tobytes()[:length])


def allgather_object(obj: Any, session=None, name=None, process_set=None) -> List[Any]:
    """Every process's Python object (pickled), as a list in rank order. Eager only."""
    _eager_only("allgather_object")
    check_process_set(process_set)
    rt = runtime()
    if rt.size == 1:
        return [obj]
    data = pickle.dumps(obj)
    lengths = allgather(tf.constant([len(data)], tf.int64)).numpy().tolist()
    words = allgather(tf.constant(_bytes_to_words(data))).numpy().tobytes()
    out, start = [], 0
    for length in lengths:
        out.append(pickle.loads(words[start : start + length]))
        start += length + (-length % 4)
    return out


@tf.autograph.experimental.do_not_convert
def alltoall(tensor, splits=None, name=None, ignore_name_scope: bool = False, process_set=None):
    """Sends rank j the j-th part of `tensor` (first dimension split by `splits`, or in equal
    parts), and returns what every rank sent this one, concatenated in rank order.

    Returns:
        As Horovod: without `splits`, the tensor of the rows received; with `splits`, the pair
        (tensor, received_splits), received_splits an int32 vector of how many rows came from
        each rank.
    """
    received, received_splits = _alltoall(tensor, splits, process_set)
    return received if splits is None else (received, received_splits)


def _alltoall(tensor, splits, process_set):
    """(rows received, int32 row count from each rank) of `alltoall`."""
    check_process_set(process_set)
    tensor = tf.convert_to_tensor(tensor)
    rt = runtime()
    size, me = rt.size, rt.ranks.rank
    rows = tf.shape(tensor, out_type=tf.int64)[0]
    if splits is None:
        if tensor.shape[0] is not None and tensor.shape[0] % size:
            raise ValueError(
                f"alltoall without splits divides the first dimension ({tensor.shape[0]}) in "
                f"{size} equal parts, which it cannot. HINT: pass splits=[rows for rank 0, ...]."
            )
        splits = tf.fill([size], rows // size)
    splits = tf.cast(tf.convert_to_tensor(splits), tf.int64)
    if splits.shape.rank != 1 or (splits.shape[0] is not None and splits.shape[0] != size):
        raise ValueError(
            f"splits must be a vector of {size} row counts, one per rank. Received shape "
            f"{splits.shape}."
        )
    if size == 1:
        return tensor, tf.cast(splits, tf.int32)
    table = tf.reshape(allgather(tf.reshape(splits, [1, size])), [size, size])
    everything = allgather(tensor)
    received = table[:, me]
    block_starts = tf.math.cumsum(tf.reduce_sum(table, axis=1), exclusive=True)
    starts = block_starts + tf.reduce_sum(table[:, :me], axis=1)
    indices = tf.ragged.range(starts, starts + received).flat_values
    return tf.gather(everything, indices), tf.cast(received, tf.int32)


@tf.autograph.experimental.do_not_convert
def join(device: str = "") -> Any:
    """Waits until every process has called `join`; returns the rank that came last.

    Unlike Horovod's, a process that joined does not stand in (with zeros) for the
    all-reduces its peers still run: every rank must run the same collectives before joining.
    """
    rt = runtime()
    if rt.size == 1:
        return tf.constant(0, tf.int32)
    arrival = tf.constant([time.time()], tf.float64)
    times = allgather(arrival)
    return tf.cast(tf.argmax(times), tf.int32)

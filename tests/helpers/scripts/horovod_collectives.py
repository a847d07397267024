"""A Horovod-API job script for tests/cluster/test_horovod_jobs.py: every collective, eagerly
and in tf.function, each result checked against numpy in every process.

Run by `tfdist horovodrun -np N python horovod_collectives.py OUT_DIR`; each rank writes
OUT_DIR/rank<R>.json with what it checked and the bytes it put on the wire.
"""

import json
import os
import sys

import horovod.tensorflow as hvd
import numpy as np

hvd.init()

import tensorflow as tf  # noqa: E402

r, n = hvd.rank(), hvd.size()
checked = []


def same(name, got, want):
    got = got.numpy() if hasattr(got, "numpy") else np.asarray(got)
    np.testing.assert_allclose(got, np.asarray(want), rtol=1e-6, err_msg=name)
    checked.append(name)


def each_rank(fn):
    return [fn(k) for k in range(n)]


x = tf.constant([1.0, -2.0, 3.0]) * (r + 1)
rows = each_rank(lambda k: np.array([1.0, -2.0, 3.0]) * (k + 1))
same("allreduce average", hvd.allreduce(x), np.mean(rows, axis=0))
same("allreduce sum", hvd.allreduce(x, op=hvd.Sum), np.sum(rows, axis=0))
same("allreduce min", hvd.allreduce(x, op=hvd.Min), np.min(rows, axis=0))
same("allreduce max", hvd.allreduce(x, op=hvd.Max), np.max(rows, axis=0))
same("allreduce product", hvd.allreduce(x, op=hvd.Product), np.prod(rows, axis=0))
same(
    "allreduce pre/postscale",
    hvd.allreduce(x, op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0),
    1.5 * np.sum(rows, axis=0),
)
same("allreduce average=False", hvd.allreduce(x, average=False), np.sum(rows, axis=0))
same(
    "allreduce int32 average (floor)",
    hvd.allreduce(tf.constant([7, 9]) * (r + 1)),
    np.sum(each_rank(lambda k: np.array([7, 9]) * (k + 1)), axis=0) // n,
)
same("allreduce uint8 sum", hvd.allreduce(tf.constant([r], tf.uint8), op=hvd.Sum), [sum(range(n))])
same(
    "allreduce fp16 compression",
    hvd.allreduce(x, compression=hvd.Compression.fp16),
    np.mean(rows, axis=0),
)
# 72 MiB: past 64 MiB the buffer goes in 16 MiB pieces, which must come back in order
ramp = np.arange(18 * 2**20, dtype=np.int64) % 1000
big = hvd.allreduce(tf.constant(ramp, tf.float32) + r, op=hvd.Sum)
same("allreduce 72 MiB in pieces", big, n * ramp + sum(range(n)))
grouped = hvd.grouped_allreduce(
    [x, tf.ones([2, 2]) * r, tf.constant([5], tf.int64), tf.constant([0.5], tf.float64)],
    op=hvd.Sum,
)
same("grouped 0", grouped[0], np.sum(rows, axis=0))
same("grouped 1", grouped[1], np.ones([2, 2]) * sum(range(n)))
same("grouped int64", grouped[2], [5 * n])
same("grouped float64", grouped[3], [0.5 * n])
assert [t.dtype for t in grouped] == [tf.float32, tf.float32, tf.int64, tf.float64]

same(
    "allgather ragged",
    hvd.allgather(tf.fill([r + 1, 2], float(r))),
    np.concatenate(each_rank(lambda k: np.full([k + 1, 2], float(k)))),
)
same("allgather bool", hvd.allgather(tf.constant([r % 2 == 0])), [k % 2 == 0 for k in range(n)])
same(
    "broadcast",
    hvd.broadcast(tf.constant([r, 2 * r], tf.int8), root_rank=n - 1),
    [n - 1, 2 * n - 2],
)
same(
    "broadcast nan and inf",
    hvd.broadcast(tf.constant([np.nan, np.inf, -0.0]) if r == 0 else tf.zeros([3]), 0),
    [np.nan, np.inf, 0.0],
)
assert hvd.broadcast_object({"rank": r, "text": "é" * r}, root_rank=1) == {"rank": 1, "text": "é"}
checked.append("broadcast_object")
assert hvd.allgather_object(("r", r)) == [("r", k) for k in range(n)]
checked.append("allgather_object")

# alltoall: rank r sends k+1 rows to rank k, each row holding (r, k)
splits = [k + 1 for k in range(n)]
send = np.concatenate([np.full([k + 1, 2], [r, k]) for k in range(n)]).astype("int32")
received, received_splits = hvd.alltoall(tf.constant(send), splits=splits)
same("alltoall rows", received, np.concatenate([np.full([r + 1, 2], [k, r]) for k in range(n)]))
same("alltoall splits", received_splits, [r + 1] * n)
received = hvd.alltoall(tf.range(2 * n) + 100 * r)  # without splits: the tensor alone
assert received.dtype == tf.int32 and received_splits.dtype == tf.int32
same(
    "alltoall equal",
    received,
    np.concatenate([np.arange(2 * r, 2 * r + 2) + 100 * k for k in range(n)]),
)

variable = tf.Variable([float(r), 7.0])
counter = tf.Variable(r, dtype=tf.int64)
hvd.broadcast_variables([variable, counter], root_rank=1)
same("broadcast_variables", variable, [1.0, 7.0])
same("broadcast_variables int64", counter, 1)


@tf.function
def in_a_function(v):
    a = hvd.allreduce(v)
    b = hvd.allgather(tf.reshape(v, [-1, 1]))
    c = hvd.broadcast(v, root_rank=0)
    return a, b, c


for i in range(3):  # the same function thrice: fresh instance keys each call
    a, b, c = in_a_function(x + i)
    same(f"tf.function allreduce {i}", a, np.mean(rows, axis=0) + i)
    same(f"tf.function allgather {i}", b, np.concatenate(rows).reshape(-1, 1) + i)
    same(f"tf.function broadcast {i}", c, rows[0] + i)

with tf.GradientTape() as tape:
    loss = tf.reduce_sum(variable * variable) * (r + 1)
tape = hvd.DistributedGradientTape(tape)
assert isinstance(tape, tf.GradientTape)
same(
    "DistributedGradientTape",
    tape.gradient(loss, [variable])[0],
    2 * variable.numpy() * np.mean(range(1, n + 1)),
)

table = tf.Variable(tf.ones([6, 2]))
expected = np.zeros([6, 2])
for k in range(n):  # rank k's gradient: k + 1 in rows k and k + 1
    expected[[k, k + 1]] += (k + 1) / n
for sparse_as_dense in (False, True):
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.gather(table, [r, r + 1])) * (r + 1)
    tape = hvd.DistributedGradientTape(tape, sparse_as_dense=sparse_as_dense)
    (grad,) = tape.gradient(loss, [table])
    assert isinstance(grad, tf.IndexedSlices) != sparse_as_dense, type(grad)
    same(
        f"embedding gradient, sparse_as_dense={sparse_as_dense}",
        tf.convert_to_tensor(grad),
        expected,
    )

before = hvd.payload_bytes()
hvd.allreduce(tf.zeros([1000]))
plain = hvd.payload_bytes() - before
before = hvd.payload_bytes()
hvd.allreduce(tf.zeros([1000]), compression=hvd.Compression.fp16)
fp16 = hvd.payload_bytes() - before
assert (plain, fp16) == (4000, 2000), (plain, fp16)
checked.append("payload halved by fp16")

last = int(hvd.join())
assert 0 <= last < n
checked.append("join")
hvd.barrier()

with open(os.path.join(sys.argv[1], f"rank{r}.json"), "w") as f:
    json.dump(
        {
            "rank": r,
            "size": n,
            "local_rank": hvd.local_rank(),
            "local_size": hvd.local_size(),
            "cross_rank": hvd.cross_rank(),
            "cross_size": hvd.cross_size(),
            "environment_rank": os.environ.get("HOROVOD_RANK"),
            "checked": checked,
        },
        f,
    )
print(f"rank {r}: {len(checked)} checks passed")

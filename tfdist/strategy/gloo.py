"""The Gloo transport: multi_worker_mirrored's all-reduce over torch.distributed's Gloo backend.

`make_strategy("multi_worker_mirrored", communication="gloo")` (or TFDIST_COMMUNICATION=gloo, or
`tfdist launch --communication gloo`) keeps TensorFlow's strategy, its variables, its replicas
and its collectives for everything else, and sends the dense tensors of its all-reduces through
Gloo, the CPU collective library behind PyTorch's CPU backend and Horovod's. On TensorFlow's
gRPC ring a 2-process CPU all-reduce reaches a fraction of what the loopback carries;
Gloo's ring reaches most of it (benchmarks/bench_allreduce.py, docs/concepts/communication.md).

How it is wired:
- **The group**: one `ProcessGroupGloo` per process over the job's chief and workers, ranked in
  TensorFlow's order (the chief, then the workers by index). Its store is a `TCPStore` the
  coordination leader serves on a port it binds on its own address (port 0: the kernel picks a
  free one); the address goes to the others through TensorFlow's coordination service (its
  key-value store), so the job needs no port beyond its cluster's and no `mpiexec`. Each task's
  Gloo device binds to its own address from the cluster: a local job stays on the loopback.
  Nothing is started at import time, and torch is imported only here.
- **The all-reduce**: the patched `CollectiveAllReduce._all_reduce` (the fix record
  `tfdist.fixes.collectives.ALL_REDUCE`, which also casts for `gradient_compression=`) hands
  this module one replica's dense tensors. Each dtype's tensors are cut, from the last, into
  buckets of about `BUCKET_BYTES` (a tensor is never cut), and each bucket (flattened and
  concatenated: a buffer no one else holds; a bucket of one tensor is copied first, it may be a
  variable's) goes to one stateful `tf.numpy_function`, which sums it in place with Gloo and
  gives the same buffer back (TensorFlow takes it without a copy); MEAN divides by the group's
  size after the sum, as TensorFlow's collective does. TensorFlow runs a graph's stateful Python
  functions in the order they were traced (automatic control dependencies), and every worker
  traces the same program, so the workers call Gloo in the same order. The buckets are traced
  last tensors first: a model's gradients come in the order of its variables, which the
  backward pass computes from the last, so the sum of the last layers' gradients runs while
  the backward pass computes the first layers'. `tf.IndexedSlices` (sparse gradients) stay on
  TensorFlow's collectives (an all-gather).
- **Waits**: every Gloo call ends after the group's timeout (`timeout_seconds=` /
  TFDIST_COLLECTIVE_TIMEOUT, else `DEFAULT_TIMEOUT`) with an error naming the transport; a peer
  that dies closes its connections, and its peers' calls fail at once.

One replica per process, on its CPU: Gloo reduces between processes. A worker with GPUs is
refused at `make_strategy` (`tfdist.strategy.communication.collective_options`: NCCL is the
transport between GPUs).
"""

from __future__ import annotations

import datetime
import socket
from typing import Optional

from tfdist.cluster import ClusterSpec

__all__ = [
    "DEFAULT_TIMEOUT",
    "EXTRA",
    "INSTALL",
    "GlooGroup",
    "attach",
    "connect",
    "dense",
    "group_of",
    "join",
    "require_torch",
]

EXTRA = "tfdist[gloo]"
# The CPU build of torch comes from PyTorch's own index (PyPI's default build is CUDA's, GBs).
INSTALL = "pip install 'tfdist[gloo]' --extra-index-url https://download.pytorch.org/whl/cpu"
# Seconds one Gloo call may wait for its peers when no collective timeout is set.
DEFAULT_TIMEOUT = 1800.0
STORE_KEY = "tfdist/gloo/store"
# TensorFlow shares (does not copy) a returned numpy buffer aligned to this (EIGEN_MAX_ALIGN_BYTES)
ALIGN = 64
# The bytes of one Gloo call, at least (the first tensors' bucket may hold less; a tensor is
# never cut): small enough that the last layers' sum starts before the backward pass ends,
# large enough that a call's fixed cost stays small beside its bytes.
BUCKET_BYTES = 4 << 20


def require_torch():
    """`torch.distributed`, with Gloo; ImportError naming the extra and its install line."""
    import os

    # c10d's start-up warnings (client socket host names) are noise for a TensorFlow job
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    try:
        import torch.distributed as dist
    except ImportError as err:
        raise ImportError(
            f"communication='gloo' needs PyTorch's torch.distributed (the extra {EXTRA}), "
            f"which cannot be imported here: {err}. HINT: {INSTALL} (PyTorch's CPU build, "
            "about 190 MB), or use communication='ring'."
        ) from err
    if not dist.is_available() or not dist.is_gloo_available():
        raise ImportError(
            "communication='gloo' needs torch.distributed with its Gloo backend, which this "
            f"build of torch lacks. HINT: {INSTALL}, or use communication='ring'."
        )
    return dist


def _tasks(cluster: ClusterSpec) -> list:
    """The job's chief and workers as (job, index, address), in TensorFlow's rank order."""
    jobs = cluster.cluster
    return [
        (job, index, address)
        for job in ("chief", "worker")
        for index, address in enumerate(jobs.get(job, []))
    ]


def _host(address: str) -> str:
    return address.rpartition(":")[0].strip("[]")


class GlooGroup:
    """The job's Gloo process group, as this process sees it."""

    def __init__(self, group, rank: int, size: int, timeout: float, keep=()):
        self.group = group
        self.rank = rank
        self.size = size
        self.timeout = timeout
        self.bucket_bytes = BUCKET_BYTES
        self._keep = keep  # the store (and, on the leader, its listening socket)

    def all_reduce_(self, array, bfloat16: bool = False):
        """Sums the numpy `array` in place over the group; returns it.

        bfloat16: `array` holds bfloat16 values as int16 bits (numpy has no bfloat16).
        """
        import torch

        tensor = torch.from_numpy(array)
        if bfloat16:
            tensor = tensor.view(torch.bfloat16)
        try:
            self.group.allreduce([tensor]).wait()
        except RuntimeError as err:
            raise RuntimeError(
                f"the Gloo all-reduce of {array.nbytes} bytes (rank {self.rank} of "
                f"{self.size}) failed: {err}. A peer stopped, or did not call the same "
                f"all-reduce within {self.timeout:g} s (timeout_seconds= / "
                "TFDIST_COLLECTIVE_TIMEOUT)."
            ) from err
        return array

    def _reduce_pack(self, pack, fresh: bool):
        """One flat tensor summed over the group, in one stateful Python call.

        fresh: the buffer is this pack's alone (a concatenation), so it is summed in place.
        """
        import numpy as np
        import tensorflow as tf

        bf16 = pack.dtype == tf.bfloat16
        sent = tf.bitcast(pack, tf.int16) if bf16 else pack

        def call(array):
            if not fresh or not array.flags.writeable:
                array = _aligned_copy(np, array)
            return self.all_reduce_(array, bfloat16=bf16)

        out = tf.numpy_function(call, [sent], sent.dtype, stateful=True, name="GlooAllReduce")
        out.set_shape(sent.shape)
        return tf.bitcast(out, tf.bfloat16) if bf16 else out

    def reduce(self, values: list, mean: bool, others) -> list:
        """`values` summed (or averaged) over the group, each in its shape.

        The dense ones go through Gloo, by dtype in the order the dtypes first appear, each
        dtype's in buckets from its last tensor (`buckets`; the same on every worker);
        `others(list) -> list` reduces the rest (IndexedSlices, other dtypes) through
        TensorFlow.
        """
        out = [None] * len(values)
        rest = [i for i, v in enumerate(values) if not dense(v)]
        if rest:
            for i, reduced in zip(rest, others([values[i] for i in rest])):
                out[i] = reduced
        by_dtype = {}
        for i, v in enumerate(values):
            if out[i] is None:
                by_dtype.setdefault(v.dtype, []).append(i)
        for dtype, indices in by_dtype.items():
            sizes = [values[i].shape.num_elements() for i in indices]
            if any(size is None for size in sizes):  # one bucket of sizes known when run
                cuts = [indices]
            else:
                nbytes = [size * dtype.size for size in sizes]
                cuts = [[indices[k] for k in cut] for cut in buckets(nbytes, self.bucket_bytes)]
            for cut in cuts:
                for i, reduced in zip(cut, self._reduce_bucket([values[i] for i in cut], mean)):
                    out[i] = reduced
        return out

    def _reduce_bucket(self, values: list, mean: bool) -> list:
        """Tensors of one dtype summed (or averaged) in one Gloo call, each in its shape."""
        import tensorflow as tf

        dtype = values[0].dtype
        sizes = [v.shape.num_elements() for v in values]
        if any(size is None for size in sizes):
            sizes = [tf.size(v) for v in values]
        parts = [tf.reshape(v, [-1]) for v in values]
        pack = parts[0] if len(parts) == 1 else tf.concat(parts, 0)
        reduced = self._reduce_pack(pack, fresh=len(parts) > 1)
        if mean and dtype.is_floating:  # TensorFlow's collective divides after the sum
            reduced = reduced / tf.cast(self.size, dtype)
        elif mean:
            reduced = reduced // self.size
        pieces = [reduced] if len(parts) == 1 else tf.split(reduced, sizes)
        out = []
        for v, piece in zip(values, pieces):
            piece = tf.reshape(piece, tf.shape(v))
            piece.set_shape(v.shape)
            out.append(piece)
        return out


def buckets(nbytes: list, limit: int) -> list:
    """The positions of tensors of `nbytes` bytes each, cut from the last into buckets of at
    least `limit` bytes (the first tensors' bucket may hold less): a list of buckets, the last
    tensors' first, each its positions in ascending order: `buckets([8, 8, 8, 16], 16)` is
    `[[3], [1, 2], [0]]`.
    """
    out, bucket, held = [], [], 0
    for position in reversed(range(len(nbytes))):
        bucket.insert(0, position)
        held += nbytes[position]
        if held >= limit:
            out.append(bucket)
            bucket, held = [], 0
    if bucket:
        out.append(bucket)
    return out


def _aligned_copy(np, array):
    """A copy of `array` at a 64-byte boundary: TensorFlow then takes the returned buffer as
    it is (it copies an array that is not aligned for its kernels)."""
    raw = np.empty(array.nbytes + ALIGN, np.uint8)
    start = -raw.ctypes.data % ALIGN
    out = raw[start : start + array.nbytes].view(array.dtype).reshape(array.shape)
    np.copyto(out, array)
    return out


def connect(
    cluster: ClusterSpec, timeout: Optional[float] = None, join_timeout: float = 60.0
) -> GlooGroup:
    """Joins this task to the job's Gloo group (TensorFlow's coordination service must run).

    Waits at most `join_timeout` seconds for the peers to join; each all-reduce then waits at
    most `timeout` seconds (None or 0: DEFAULT_TIMEOUT).
    """
    dist = require_torch()
    from tfdist.strategy.devices import context

    timeout = float(timeout or DEFAULT_TIMEOUT)
    tasks = _tasks(cluster)
    rank = next(
        i
        for i, (job, index, _) in enumerate(tasks)
        if (job, index) == (cluster.task_type, cluster.task_index)
    )
    own_host = _host(tasks[rank][2])
    join = datetime.timedelta(seconds=join_timeout)
    keep = []
    if rank == 0:
        listener = socket.create_server((own_host, 0), backlog=len(tasks) * 4)
        port = listener.getsockname()[1]
        store = dist.TCPStore(
            own_host,
            port,
            len(tasks),
            True,
            join,
            wait_for_workers=False,
            master_listen_fd=listener.fileno(),
        )
        keep.append(listener)
        context().set_config_key_value(STORE_KEY, f"{own_host}:{port}")
    else:
        where = context().get_config_key_value(STORE_KEY, int(join_timeout * 1000))
        host, _, port = where.rpartition(":")
        store = dist.TCPStore(host, int(port), len(tasks), False, join)
    keep.append(store)
    options = dist.ProcessGroupGloo._Options()
    options._devices = [dist.ProcessGroupGloo.create_device(hostname=own_host)]
    options._timeout = datetime.timedelta(seconds=timeout)
    group = dist.ProcessGroupGloo(store, rank, len(tasks), options)
    return GlooGroup(group, rank, len(tasks), timeout, keep=tuple(keep))


def join(cluster: ClusterSpec, timeout: Optional[float], startup_timeout: float) -> GlooGroup:
    """`connect`, guarded: SIGTERM, or `startup_timeout` + 30 s, ends this task (the join
    waits inside TensorFlow and torch, where Python's signal handlers do not run)."""
    from tfdist.strategy.peers import guarded

    with guarded(cluster.task, "joined the Gloo group", startup_timeout + 30):
        return connect(cluster, timeout, join_timeout=startup_timeout)


def attach(strategy, group: GlooGroup) -> None:
    """Makes the MultiWorkerMirroredStrategy `strategy` send its dense all-reduces through
    `group` (the fix record `tfdist.fixes.collectives.ALL_REDUCE` must be applied)."""
    from tfdist.strategy.compression import patched_collectives

    patched_collectives(strategy, "communication='gloo'")._tfdist_gloo = group


def group_of(strategy) -> Optional[GlooGroup]:
    """The Gloo group a strategy made by tfdist reduces through (None: TensorFlow's own)."""
    ops = getattr(getattr(strategy, "extended", None), "_cross_device_ops", None)
    return getattr(ops, "_tfdist_gloo", None)


def dense(value) -> bool:
    """A tensor Gloo can sum: a dense float or integer tensor (not IndexedSlices)."""
    import tensorflow as tf

    return isinstance(value, tf.Tensor) and value.dtype in (
        tf.float32,
        tf.float64,
        tf.float16,
        tf.bfloat16,
        tf.int32,
        tf.int64,
    )

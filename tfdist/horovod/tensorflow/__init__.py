"""`horovod.tensorflow`, carried by tfdist: `import tfdist.horovod.tensorflow as hvd`.

The names and arguments are Horovod's (see docs/horovod.md for what differs). Imports
TensorFlow.
"""

from tfdist.horovod.collectives import (
    Adasum,
    Average,
    Max,
    Min,
    Product,
    Sum,
    allgather,
    allgather_object,
    allreduce,
    alltoall,
    broadcast,
    broadcast_object,
    broadcast_variables,
    grouped_allreduce,
    join,
)
from tfdist.horovod.compression import Compression
from tfdist.horovod.gradients import DistributedGradientTape
from tfdist.horovod.optimizer import DistributedOptimizer
from tfdist.horovod.runtime import (
    barrier,
    cross_rank,
    cross_size,
    init,
    is_initialized,
    local_rank,
    local_size,
    payload_bytes,
    rank,
    shutdown,
    size,
)
from tfdist.horovod.unsupported import refuse as _refuse

__all__ = [
    "Adasum",
    "Average",
    "Compression",
    "DistributedGradientTape",
    "DistributedOptimizer",
    "Max",
    "Min",
    "Product",
    "Sum",
    "allgather",
    "allgather_object",
    "allreduce",
    "alltoall",
    "barrier",
    "broadcast",
    "broadcast_object",
    "broadcast_variables",
    "cross_rank",
    "cross_size",
    "grouped_allreduce",
    "init",
    "is_initialized",
    "join",
    "local_rank",
    "local_size",
    "payload_bytes",
    "rank",
    "shutdown",
    "size",
]


def _tensor_op(read):
    def op(name=None):
        import tensorflow as tf

        return tf.constant(read(), tf.int32, name=name)

    op.__name__ = f"{read.__name__}_op"
    op.__doc__ = f"`{read.__name__}()` as an int32 tensor."
    return op


def size_op(process_set_id=0, name=None):
    """`size()` as an int32 tensor (process set 0, every process, only)."""
    if process_set_id != 0:
        from tfdist.horovod.unsupported import unsupported

        raise unsupported(
            f"process sets (size_op(process_set_id={process_set_id!r}))", "process_set_id=0"
        )
    return _size_op(name=name)


_size_op = _tensor_op(size)
rank_op = _tensor_op(rank)
local_size_op = _tensor_op(local_size)
local_rank_op = _tensor_op(local_rank)
cross_size_op = _tensor_op(cross_size)
cross_rank_op = _tensor_op(cross_rank)


def _built(value: bool):
    def built(*args, **kwargs) -> bool:
        return value

    return built


# What this build has, as Horovod reports it: tfdist's collectives are TensorFlow's, not MPI,
# Gloo, NCCL (directly), oneCCL or DDL.
mpi_built = mpi_enabled = gloo_built = gloo_enabled = _built(False)
nccl_built = ccl_built = ddl_built = rocm_built = cuda_built = _built(False)
mpi_threads_supported = _built(False)


def start_timeline(*args, **kwargs):
    raise _unsupported_timeline()


def stop_timeline(*args, **kwargs):
    raise _unsupported_timeline()


def _unsupported_timeline():
    from tfdist.horovod.unsupported import unsupported

    return unsupported(
        "the timeline", "TensorFlow's profiler (tf.profiler.experimental.start(logdir))"
    )


ProcessSet = _refuse("process sets (ProcessSet)", "collectives over all the processes")
add_process_set = _refuse("process sets (add_process_set)", "collectives over all the processes")
remove_process_set = _refuse(
    "process sets (remove_process_set)", "collectives over all the processes"
)
global_process_set = None


class _Elastic:
    """`hvd.elastic`: Horovod's elastic training is not carried."""

    def __getattr__(self, name):
        from tfdist.horovod.unsupported import unsupported

        raise unsupported(
            f"elastic training (hvd.elastic.{name})",
            "`tfdist launch --workers MIN:MAX` with tfdist.BackupAndRestore",
        )


elastic = _Elastic()

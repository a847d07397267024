"""`horovod.tensorflow.keras`, carried by tfdist: `import tfdist.horovod.tensorflow.keras as hvd`.

The Keras-facing half of Horovod's API, for the Keras in use (Keras 3, or tf_keras under
TF_USE_LEGACY_KERAS=1): the optimizer wrapper, the callbacks (`hvd.callbacks`), and the
collectives on values (numbers, numpy arrays, tensors). Imports TensorFlow and Keras.
"""

from tfdist.horovod import collectives as _collectives
from tfdist.horovod import optimizer as _optimizer
from tfdist.horovod.collectives import Adasum, Average, Max, Min, Product, Sum
from tfdist.horovod.compression import Compression
from tfdist.horovod.optimizer import distribute_optimizer_in_place
from tfdist.horovod.runtime import (
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
from tfdist.horovod.tensorflow import elastic
from tfdist.horovod.tensorflow.keras import callbacks

__all__ = [
    "Adasum",
    "Average",
    "Compression",
    "DistributedOptimizer",
    "Max",
    "Min",
    "Product",
    "Sum",
    "allgather",
    "allreduce",
    "broadcast",
    "broadcast_global_variables",
    "callbacks",
    "cross_rank",
    "cross_size",
    "elastic",
    "init",
    "is_initialized",
    "load_model",
    "local_rank",
    "local_size",
    "payload_bytes",
    "rank",
    "shutdown",
    "size",
]


def DistributedOptimizer(  # noqa: N802  (Horovod's name)
    optimizer,
    name=None,
    device_dense="",
    device_sparse="",
    compression=Compression.none,
    sparse_as_dense=False,
    gradient_predivide_factor=1.0,
    op=Average,
    backward_passes_per_step=1,
    average_aggregated_gradients=False,
    num_groups=0,
    groups=None,
    process_set=None,
    scale_local_gradients=True,
):
    """`horovod.tensorflow.keras.DistributedOptimizer`: the parameters in the order of
    Horovod's Keras function (which differs from `horovod.tensorflow`'s: no `use_locking`),
    for scripts that pass them by position. See `tfdist.horovod.optimizer.DistributedOptimizer`.
    """
    return _optimizer.DistributedOptimizer(
        optimizer,
        name=name,
        device_dense=device_dense,
        device_sparse=device_sparse,
        compression=compression,
        sparse_as_dense=sparse_as_dense,
        backward_passes_per_step=backward_passes_per_step,
        op=op,
        gradient_predivide_factor=gradient_predivide_factor,
        average_aggregated_gradients=average_aggregated_gradients,
        num_groups=num_groups,
        groups=groups,
        process_set=process_set,
        scale_local_gradients=scale_local_gradients,
    )


def allreduce(
    value,
    name=None,
    average=None,
    prescale_factor=1.0,
    postscale_factor=1.0,
    op=None,
    compression=Compression.none,
):
    """All-reduces a value (number, array or tensor); returns a tensor."""
    import tensorflow as tf

    return _collectives.allreduce(
        tf.convert_to_tensor(value),
        average=average,
        op=op,
        compression=compression,
        prescale_factor=prescale_factor,
        postscale_factor=postscale_factor,
    )


def allgather(value, name=None):
    """Concatenates every process's value along the first dimension; returns a tensor."""
    import tensorflow as tf

    return _collectives.allgather(tf.convert_to_tensor(value))


def broadcast(value, root_rank, name=None):
    """The value of `root_rank` on every process; returns a tensor."""
    import tensorflow as tf

    return _collectives.broadcast(tf.convert_to_tensor(value), root_rank)


def broadcast_global_variables(root_rank):
    """TensorFlow 1's global-variable broadcast: there are no global variables in TensorFlow 2."""
    raise RuntimeError(
        "broadcast_global_variables() needs TensorFlow 1's global variables, which TensorFlow 2 "
        "does not have. HINT: pass callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)] "
        "to model.fit, or call hvd.broadcast_variables(model.variables, root_rank=0)."
    )


def load_model(
    filepath,
    custom_optimizers=None,
    custom_objects=None,
    compression=Compression.none,
    legacy_opts=False,
):
    """Loads a Keras model whose optimizer (with its restored state) becomes a
    DistributedOptimizer.

    `legacy_opts` is Horovod's choice of TensorFlow 2.11's legacy optimizer classes; it has no
    effect here: the model's optimizer is the one its file names.
    """
    from tfdist import flavour

    keras = flavour.keras()
    objects = dict(custom_objects or {})
    for cls in custom_optimizers or ():
        objects[cls.__name__] = cls
    model = keras.models.load_model(filepath, custom_objects=objects or None)
    if getattr(model, "optimizer", None) is not None:
        distribute_optimizer_in_place(model.optimizer, compression=compression)
    return model

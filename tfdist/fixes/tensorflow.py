"""TensorFlow internals: those tfdist reads (at the path each release keeps them), and fixes.

Nothing here imports TensorFlow at import time.
"""

from tfdist.fixes.record import Fix, Internal, Target

# The coordination service's protobufs moved with TensorFlow's TSL: tensorflow.tsl (2.16),
# tensorflow.compiler.xla.tsl (2.17-2.19, then partly), ... The eager context imports the module
# it uses itself, so its own reference is right on every release; the others are fallbacks.
COORDINATION_CONFIG = Internal(
    name="coordination_config_pb2",
    used_for="a bounded wait for the peers of a multi-worker job",
    paths=(
        "tensorflow.python.eager.context:coordination_config_pb2",
        "tsl.protobuf.coordination_config_pb2",
        "tensorflow.compiler.xla.tsl.protobuf.coordination_config_pb2",
        "tensorflow.tsl.protobuf.coordination_config_pb2",
    ),
)

INTERNALS = (COORDINATION_CONFIG,)


UNSIGNED_BROADCAST = Fix(
    name="unsigned_variables_under_multi_worker",
    summary=(
        "MultiWorkerMirroredStrategy broadcasts each new variable's initial value with a "
        "collective that has no unsigned integer kernels."
    ),
    upstream="none found",
    strategies=("multi_worker_mirrored",),
    consequence=(
        "a variable of an unsigned dtype (the uint32 seed state of Dropout and every random "
        "layer on Keras 3.3-3.4) fails under multi_worker_mirrored with \"Value for attr 'T' "
        'of uint32 is not in the list of allowed values".'
    ),
    library="tensorflow",
)


@UNSIGNED_BROADCAST.variant(
    "2.16",
    targets=[
        Target(
            "tensorflow.python.distribute.collective_all_reduce_strategy:"
            "CollectiveAllReduceExtended._get_variable_creator_initial_value",
            ("self", "replica_id", "device", "primary_var"),
        ),
        "tensorflow.python.trackable.base:CheckpointInitialValue",
    ],
)
def _fix_unsigned_broadcast():
    # CollectiveAllReduceExtended._get_variable_creator_initial_value
    # (tensorflow/python/distribute/collective_all_reduce_strategy.py) sends the chief's initial
    # value to the other workers with CollectiveBcastSend/Recv, whose kernels take bool, float,
    # half, double, int32 and int64 only. The fix broadcasts an unsigned value as int64 and
    # casts it back: the same bits for every value the type holds. Other dtypes: unchanged.
    import tensorflow as tf
    from tensorflow.python.distribute import collective_all_reduce_strategy as mwms
    from tensorflow.python.trackable import base

    cls = mwms.CollectiveAllReduceExtended
    original = cls._get_variable_creator_initial_value
    unsigned = (tf.uint8, tf.uint16, tf.uint32, tf.uint64)

    def _get_variable_creator_initial_value(self, replica_id, device, primary_var, **kwargs):
        dtype = kwargs.get("dtype")
        dtype = tf.as_dtype(dtype) if dtype is not None else None
        if replica_id != 0 or dtype not in unsigned:
            return original(self, replica_id, device, primary_var, **kwargs)
        value = kwargs["initial_value"]

        def as_int64():
            v = value() if callable(value) else value
            if isinstance(v, base.CheckpointInitialValue):
                v = v.wrapped_value
            return tf.cast(tf.convert_to_tensor(v, dtype=dtype), tf.int64)

        broadcast = original(
            self, replica_id, device, primary_var, **{**kwargs, "initial_value": as_int64,
                                                      "dtype": tf.int64}
        )  # fmt: skip
        return lambda: tf.cast(broadcast(), dtype)

    cls._get_variable_creator_initial_value = _get_variable_creator_initial_value


FIXES = (UNSIGNED_BROADCAST,)

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


# Both fixes below wrap the initial value that the chief broadcasts to the other workers
# (CollectiveAllReduceExtended._get_variable_creator_initial_value), which may be a callable
# and may wrap a CheckpointInitialValue (see _initial_value).
_BROADCAST_TARGETS = (
    Target(
        "tensorflow.python.distribute.collective_all_reduce_strategy:"
        "CollectiveAllReduceExtended._get_variable_creator_initial_value",
        ("self", "replica_id", "device", "primary_var"),
    ),
    "tensorflow.python.trackable.base:CheckpointInitialValue",
)


def _initial_value(value, dtype):
    """The tensor a variable's initial value (a value or a callable, perhaps wrapping a
    CheckpointInitialValue) stands for, as `dtype` when given."""
    import tensorflow as tf
    from tensorflow.python.trackable import base

    v = value() if callable(value) else value
    if isinstance(v, base.CheckpointInitialValue):
        v = v.wrapped_value
    return tf.convert_to_tensor(v, dtype=dtype)


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
    targets=_BROADCAST_TARGETS,
)
def _fix_unsigned_broadcast():
    # CollectiveAllReduceExtended._get_variable_creator_initial_value
    # (tensorflow/python/distribute/collective_all_reduce_strategy.py) sends the chief's initial
    # value to the other workers with CollectiveBcastSend/Recv, whose kernels take bool, float,
    # half, double, int32 and int64 only. The fix broadcasts an unsigned value as int64 and
    # casts it back: the same bits for every value the type holds. Other dtypes: unchanged.
    import tensorflow as tf
    from tensorflow.python.distribute import collective_all_reduce_strategy as mwms

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
            return tf.cast(_initial_value(value, dtype), tf.int64)

        broadcast = original(
            self, replica_id, device, primary_var, **{**kwargs, "initial_value": as_int64,
                                                      "dtype": tf.int64}
        )  # fmt: skip
        return lambda: tf.cast(broadcast(), dtype)

    cls._get_variable_creator_initial_value = _get_variable_creator_initial_value


DIFFERING_VARIABLES = Fix(
    name="multi_worker_differing_variables_named",
    summary=(
        "MultiWorkerMirroredStrategy broadcasts each new variable's initial value from the "
        "chief without checking that every worker makes a variable of the same shape and dtype."
    ),
    upstream="none found",
    strategies=("multi_worker_mirrored",),
    consequence=(
        "workers that build different models (a layer of another size) fail while they build it "
        "with TensorFlow's \"Shape mismatch in the collective instance 100 ... expected shape "
        '[4,16] but another member in the group expected shape [4,32]" on one worker and, '
        'seconds later, "The following tasks are unhealthy" on the others; the strategy is '
        "unusable after it."
    ),
    library="tensorflow",
)


@DIFFERING_VARIABLES.variant(
    "2.16",
    targets=_BROADCAST_TARGETS,
)
def _fix_differing_variables():
    # The initial value the chief broadcasts (CollectiveAllReduceExtended.
    # _get_variable_creator_initial_value) is computed first, then its shape and dtype are
    # exchanged through the coordination service (tfdist.fit_agreement.check_variable): one
    # write and one read per peer per variable, before the broadcast, so a difference is a
    # ValueError on every worker and no collective of mismatched shapes runs. The workers are
    # the extended's own (_cluster_spec, _task_type, _task_id, _num_workers); where they
    # cannot be read, or on one worker, the broadcast is as upstream. The value is computed
    # and checked before upstream's function runs, since that takes the broadcast's
    # collective instance key first: a worker refused alone (a peer that never makes the
    # variable) keeps its later collectives, e.g. the exit barrier, in step with its peers.
    from tensorflow.python.distribute import collective_all_reduce_strategy as mwms

    cls = mwms.CollectiveAllReduceExtended
    original = cls._get_variable_creator_initial_value

    def _get_variable_creator_initial_value(self, replica_id, device, primary_var, **kwargs):
        workers = _workers(self) if replica_id == 0 else None
        if not workers:
            return original(self, replica_id, device, primary_var, **kwargs)
        names, me = workers
        value, dtype = kwargs["initial_value"], kwargs.get("dtype")
        name = str(kwargs.get("name") or "Variable")

        computed = [None]
        kwargs = {**kwargs, "initial_value": lambda: computed[0]}
        broadcast = original(self, replica_id, device, primary_var, **kwargs)

        def checked():
            import tensorflow as tf

            from tfdist import fit_agreement

            with tf.device(device):
                v = _initial_value(value, dtype)
            self._tfdist_variables = number = getattr(self, "_tfdist_variables", 0) + 1
            shape = None if v.shape.rank is None else v.shape.as_list()
            fit_agreement.check_variable(names, me, number, [name, shape, v.dtype.name])
            computed[0] = v
            return broadcast()  # takes the broadcast's collective key only now

        return checked

    cls._get_variable_creator_initial_value = _get_variable_creator_initial_value


def _workers(extended):
    """(the names of the workers that broadcast, this task's) of a CollectiveAllReduceExtended
    over several workers, else None."""
    spec, kind, index = (
        getattr(extended, a, None) for a in ("_cluster_spec", "_task_type", "_task_id")
    )
    if getattr(extended, "_num_workers", 1) < 2 or spec is None or kind is None:
        return None
    jobs = spec.as_dict() if hasattr(spec, "as_dict") else dict(spec)
    names = [f"{job}:{i}" for job in ("chief", "worker") for i in range(len(jobs.get(job, ())))]
    me = f"{kind}:{index}"
    return (names, me) if me in names else None


FIXES = (UNSIGNED_BROADCAST, DIFFERING_VARIABLES)

"""tfdist's Horovod API against Horovod 0.28.1's: a table of every function and class of
`horovod.tensorflow`, `horovod.tensorflow.keras` and its callbacks that tfdist offers, with
Horovod's parameters (names, order, defaults) and what each returns, as read in Horovod's
source at v0.28.1 (horovod/tensorflow/__init__.py, mpi_ops.py, functions.py,
horovod/common/basics.py, horovod/tensorflow/keras/__init__.py and callbacks.py).

A script written for Horovod passes arguments by position and keyword as Horovod takes them, and
unpacks what Horovod returns: tfdist takes Horovod's parameters first, in order, with the same
defaults (parameters it adds come after, with defaults), and returns the same kinds of values.
Horovod cannot be installed next to TensorFlow 2.16+, so the table is written out here.
"""

import inspect

import numpy as np
import pytest
import tensorflow as tf

import tfdist.horovod.tensorflow as hvd
import tfdist.horovod.tensorflow.keras as hvdk
from tfdist import flavour
from tfdist.horovod.tensorflow.keras import callbacks as hvd_callbacks

keras = flavour.keras()

# Horovod's defaults, by the names its signatures use.
DEFAULTS = {
    "Compression.none": hvd.Compression.none,
    "global_process_set": hvd.global_process_set,
    "Average": hvd.Average,
}
REFUSED = "refused"  # tfdist raises NotImplementedError naming what to use instead

# horovod/common/basics.py: the process queries horovod.tensorflow and horovod.tensorflow.keras
# both export
_PROCESS = [
    ("init", "comm=None, process_sets=None", type(None)),
    ("shutdown", "", type(None)),
    ("is_initialized", "", bool),
    ("size", "", int),
    ("local_size", "", int),
    ("cross_size", "", int),
    ("rank", "", int),
    ("local_rank", "", int),
    ("cross_rank", "", int),
]

# (module, name, Horovod 0.28.1's parameters, what it returns in one process)
HOROVOD = [
    # horovod/common/basics.py, re-exported by horovod.tensorflow and horovod.tensorflow.keras
    *[("tf", name, params, returns) for name, params, returns in _PROCESS],
    ("tf", "mpi_threads_supported", "", bool),
    ("tf", "mpi_enabled", "", bool),
    ("tf", "mpi_built", "", bool),
    ("tf", "gloo_enabled", "", bool),
    ("tf", "gloo_built", "", bool),
    ("tf", "nccl_built", "", bool),
    ("tf", "ddl_built", "", bool),
    ("tf", "ccl_built", "", bool),
    ("tf", "cuda_built", "", bool),
    ("tf", "rocm_built", "", bool),
    ("tf", "start_timeline", "file_path, mark_cycles=False", REFUSED),
    ("tf", "stop_timeline", "", REFUSED),
    # horovod/tensorflow/compression.py: none and fp16 (tfdist adds bf16)
    ("tf", "Compression", "", "compression"),
    ("keras", "Compression", "", "compression"),
    # horovod/tensorflow/mpi_ops.py
    ("tf", "size_op", "process_set_id=0, name=None", tf.Tensor),
    ("tf", "local_size_op", "name=None", tf.Tensor),
    ("tf", "rank_op", "name=None", tf.Tensor),
    ("tf", "local_rank_op", "name=None", tf.Tensor),
    (
        "tf",
        "allgather",
        "tensor, name=None, ignore_name_scope=False, process_set=global_process_set",
        tf.Tensor,
    ),
    (
        "tf",
        "broadcast",
        "tensor, root_rank, name=None, ignore_name_scope=False, process_set=global_process_set",
        tf.Tensor,
    ),
    (
        "tf",
        "alltoall",
        "tensor, splits=None, name=None, ignore_name_scope=False, process_set=global_process_set",
        tf.Tensor,  # (tensor, received_splits) with splits: test_alltoall_returns_as_horovod
    ),
    ("tf", "join", "", tf.Tensor),
    ("tf", "ProcessSet", "ranks_or_comm", REFUSED),
    ("tf", "add_process_set", "process_set_or_ranks", REFUSED),
    ("tf", "remove_process_set", "process_set", REFUSED),
    # horovod/tensorflow/functions.py
    (
        "tf",
        "broadcast_variables",
        "variables, root_rank, process_set=global_process_set, inplace=False",
        type(None),  # eagerly; an op in a graph
    ),
    (
        "tf",
        "broadcast_object",
        "obj, root_rank=0, session=None, name=None, process_set=global_process_set",
        dict,  # the object broadcast
    ),
    (
        "tf",
        "allgather_object",
        "obj, session=None, name=None, process_set=global_process_set",
        list,
    ),
    # horovod/tensorflow/__init__.py
    (
        "tf",
        "allreduce",
        "tensor, average=None, device_dense='', device_sparse='', compression=Compression.none, "
        "op=None, prescale_factor=1.0, postscale_factor=1.0, name=None, "
        "process_set=global_process_set, ignore_name_scope=False",
        tf.Tensor,
    ),
    (
        "tf",
        "grouped_allreduce",
        "tensors, average=None, device_dense='', device_sparse='', compression=Compression.none, "
        "op=None, prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set, "
        "ignore_name_scope=False, name=None",
        list,
    ),
    (
        "tf",
        "DistributedOptimizer",
        "optimizer, name=None, use_locking=False, device_dense='', device_sparse='', "
        "compression=Compression.none, sparse_as_dense=False, backward_passes_per_step=1, "
        "op=Average, gradient_predivide_factor=1.0, average_aggregated_gradients=False, "
        "num_groups=0, groups=None, process_set=global_process_set, scale_local_gradients=True",
        "optimizer",
    ),
    (
        "tf",
        "DistributedGradientTape",
        "gradtape, device_dense='', device_sparse='', compression=Compression.none, "
        "sparse_as_dense=False, op=Average, gradient_predivide_factor=1.0, num_groups=0, "
        "groups=None, process_set=global_process_set, scale_local_gradients=True",
        tf.GradientTape,
    ),
    # horovod/tensorflow/keras/__init__.py (and what it re-exports from horovod.tensorflow)
    *[("keras", name, params, returns) for name, params, returns in _PROCESS],
    (
        "keras",
        "DistributedOptimizer",
        "optimizer, name=None, device_dense='', device_sparse='', compression=Compression.none, "
        "sparse_as_dense=False, gradient_predivide_factor=1.0, op=Average, "
        "backward_passes_per_step=1, average_aggregated_gradients=False, num_groups=0, "
        "groups=None, process_set=global_process_set, scale_local_gradients=True",
        "optimizer",
    ),
    ("keras", "broadcast_global_variables", "root_rank", REFUSED),  # TensorFlow 1 only
    (
        "keras",
        "allreduce",
        "value, name=None, average=None, prescale_factor=1.0, postscale_factor=1.0, op=None, "
        "compression=Compression.none",
        tf.Tensor,
    ),
    ("keras", "allgather", "value, name=None", tf.Tensor),
    ("keras", "broadcast", "value, root_rank, name=None", tf.Tensor),
    (
        "keras",
        "load_model",
        "filepath, custom_optimizers=None, custom_objects=None, compression=Compression.none, "
        "legacy_opts=False",
        "model",
    ),
    # horovod/tensorflow/keras/callbacks.py
    (
        "callbacks",
        "BroadcastGlobalVariablesCallback",
        "root_rank, device='', local_variables=None",
        "callback",
    ),
    ("callbacks", "MetricAverageCallback", "device=''", "callback"),
    (
        "callbacks",
        "LearningRateScheduleCallback",
        "initial_lr, multiplier, start_epoch=0, end_epoch=None, staircase=True, "
        "momentum_correction=True, steps_per_epoch=None",
        "callback",
    ),
    (
        "callbacks",
        "LearningRateWarmupCallback",
        "initial_lr, warmup_epochs=5, momentum_correction=True, steps_per_epoch=None, verbose=0",
        "callback",
    ),
]

# What tfdist offers beyond Horovod 0.28.1's functions and classes (constants such as
# hvd.Average and the modules hvd.elastic, hvd.callbacks are not in the table).
ADDED = {
    "tf": {"barrier", "payload_bytes", "cross_size_op", "cross_rank_op"},
    "keras": {"payload_bytes", "distribute_optimizer_in_place"},
    "callbacks": set(),
}
MODULES = {"tf": hvd, "keras": hvdk, "callbacks": hvd_callbacks}


def _params(text):
    """[(name, has default, default)] of a parameter list written as Horovod's source has it."""
    out = []
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, eq, default = part.partition("=")
        value = DEFAULTS[default] if default in DEFAULTS else (eval(default) if eq else None)
        out.append((name, bool(eq), value))
    return out


def _signature(obj):
    if inspect.isclass(obj):
        obj = obj.__init__
    parameters = list(inspect.signature(obj).parameters.values())
    return [p for p in parameters if p.name != "self"]


@pytest.fixture(autouse=True)
def initialized():
    hvd.init()
    yield


def test_the_table_covers_every_function_and_class_tfdist_offers():
    for key, module in MODULES.items():
        offered = {
            name
            for name, value in vars(module).items()
            if not name.startswith("_")
            and callable(value)
            and (inspect.isfunction(value) or inspect.isclass(value))
            and not isinstance(value, type(hvd.Average))
        }
        offered -= {"callback_classes"} if key == "callbacks" else set()
        tabled = {name for where, name, _, _ in HOROVOD if where == key}
        assert offered - ADDED[key] <= tabled, (key, sorted(offered - ADDED[key] - tabled))


@pytest.mark.parametrize(
    "where, name, params, returns", HOROVOD, ids=[f"{w}.{n}" for w, n, _, _ in HOROVOD]
)
def test_parameters_are_horovods(where, name, params, returns):
    ours = _signature(getattr(MODULES[where], name))
    if returns == REFUSED and [p.kind for p in ours] == [
        inspect.Parameter.VAR_POSITIONAL,
        inspect.Parameter.VAR_KEYWORD,
    ]:
        return  # takes anything, and refuses
    theirs = _params(params)
    names = [p.name for p in ours]
    assert names[: len(theirs)] == [n for n, _, _ in theirs], (
        f"{where}.{name}: Horovod takes ({params}); tfdist takes ({', '.join(names)})"
    )
    for parameter, (pname, has_default, default) in zip(ours, theirs):
        assert parameter.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD, pname
        if has_default:
            assert parameter.default is not parameter.empty, f"{name}: {pname} has no default"
            assert parameter.default is default or parameter.default == default, (
                f"{where}.{name}: {pname}={parameter.default!r}, Horovod's {default!r}"
            )
    for parameter in ours[len(theirs) :]:
        assert parameter.default is not parameter.empty or parameter.kind in (
            inspect.Parameter.VAR_POSITIONAL,
            inspect.Parameter.VAR_KEYWORD,
        ), f"{where}.{name}: the added {parameter.name} needs a default"


def _model():
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    return model


def _call(where, name, tmp_path):
    """Calls `name` the way a Horovod script does, in this job of one process."""
    function = getattr(MODULES[where], name)
    x = tf.constant([[1.0, 2.0]])
    samples = {
        "init": (),
        "start_timeline": ("timeline.json",),
        "ProcessSet": ([0],),
        "add_process_set": ([0],),
        "remove_process_set": (None,),
        "allgather": (x,),
        "broadcast": (x, 0),
        "alltoall": (tf.range(2),),
        "broadcast_variables": ([tf.Variable([1.0])], 0),
        "broadcast_object": ({"a": 1},),
        "allgather_object": ({"a": 1},),
        "allreduce": (x,),
        "grouped_allreduce": ([x, x],),
        "DistributedOptimizer": (keras.optimizers.SGD(0.1),),
        "DistributedGradientTape": (tf.GradientTape(),),
        "broadcast_global_variables": (0,),
        "BroadcastGlobalVariablesCallback": (0,),
        "LearningRateScheduleCallback": (0.1, 0.5),
        "LearningRateWarmupCallback": (0.1,),
    }
    if name == "Compression":
        return function
    if name == "load_model":
        path = str(tmp_path / "model.keras")
        _model().save(path)
        return function(path)
    if name == "shutdown":
        try:
            return function()
        finally:
            hvd.init()
    return function(*samples.get(name, ()))


@pytest.mark.parametrize(
    "where, name, params, returns", HOROVOD, ids=[f"{w}.{n}" for w, n, _, _ in HOROVOD]
)
def test_return_types_are_horovods(where, name, params, returns, tmp_path):
    if returns == REFUSED:
        with pytest.raises((NotImplementedError, RuntimeError), match="HINT"):
            _call(where, name, tmp_path)
        return
    value = _call(where, name, tmp_path)
    if returns == "compression":
        value = getattr(MODULES[where], name)
        assert value.none.compress(tf.constant(1.0))[1] is None
        assert value.fp16.compress(tf.constant(1.0))[0].dtype == tf.float16
    elif returns == "optimizer":
        assert isinstance(value, keras.optimizers.SGD)
    elif returns == "model":
        assert isinstance(value, keras.Model)
    elif returns == "callback":
        assert isinstance(value, keras.callbacks.Callback)
    elif returns is list:
        assert isinstance(value, list)
        if name == "grouped_allreduce":
            assert all(isinstance(v, tf.Tensor) for v in value)
    else:
        assert isinstance(value, returns), f"{where}.{name} returned {type(value).__name__}"
    if name.endswith("_op") or name == "join":
        assert value.dtype == tf.int32 and value.shape == ()


def test_alltoall_returns_as_horovod():
    """Horovod 0.28.1: the tensor alone without splits, (tensor, received_splits) with them."""
    received = hvd.alltoall(tf.constant([[1.0], [2.0]]))
    assert isinstance(received, tf.Tensor)
    np.testing.assert_array_equal(received, [[1.0], [2.0]])
    received, splits = hvd.alltoall(tf.constant([[1.0], [2.0]]), splits=[2])
    np.testing.assert_array_equal(received, [[1.0], [2.0]])
    assert splits.dtype == tf.int32
    np.testing.assert_array_equal(splits, [2])
    received, splits = hvd.alltoall(tf.range(3), [3])  # splits by position, as Horovod allows
    np.testing.assert_array_equal(splits, [3])


def test_the_keras_optimizer_takes_horovods_keras_order():
    """horovod.tensorflow.keras.DistributedOptimizer has no use_locking: its 3rd parameter is
    device_dense, its 7th gradient_predivide_factor."""
    optimizer = hvdk.DistributedOptimizer(
        keras.optimizers.SGD(0.1), "opt", "", "", hvd.Compression.none, False, 1.0, hvd.Sum, 2
    )
    assert isinstance(optimizer, keras.optimizers.SGD) and optimizer.name == "opt"
    assert optimizer._tfdist_reduction.op is hvd.Sum
    assert optimizer._tfdist_aggregation is not None  # backward_passes_per_step=2


def test_broadcast_keeps_local_variables():
    model = _model()
    kept = model.layers[-1].bias
    callback = hvd_callbacks.BroadcastGlobalVariablesCallback(0, local_variables=[kept])
    assert callback.local_variables == [kept]
    callback.set_model(model)
    callback.on_train_begin()

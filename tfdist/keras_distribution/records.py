"""The Keras 3 internals tfdist patches to carry `keras.distribution` on TensorFlow, as records.

Each is a `tfdist.fixes.Fix`: what it patches, for which Keras releases, the upstream issue,
and what stays upstream when its targets differ (it is then skipped with one warning).
`tfdist.keras_distribution.install()` registers and applies them when Keras is imported; they
are not applied by `make_strategy`. Nothing changes while no distribution is set.

Imports tfdist.fixes.record; the patches import the sibling modules when applied.
"""

from __future__ import annotations

from tfdist.fixes.keras_backend import VARIABLE
from tfdist.fixes.keras_trainer import BASE_TRAINER, TF_TRAINER
from tfdist.fixes.record import Fix, Target

__all__ = ["RECORDS"]

_LIB = "keras.src.distribution.distribution_lib"
_TF_LIB = "keras.src.backend.tensorflow.distribution_lib"
_UPSTREAM = "keras-team/keras#18473"
_STRATEGIES = ("mirrored", "multi_worker_mirrored")


BACKEND = Fix(
    name="keras_distribution_backend",
    summary=(
        "Keras's TensorFlow distribution_lib is a prototype: no initialize(), num_processes() "
        "or process_id(), and list_devices() sees this process only."
    ),
    upstream=_UPSTREAM,
    strategies=_STRATEGIES,
    consequence=(
        "keras.distribution.initialize() and, before Keras 3.15, DataParallel() fail with "
        "AttributeError on TensorFlow, and list_devices() misses the other processes' devices."
    ),
)


@BACKEND.variant(
    "3.3",
    targets=[
        f"{_TF_LIB}:list_devices",
        Target(f"{_LIB}:initialize", ("job_addresses", "num_processes", "process_id")),
        f"{_LIB}:DataParallel",
    ],
)
def _install_backend():
    # keras/src/distribution/distribution_lib.py calls these on `keras.src.backend
    # .distribution_lib`, which is the TensorFlow backend's module on TensorFlow.
    import importlib

    from tfdist.keras_distribution import devices, processes

    module = importlib.import_module(_TF_LIB)

    def get_device_count(device_type=None):
        return len(devices.list_devices(device_type))

    def distribute_tensor(tensor, layout):
        # A layout of an intermediate tensor is a hint for XLA's partitioner on JAX; each
        # replica of a TensorFlow strategy computes whole activations.
        return tensor

    def distribute_value(value, tensor_layout):
        return value

    module.list_devices = devices.list_devices
    module.get_device_count = get_device_count
    module.initialize = processes.initialize
    module.num_processes = processes.num_processes
    module.process_id = processes.process_id
    module.distribute_tensor = distribute_tensor
    module.distribute_value = distribute_value
    module._tfdist = True


STRATEGY = Fix(
    name="keras_distribution_strategy",
    summary=(
        "On TensorFlow, set_distribution() and Distribution.scope() change nothing: the model "
        "trains on one device."
    ),
    upstream=_UPSTREAM,
    strategies=_STRATEGIES,
    consequence=(
        "a DataParallel or ModelParallel distribution is a silent no-op: every variable on one "
        "device, no replica, no collective."
    ),
)


@STRATEGY.variant(
    "3.3",
    targets=[
        Target("keras.src.backend.common.global_state:set_global_attribute", ("name", "value")),
        f"{_LIB}:set_distribution",
        f"{_LIB}:GLOBAL_ATTRIBUTE_NAME",
        "tensorflow.python.framework.ops:Graph",
        BASE_TRAINER.target("compile", ("self", "optimizer")),
        TF_TRAINER.target("distribute_strategy"),
    ],
)
def _install_strategy():
    # set_distribution() and Distribution.scope() (enter and exit) store the distribution with
    # global_state.set_global_attribute(GLOBAL_ATTRIBUTE_NAME, value), looked up on the module
    # at each call. The wrapper makes the distribution's strategy current first, so a
    # distribution TensorFlow cannot carry is refused before Keras stores it.
    import importlib

    from keras.src.backend.common import global_state

    from tfdist.keras_distribution import bridge

    name = importlib.import_module(_LIB).GLOBAL_ATTRIBUTE_NAME
    upstream = global_state.set_global_attribute
    if getattr(upstream, "_tfdist", False):
        return

    def set_global_attribute(attribute, value):
        if attribute == name:
            bridge.activate(value)
        return upstream(attribute, value)

    set_global_attribute._tfdist = True
    global_state.set_global_attribute = set_global_attribute

    # Keras 3 makes a model's optimizer under the strategy current at compile(); on JAX a
    # model built under a distribution compiles anywhere. So compile() of a model built under
    # a distribution, called while no strategy is current, runs under the model's strategy.
    base = BASE_TRAINER.get()
    compile_upstream = base.compile

    def compile(self, *args, **kwargs):
        strategy = bridge.strategy_to_compile_under(self)
        if strategy is None:
            return compile_upstream(self, *args, **kwargs)
        with strategy.scope():
            return compile_upstream(self, *args, **kwargs)

    compile.__doc__ = compile_upstream.__doc__
    base.compile = compile

    # A model built before the distribution was set has its variables on one device; Keras
    # would train it under the distribution's strategy (the TensorFlow trainer's
    # distribute_strategy falls back to the current one) and fail deep in the optimizer. Say
    # what happened instead.
    trainer = TF_TRAINER.get()
    prop = trainer.__dict__["distribute_strategy"]

    def distribute_strategy(self):
        if getattr(self, "_distribute_strategy", None) is None:
            bridge.check_built_under_the_distribution(self)
        return prop.fget(self)

    trainer.distribute_strategy = property(distribute_strategy, prop.fset, prop.fdel, prop.__doc__)


DATASET = Fix(
    name="keras_distribution_dataset",
    summary=(
        "Keras shards a dataset per process for JAX's trainer (Distribution.distribute_dataset; "
        "the TensorFlow dataset adapter from Keras 3.16), which on TensorFlow the strategy would "
        "shard again."
    ),
    upstream=_UPSTREAM,
    strategies=("multi_worker_mirrored",),
    consequence=(
        "in a multi-process job each process trains on a share of a share of every batch "
        "(batches 1/N^2 of the global one), and fit fails on uneven splits."
    ),
)


def _patch_distribute_dataset(classes):
    from tfdist.keras_distribution import bridge

    for cls in classes:
        upstream = cls.__dict__["distribute_dataset"]
        if getattr(upstream, "_tfdist", False):
            continue

        def distribute_dataset(self, dataset, _upstream=upstream):
            return bridge.distribute_dataset(self, dataset, _upstream)

        distribute_dataset._tfdist = True
        distribute_dataset.__doc__ = upstream.__doc__
        cls.distribute_dataset = distribute_dataset


@DATASET.variant(
    "3.3",
    "3.15",
    targets=[
        Target(f"{_LIB}:DataParallel.distribute_dataset", ("self", "dataset")),
        Target(f"{_LIB}:ModelParallel.distribute_dataset", ("self", "dataset")),
    ],
)
def _dataset_per_class():
    # Keras 3.3-3.14 define distribute_dataset on DataParallel and on ModelParallel.
    from keras.src.distribution import distribution_lib

    _patch_distribute_dataset([distribution_lib.DataParallel, distribution_lib.ModelParallel])


@DATASET.variant(
    "3.15",
    "3.16",
    targets=[Target(f"{_LIB}:Distribution.distribute_dataset", ("self", "dataset"))],
)
def _dataset_on_the_base():
    # Keras 3.15 defines it once, on Distribution.
    from keras.src.distribution import distribution_lib

    _patch_distribute_dataset([distribution_lib.Distribution])


_ADAPTER = "keras.src.trainers.data_adapters.tf_dataset_adapter:TFDatasetAdapter"


@DATASET.variant(
    "3.16",
    targets=[
        Target(f"{_ADAPTER}.__init__", ("self", "dataset", "class_weight", "distribution")),
        Target(f"{_ADAPTER}._distribute_dataset", ("self", "dataset", "distribution")),
    ],
)
def _dataset_in_the_adapter():
    # Keras 3.16 removed Distribution.distribute_dataset: the TensorFlow dataset adapter
    # (keras/src/trainers/data_adapters/tf_dataset_adapter.py) shards the dataset itself in
    # __init__, after class weights, and only with auto_shard_dataset. tfdist lets it map the
    # class weights and distributes the result as before (auto_shard_dataset=False included);
    # in one process the adapter's own _distribute_dataset decides, as upstream.
    from keras.src.trainers.data_adapters import tf_dataset_adapter

    from tfdist.keras_distribution import bridge

    cls = tf_dataset_adapter.TFDatasetAdapter
    upstream_init, upstream_distribute = cls.__init__, cls._distribute_dataset
    if getattr(upstream_init, "_tfdist", False):
        return

    def __init__(self, dataset, class_weight=None, distribution=None):
        upstream_init(self, dataset, class_weight=class_weight, distribution=None)
        if distribution is None:
            return

        def upstream(distribution, dataset):
            if not getattr(distribution, "auto_shard_dataset", True):
                return dataset
            return upstream_distribute(self, dataset, distribution)

        self._dataset = bridge.distribute_dataset(distribution, self._dataset, upstream)

    __init__._tfdist = True
    __init__.__doc__ = upstream_init.__doc__
    cls.__init__ = __init__


ROW_SHARDED = Fix(
    name="keras_distribution_row_sharded_variables",
    summary=(
        "On TensorFlow, a ModelParallel layout does not shard the variable: Keras makes one "
        "tf.Variable on the default device."
    ),
    upstream=_UPSTREAM,
    strategies=("mirrored",),
    consequence=("a variable laid out ('model', None) is whole on one device; nothing is sharded."),
)


@ROW_SHARDED.variant(
    "3.3",
    targets=[
        VARIABLE.target("_initialize", ("self", "value")),
        "tensorflow.python.distribute.sharded_variable:ShardedVariable",
    ],
)
def _install_row_sharded():
    # Keras's TensorFlow Variable makes its tf.Variable in _initialize (eagerly, or deferred
    # until the layer is built), after its path is set. Under a ModelParallel that row-shards
    # the path, tfdist makes a ShardedVariable instead, shard i on the i-th device of the axis.
    from tfdist.keras_distribution import bridge

    variable = VARIABLE.get()
    upstream = variable._initialize
    if getattr(upstream, "_tfdist", False):
        return

    def _initialize(self, value):
        import tensorflow as tf

        devices = None if isinstance(value, tf.Variable) else bridge.shard_devices_for(self)
        if devices is None:
            return upstream(self, value)
        self._value = bridge.row_sharded_value(self, value, devices)

    _initialize._tfdist = True
    variable._initialize = _initialize


RECORDS = (BACKEND, STRATEGY, DATASET, ROW_SHARDED)

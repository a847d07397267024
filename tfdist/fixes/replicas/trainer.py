"""Fixes of Keras 3's TensorFlow trainer under mirrored: the symbolic build from a local batch,
and no XLA-compiled step across local replicas.

Nothing here imports TensorFlow or Keras at import time.
"""

from tfdist.fixes.keras_trainer import TF_TRAINER, TRAINER, needs_a_batch
from tfdist.fixes.record import Fix, Target

SYMBOLIC_BUILD = Fix(
    name="symbolic_build_from_a_local_batch",
    summary=(
        "The trainer's symbolic build reduces the whole first distributed batch with MEAN just to"
        " learn its shapes."
    ),
    upstream="keras-team/keras#20585, tensorflow/tensorflow#72388, keras-team/keras#19246",
    strategies=("mirrored", "multi_worker_mirrored"),
    consequence=(
        'fit/evaluate/predict fail on multi_worker_mirrored ("Attempt to convert a value '
        '(PerReplica ...)"), on mirrored with batches that do not split over the replicas ("AddN '
        'must have the same size and shape"), and with string inputs.'
    ),
    absent_before=(
        "Keras before 3.5 builds the model when the step is traced, without the symbolic build"
    ),
)


_BUILD_TARGETS = [
    TF_TRAINER.target("_maybe_symbolic_build", ("self", "iterator", "data_batch")),
    TF_TRAINER.target("_symbolic_build", ("self",)),
    Target("keras.src.layers.layer:Layer._flatten_layers", ("self",)),
    "keras.src.tree:map_structure",
]


def _patch_symbolic_build(batches_of):
    # keras-team/keras#20585, tensorflow/tensorflow#72388 (multi_worker_mirrored), and
    # keras-team/keras#19246 (mirrored, uneven batches). The TensorFlow trainer's
    # _maybe_symbolic_build (keras/src/backend/tensorflow/trainer.py) peeks at the first
    # distributed batch only to learn shapes, but does so with
    # strategy.reduce("MEAN", <whole batch>):
    #   multi_worker_mirrored: "Attempt to convert a value (PerReplica ...) to a Tensor";
    #   mirrored, batch not divisible by the replicas: "AddN must have the same size and shape";
    #   string inputs: "Value for attr 'T' of string is not in the list of allowed values".
    # The fix takes the first local replica's tensors: same shapes and dtypes, no collective.
    # It peeks only when the build needs a batch (upstream peeks on every fit and evaluate:
    # a distributed iterator made for one batch, about 50 ms between 2 processes).
    # `batches_of(epoch_iterator)` yields the per-step iterators, as that release's loop does.
    import tensorflow as tf
    from keras.src import tree

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        if self._distribute_strategy is None:
            return  # as upstream: no strategy, build lazily when tracing
        strategy = self.distribute_strategy
        if iterator is not None and needs_a_batch(self):
            for batches in batches_of(iterator):
                data_batch = tree.map_structure(
                    lambda v: (
                        strategy.experimental_local_results(v)[0]
                        if isinstance(v, tf.distribute.DistributedValues)
                        else v
                    ),
                    next(batches),
                )
                break
        with strategy.scope():
            self._symbolic_build(data_batch=data_batch)

    TF_TRAINER.get()._maybe_symbolic_build = _maybe_symbolic_build


@SYMBOLIC_BUILD.variant(
    "3.5", "3.7", targets=[*_BUILD_TARGETS, f"{TRAINER}:TFEpochIterator.enumerate_epoch"]
)
def _symbolic_build_enumerate_epoch():
    # Keras 3.5-3.6: `for step, iterator in epoch_iterator.enumerate_epoch()`.
    _patch_symbolic_build(lambda epoch: (it for _, it in epoch.enumerate_epoch()))


@SYMBOLIC_BUILD.variant(
    "3.7", "3.11", targets=[*_BUILD_TARGETS, f"{TRAINER}:TFEpochIterator.__next__"]
)
def _symbolic_build_step_and_iterator():
    # Keras 3.7-3.10: iterating the epoch iterator yields (step, iterator).
    _patch_symbolic_build(lambda epoch: (it for _, it in epoch))


@SYMBOLIC_BUILD.variant("3.11", targets=[*_BUILD_TARGETS, f"{TRAINER}:TFEpochIterator.__next__"])
def _symbolic_build_begin_end_iterator():
    # Keras 3.11 on: iterating the epoch iterator yields (begin_step, end_step, iterator).
    _patch_symbolic_build(lambda epoch: (it for _, _, it in epoch))


NO_XLA_ACROSS_REPLICAS = Fix(
    name="no_xla_step_across_replicas",
    summary=(
        "jit_compile=True XLA-compiles the function that contains strategy.run, one cluster "
        "touching every local replica's variables."
    ),
    upstream="TensorFlow XLA known issue (a tf.Variable on another device)",
    strategies=("mirrored",),
    consequence=(
        'compile(jit_compile=True) with several local replicas fails with "Trying to access '
        'resource ... located in device CPU:1 from device CPU:0".'
    ),
)


def _without_xla_across_replicas(original):
    # TensorFlow's XLA known issue "tf.Variable on a different device"; tf_keras fails the same
    # way on several local devices. Keras XLA-compiles a function that touches every local
    # replica's variables: "Trying to access resource .../replica_1/... located in device CPU:1
    # from device CPU:0". With more than one local replica, tfdist builds the step without XLA
    # and says so once. Returns `original` (a method building a step function) wrapped.
    import functools
    import warnings

    @functools.wraps(original)
    def build(self, *args, **kwargs):
        strategy = self._distribute_strategy
        if (
            strategy is None
            or not self.jit_compile
            or len(getattr(strategy.extended, "worker_devices", ())) <= 1
        ):
            return original(self, *args, **kwargs)
        warnings.warn(
            "jit_compile=True cannot compile a training step that spans several local replicas "
            f"({strategy.num_replicas_in_sync} here): XLA would place every replica's variables "
            "on one device. tfdist runs the step without XLA. HINT: compile(jit_compile=False) "
            "silences this; XLA works with one replica per process (multi_worker_mirrored).",
            stacklevel=2,
        )
        saved, self._jit_compile = self._jit_compile, False
        try:
            return original(self, *args, **kwargs)
        finally:
            self._jit_compile = saved

    return build


_MAKE_FUNCTIONS = ("make_train_function", "make_test_function", "make_predict_function")


@NO_XLA_ACROSS_REPLICAS.variant(
    "3.3",
    "3.7",
    targets=[TF_TRAINER.target(name, ("self", "force")) for name in _MAKE_FUNCTIONS],
)
def _no_xla_in_make_functions():
    # Keras 3.3-3.6: make_train/test/predict_function jit-compile the per-replica step itself.
    cls = TF_TRAINER.get()
    for name in _MAKE_FUNCTIONS:
        setattr(cls, name, _without_xla_across_replicas(getattr(cls, name)))


@NO_XLA_ACROSS_REPLICAS.variant(
    "3.7",
    targets=[TF_TRAINER.target("_make_function", ("self", "step_function"))],
)
def _no_xla_in_make_function():
    # Keras 3.7 on: the TensorFlow trainer's _make_function compiles the function that *contains*
    # strategy.run, one XLA cluster for every replica.
    cls = TF_TRAINER.get()
    cls._make_function = _without_xla_across_replicas(cls._make_function)

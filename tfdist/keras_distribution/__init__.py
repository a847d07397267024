"""Keras 3's own distribution API (`keras.distribution`) on the TensorFlow backend.

Keras 3 leaves `keras.distribution` a silent no-op on TensorFlow (its TensorFlow
`distribution_lib` is a prototype). tfdist carries it on tf.distribute instead:

    import tfdist          # before Keras builds variables; nothing else changes in the script
    import keras

    keras.distribution.initialize()          # multi-process: TF_CONFIG, tfdist launch, SLURM
    keras.distribution.set_distribution(keras.distribution.DataParallel())
    model = build_model(); model.compile(...); model.fit(dataset)

- `DataParallel` (and a `ModelParallel` that shards no variable) runs as a MirroredStrategy
  over the mesh's devices in one process, or as the job's MultiWorkerMirroredStrategy over
  several processes: setting the distribution makes that strategy current
  (`tf.distribute.experimental_set_strategy`), so variables, `model.fit` and custom loops use it.
- `ModelParallel` whose layouts split variables by rows over a model axis runs in one process,
  synchronously, each row shard on its own device of that axis (TensorFlow's ShardedVariable).
- Every other layout is refused with a message naming what to use instead.

Modules: `hook` (`import tfdist` installs this when Keras 3 with the TensorFlow backend is
imported; imports nothing), `records` (the Keras internals it patches, as fix records),
`processes` (`initialize`: the job's processes), `devices` (Keras device names <-> TensorFlow's),
`plans` (a Distribution -> what runs it, or a clear refusal), `bridge` (making a plan current:
the strategy, datasets, row-sharded variables).

tf_keras has no `keras.distribution`: with TF_USE_LEGACY_KERAS=1 nothing here is installed.
"""

from __future__ import annotations

__all__ = ["install", "installed"]


def install() -> list:
    """Installs tfdist's TensorFlow `distribution_lib` into Keras 3, once; never raises.

    Called by the import hook when Keras is imported (or by `import tfdist` when Keras already
    is). A no-op for another Keras backend and for tf_keras. Each patch is a checked record: a
    Keras release whose internals differ skips it with one CompatibilityWarning.

    Returns:
        list of str: the names of the records applied in this process.
    """
    from tfdist import flavour
    from tfdist.fixes import apply_fixes, register
    from tfdist.keras_distribution.records import RECORDS

    if flavour.uses_legacy_keras() or not _tensorflow_backend():
        return []
    from tfdist.fixes import registry

    if not all(record.name in registry.REGISTERED for record in RECORDS):
        register(RECORDS)
    applied = set(apply_fixes(RECORDS))
    return [record.name for record in RECORDS if record.name in applied]


def installed() -> bool:
    """True when Keras's TensorFlow distribution_lib is tfdist's in this process."""
    import sys

    module = sys.modules.get("keras.src.backend.tensorflow.distribution_lib")
    return bool(module is not None and getattr(module, "_tfdist", False))


def _tensorflow_backend() -> bool:
    try:
        from keras.src import backend
    except ImportError:
        return False
    return backend.backend() == "tensorflow"

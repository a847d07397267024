"""tfdist: TensorFlow distribution strategies that simply work with Keras.

    import tfdist

    strategy = tfdist.make_strategy()          # from TF_CONFIG, SLURM, or the local devices
    with strategy.scope():
        model = build_model()
        model.compile(optimizer="adam", loss="mse")
    model.fit(dataset, epochs=3)

What `import tfdist` does, and all it does:

- It checks the running Python (`tfdist.releases.check_python`): on one older than every tested
  TensorFlow / Keras pair installs on, it raises an ImportError that says which to use.
- It imports `tfdist.cluster` (`ClusterSpec`, `ClusterConfigError`, `detect_cluster`, with
  `tfdist.errors` and `tfdist.settings`) and `tfdist.keras_distribution.hook`: pure Python and
  the standard library. It imports neither TensorFlow nor Keras, so TensorFlow's runtime is not
  initialised and virtual devices and collectives can still be configured after it.
- Every other public name (`make_strategy`, `fit`, `launch`, `BackupAndRestore`, ...) imports
  its module when it is first used.
- It installs a Keras import hook (`tfdist.keras_distribution.hook.watch()`): a finder at the
  front of `sys.meta_path` that waits for the top-level `keras` package. Once Keras has been
  imported (by the script, or through `tf.keras`), the finder removes itself and tfdist installs
  its `keras.distribution` support, so that Keras 3's distribution API runs on tf.distribute
  instead of being a no-op on TensorFlow; until a distribution is set, Keras behaves as without
  tfdist. If Keras is already imported, that happens at once. It is a no-op for tf_keras
  (TF_USE_LEGACY_KERAS=1) and for another Keras backend, and a failure is a warning, never an
  import error. To opt out: `TFDIST_KERAS_FIXES=0` turns off every Keras patch of tfdist, these
  included; `TFDIST_KERAS_FIXES=-keras_distribution_backend` (and the other
  `keras_distribution_*` names) single ones.
- It sets no environment variable, and reads none until Keras is imported (the hook then
  reads TF_USE_LEGACY_KERAS and TFDIST_KERAS_FIXES); it changes no other global state.

Every task that `tfdist launch` starts imports tfdist at Python start-up, so the hook is in
place there even for a script that never imports tfdist.
"""

from tfdist.releases import check_python as _check_python

_check_python()  # first: on a Python tfdist cannot serve, this is the error to see

from tfdist.cluster import ClusterConfigError, ClusterSpec, detect_cluster  # noqa: E402
from tfdist.keras_distribution import hook as _keras_distribution_hook  # noqa: E402

__version__ = "0.1.0"

# Names whose modules import TensorFlow when used; resolved lazily (PEP 562).
_LAZY = {
    "make_strategy": "tfdist.strategy",
    "virtual_cpus": "tfdist.strategy",
    "local_devices": "tfdist.strategy",
    "resolve_strategy_name": "tfdist.strategy",
    "start_local_servers": "tfdist.strategy",
    "serve": "tfdist.strategy",
    "STRATEGY_NAMES": "tfdist.strategy",
    "exit_barrier": "tfdist.strategy",
    "set_precision": "tfdist.precision",
    "precision_scope": "tfdist.precision",
    "fit": "tfdist.training",
    "evaluate": "tfdist.training",
    "TaskUnavailableError": "tfdist.training",
    "distribute_dataset": "tfdist.data",
    "scale_learning_rate": "tfdist.learning_rate",
    "launch": "tfdist.launcher.restarts",
    "notebook_launch": "tfdist.launcher.notebook",
    "BackupAndRestore": "tfdist.preemption.callback",
    "Preempted": "tfdist.preemption",
    "PREEMPTED_EXIT_CODE": "tfdist.preemption",
}

__all__ = ["ClusterConfigError", "ClusterSpec", "detect_cluster", "__version__", *_LAZY]


def __getattr__(name):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'tfdist' has no attribute {name!r}")


def __dir__():
    return sorted(__all__)


# Keras 3's keras.distribution runs on tf.distribute once Keras is imported (TensorFlow
# backend); nothing is imported here.
_keras_distribution_hook.watch()

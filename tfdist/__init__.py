"""tfdist: TensorFlow distribution strategies that simply work with Keras.

    import tfdist

    strategy = tfdist.make_strategy()          # from TF_CONFIG, SLURM, or the local devices
    with strategy.scope():
        model = build_model()
        model.compile(optimizer="adam", loss="mse")
    model.fit(dataset, epochs=3)

`import tfdist` never initialises the TensorFlow runtime (nor imports TensorFlow), so virtual
devices and collectives can still be configured after it.
"""

from tfdist.cluster import ClusterConfigError, ClusterSpec, detect_cluster
from tfdist.keras_distribution import hook as _keras_distribution_hook

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

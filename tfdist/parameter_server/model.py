"""Building a given compiled model for parameter-server training: its variables on the ps.

`build_for_parameter_server` builds the model's weights, metrics, loss and optimizer inside the
strategy's scope (every variable then lives on the ps tasks), from one local batch of the data.
fit / evaluate call it; call it yourself to restore a checkpoint into the built model before
training. (Not to be confused with the `build_model` function given to `tfdist.fit`, which
makes and compiles the model.)

Holds no state.
"""

from __future__ import annotations

from typing import Callable, Optional

from tfdist import flavour
from tfdist.parameter_server.checks import check_strategy
from tfdist.parameter_server.datasets import local_batch
from tfdist.parameter_server.tf_keras import prepare_model

__all__ = ["build_for_parameter_server"]


def _check_model(model, strategy, method: str) -> None:
    model._assert_compile_called(method)
    if getattr(model, "_distribute_strategy", None) is not strategy:
        raise ValueError(
            f"The model passed to {method} was not created inside this parameter-server "
            "strategy's scope, so its variables do not live on the ps tasks. HINT: build and "
            "compile it inside the scope: `with strategy.scope(): model = build(); "
            "model.compile(...)`."
        )


def build_for_parameter_server(
    model, strategy, dataset_fn: Optional[Callable] = None, *, sample_batch=None
):
    """Builds `model`'s weights, metrics, loss and optimizer on the ps tasks of `strategy`.

    `fit_parameter_server` / `evaluate_parameter_server` call this; call it yourself to restore
    a checkpoint into the built model (immediate restore) before training.

    Args:
        model: a compiled Keras model (Keras 3 or tf_keras), created inside
            `strategy.scope()`.
        strategy: tf.distribute.ParameterServerStrategy.
        dataset_fn: callable(InputContext) -> tf.data.Dataset. Used for one local batch when
            `sample_batch` is None.
        sample_batch: one batch (x, y[, sample_weight]) with the shapes and dtypes of the
            training data. Defaults to the first batch of `dataset_fn`.
    """
    if flavour.uses_legacy_keras():
        check_strategy(strategy)
        prepare_model(model, strategy, dataset_fn, None, sample_batch)
        with strategy.scope():
            model.optimizer.build(model.trainable_variables)
        return
    build_keras3(model, strategy, dataset_fn, sample_batch, "build_for_parameter_server")


def build_keras3(model, strategy, dataset_fn, sample_batch, method: str) -> None:
    """`build_for_parameter_server` for a Keras 3 model; errors name the caller, `method`."""
    check_strategy(strategy)
    _check_model(model, strategy, method)
    if sample_batch is None:
        if dataset_fn is None:
            raise ValueError(
                "build_for_parameter_server needs `dataset_fn` or `sample_batch` (one batch)."
            )
        sample_batch = local_batch("dataset_fn", dataset_fn)
    with strategy.scope():
        model._symbolic_build(data_batch=sample_batch)

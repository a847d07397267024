"""The argument checks that every entry point of parameter-server training shares.

Counts (steps, epochs), the strategy (a ParameterServerStrategy, the coordinator side) and
dataset functions, each refused with a message quoting the value and saying what was expected.

TensorFlow is imported inside functions only. Holds no state.
"""

from __future__ import annotations

from tfdist.errors import is_count


def check_count(name: str, value, *, minimum: int = 1) -> int:
    """`value`, when it is an integer >= `minimum`; else a ValueError naming `name`."""
    if not is_count(value, minimum):
        kind = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise ValueError(f"`{name}` must be {kind}. Received: {name}={value!r}.")
    return value


def check_strategy(strategy) -> None:
    """Refuses anything but a ParameterServerStrategy (TypeError)."""
    import tensorflow as tf

    if not isinstance(strategy, tf.distribute.ParameterServerStrategy):
        raise TypeError(
            "Parameter-server training needs a tf.distribute.ParameterServerStrategy (the "
            f"coordinator side). Received: strategy={strategy!r} (of type "
            f"{type(strategy).__name__}). HINT: tfdist.make_strategy('parameter_server') in the "
            "chief of a job with ps tasks."
        )


def check_dataset_fn(name: str, dataset_fn) -> None:
    """Refuses a `dataset_fn` that is not callable (TypeError naming `name`)."""
    if not callable(dataset_fn):
        raise TypeError(
            f"`{name}` must be a function of a tf.distribute.InputContext that returns a "
            f"tf.data.Dataset of batches. Received: {name}={dataset_fn!r} (of type "
            f"{type(dataset_fn).__name__})."
        )

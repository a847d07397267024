"""What kind of input the data are, decided once: arrays, a tf.data.Dataset or a dataset function.

    source = classify((x, y))          # Input(kind="arrays", value=(x, y) as numpy, length=...)
    steps_per_pass(source, 64)         # the later steps take the Input, never the raw data again

`classify` converts arrays into a nest of numpy arrays (refusing strings, scalars, arrays of
different lengths and empty arrays) and reads a dataset's length once. The public functions of
`tfdist.data` accept the raw data too (`as_input` classifies it for them), so a caller that
has several steps to run classifies once and passes the `Input`.

TensorFlow is imported inside the functions only.
"""

from __future__ import annotations

import collections.abc
import dataclasses
from typing import Any, Optional

__all__ = ["ARRAYS", "DATASET", "FUNCTION", "Input", "as_input", "classify", "refuse_empty"]

ARRAYS, DATASET, FUNCTION = "arrays", "dataset", "function"


@dataclasses.dataclass(frozen=True, eq=False)
class Input:
    """Data classified once.

    Attributes:
        kind: str. `ARRAYS`, `DATASET` or `FUNCTION`.
        value: the nest of numpy arrays (arrays), the tf.data.Dataset (dataset), or the
            `dataset_fn(input_context)` (function).
        length: int or None. Examples of the arrays; elements of a dataset of known, finite
            cardinality (examples, or batches of a batched dataset); None otherwise.
    """

    kind: str
    value: Any
    length: Optional[int] = None

    def __repr__(self):
        return f"<tfdist.data.Input {self.kind} length={self.length}>"


def classify(data) -> Input:
    """What kind of input `data` is, with arrays converted and a dataset's length read.

    Args:
        data: a tf.data.Dataset, a dataset_fn(input_context), or numpy arrays x, (x, y),
            (x, y, sample_weight) (tuples, lists of arrays or dicts of arrays nested inside).

    Returns:
        Input.

    Raises:
        TypeError: a distributed dataset, or arrays holding None or strings.
        ValueError: a scalar, a tuple of more than 3 items, arrays of different lengths,
            empty arrays.
    """
    import tensorflow as tf

    if isinstance(data, tf.distribute.DistributedDataset):
        raise TypeError(
            "data is already a distributed dataset. HINT: pass the tf.data.Dataset (or a "
            "dataset_fn) before distributing it."
        )
    if isinstance(data, tf.data.Dataset):
        cardinality = tf.get_static_value(data.cardinality())  # symbolic inside a tf.function
        known = cardinality is not None and cardinality >= 0  # not INFINITE (-1), UNKNOWN (-2)
        return Input(DATASET, data, int(cardinality) if known else None)
    if callable(data) and not hasattr(data, "shape"):
        return Input(FUNCTION, data)
    structure, examples = _as_structure(data)
    return Input(ARRAYS, structure, examples)


def as_input(data) -> Input:
    """`data` itself when it is already an `Input`, else `classify(data)`."""
    return data if isinstance(data, Input) else classify(data)


def refuse_empty(source: Input) -> None:
    """A dataset known to be empty would end training before its first step (arrays are
    refused by `classify`)."""
    if source.kind == DATASET and source.length == 0:
        raise ValueError(
            f"data is an empty tf.data.Dataset (cardinality 0): {source.value!r}. HINT: check "
            "its source, filter, take() or batch(drop_remainder=True) with fewer examples "
            "than one batch."
        )


def _convert(value, where: str):
    """One item of the data -> a numpy array, or a tuple / dict of them."""
    import numpy as np
    import tensorflow as tf

    if isinstance(value, collections.abc.Mapping):
        return {k: _convert(v, f"{where}[{k!r}]") for k, v in value.items()}
    if isinstance(value, tuple) or (
        isinstance(value, list)
        and value
        and all(
            isinstance(v, (np.ndarray, tf.Tensor, tuple, collections.abc.Mapping)) for v in value
        )
    ):
        # a tuple, or a list of arrays (Keras: several inputs); a list of numbers or of
        # lists is one array
        return tuple(_convert(v, f"{where}[{i}]") for i, v in enumerate(value))
    if isinstance(value, tf.Tensor):
        return value.numpy()
    if value is None or isinstance(value, (str, bytes)):
        raise TypeError(
            f"data{where} is {value!r}. HINT: data is a tf.data.Dataset, a "
            "dataset_fn(input_context), or numpy arrays x, (x, y) or (x, y, "
            "sample_weight) (dicts of arrays allowed)."
        )
    array = np.asarray(value)
    if array.ndim == 0:
        raise ValueError(
            f"data{where} is a scalar ({value!r}); arrays need a first (example) dimension."
        )
    return array


def _as_structure(data):
    """numpy arrays x / (x, y) / (x, y, sample_weight) / dicts -> (nest of numpy arrays,
    number of examples)."""
    import tensorflow as tf

    structure = _convert(data, "")
    if isinstance(structure, tuple) and not 1 <= len(structure) <= 3:
        raise ValueError(
            f"data as a tuple is (x,), (x, y) or (x, y, sample_weight). Received a "
            f"{type(data).__name__} of {len(structure)} items. HINT: group multiple inputs as "
            "a tuple or dict inside x: ((x1, x2), y)."
        )
    lengths = {len(a) for a in tf.nest.flatten(structure)}
    if len(lengths) != 1:
        shapes = tf.nest.map_structure(lambda a: len(a), structure)
        raise ValueError(
            f"The arrays in data have different numbers of examples: {shapes}. HINT: every "
            "array needs the same first dimension."
        )
    examples = lengths.pop()
    if examples == 0:
        shapes = tf.nest.map_structure(lambda a: a.shape, structure)
        raise ValueError(
            f"data is empty: its arrays have 0 examples (shapes {shapes}). HINT: check that "
            "the data was loaded (a filter or a split can leave nothing)."
        )
    return structure, examples

"""`features=`: parsing batches of serialized tf.train.Example records, and its checks.

`tf.io.parse_example` parses a whole batch of records in one call, several times faster than a
per-record `map_fn`. The checks here refuse, with the fix, what would otherwise fail inside a
dataset's trace: a spec that is not a dict of tf.io features, a feature tf.io.parse_example
refuses, `map_fn=` beside it, and data that are not serialized records.

TensorFlow is imported inside the functions only; `check_features_container` needs none.
"""

from __future__ import annotations

import re
from typing import Mapping, Optional

__all__ = [
    "FEATURE_TYPES",
    "check_features",
    "check_features_container",
    "check_record_arrays",
    "check_records",
    "parse_batches",
]

FEATURE_TYPES = (
    "FixedLenFeature",
    "VarLenFeature",
    "FixedLenSequenceFeature",
    "SparseFeature",
    "RaggedFeature",
)


def check_features_container(features, map_fn) -> None:
    """The checks of `features` that need no TensorFlow: a non-empty dict with str keys, and
    no `map_fn` beside it."""
    if features is None:
        return
    if not isinstance(features, Mapping):
        raise TypeError(
            "features must be a dict of feature name -> tf.io.FixedLenFeature / "
            f"VarLenFeature / ... . Received: features={features!r} (of type "
            f"{type(features).__name__}). HINT: e.g. features={{'x': "
            "tf.io.FixedLenFeature([64], tf.float32), 'y': tf.io.FixedLenFeature([], "
            "tf.int64)}."
        )
    if not features:
        raise ValueError(
            "features is an empty dict, so no feature would be parsed. HINT: name every "
            "feature of the tf.train.Example records to read, e.g. {'x': "
            "tf.io.FixedLenFeature([64], tf.float32)}; or leave features=None."
        )
    for name in features:
        if not isinstance(name, str) or not name:
            raise TypeError(
                f"features keys are the feature names of the tf.train.Example records (non-"
                f"empty str). Received the key {name!r} (of type {type(name).__name__}). "
                "HINT: use the name under which the feature was written, e.g. 'x'."
            )
    if map_fn is not None:
        raise ValueError(
            f"features= and map_fn= cannot be combined: map_fn ({map_fn!r}) maps single "
            "records before batching, features= parses whole batches of records after "
            "batching, so map_fn would see serialized records. HINT: transform the parsed "
            "batch with batch_map_fn= (it receives the dict of parsed features, e.g. "
            "batch_map_fn=lambda f: (f['x'], f['y'])), or parse per record in map_fn and "
            "drop features=."
        )


def check_features(features) -> Optional[dict]:
    """`features` as a plain dict, each value checked: a tf.io feature TensorFlow can parse.

    Parses an empty batch with each feature once, so that a feature tf.io.parse_example
    refuses fails here with its name, not later inside a dataset's trace.

    Returns:
        dict of feature name -> tf.io feature, or None for `features=None`.
    """
    if features is None:
        return None
    import tensorflow as tf

    spec = dict(features)
    allowed = tuple(getattr(tf.io, name) for name in FEATURE_TYPES)
    for name, feature in spec.items():
        if not isinstance(feature, allowed):
            raise TypeError(
                f"features[{name!r}] is {feature!r} (of type {type(feature).__name__}), not a "
                "tf.io feature. HINT: describe each feature with one of tf.io."
                f"{', tf.io.'.join(FEATURE_TYPES)}, e.g. features[{name!r}] = "
                "tf.io.FixedLenFeature([], tf.int64)."
            )
        dtype = getattr(feature, "dtype", None)
        if dtype is not None and tf.as_dtype(dtype) not in (tf.float32, tf.int64, tf.string):
            raise ValueError(
                f"features[{name!r}] has dtype {tf.as_dtype(dtype).name}, but tf.train.Example "
                "stores only float32 (FloatList), int64 (Int64List) and string (BytesList). "
                f"HINT: parse it as one of those (e.g. tf.io.FixedLenFeature(shape, "
                "tf.float32)) and cast it in batch_map_fn=."
            )
    for name, feature in spec.items():
        _check_parses(name, feature)
    return spec


def _check_parses(name: str, feature) -> None:
    import tensorflow as tf

    try:
        tf.io.parse_example(tf.constant([], tf.string), {name: feature})
    except (ValueError, TypeError, tf.errors.OpError) as err:
        reason = re.sub(r"\{\{[^}]*\}\}\s*|\s*\[Op:\w+\]", "", str(err)).strip()
        reason = reason.splitlines()[-1].rstrip(".") if reason else type(err).__name__
        raise ValueError(
            f"features[{name!r}] = {feature!r} is not a feature tf.io.parse_example "
            f"accepts: {reason}. HINT: a FixedLenFeature needs a fully known shape (e.g. "
            "[64], or [] for a scalar) and a default_value of that shape if any; a "
            "FixedLenSequenceFeature needs allow_missing=True; for a feature of varying "
            "length use tf.io.VarLenFeature or tf.io.RaggedFeature."
        ) from None


def _arrays_spec(structure):
    import tensorflow as tf

    def spec(array):
        kind = array.dtype.kind
        dtype = tf.string if kind in "SOU" else tf.as_dtype(array.dtype)
        return tf.TensorSpec(array.shape[1:], dtype)

    return tf.nest.map_structure(spec, structure)


def check_record_arrays(structure) -> None:
    """features= on arrays: one array of serialized records, not numpy fixed-width bytes."""
    check_records(_arrays_spec(structure), "data (arrays)")
    if structure.dtype.kind == "S":
        raise ValueError(
            f"features= with a numpy array of dtype {structure.dtype}: numpy's fixed-width "
            "bytes drop the trailing zero bytes of every value, which cuts serialized records "
            "that end in one. HINT: keep the records as np.array(records, dtype=object), or "
            "pass tf.data.TFRecordDataset(files)."
        )


def check_records(element_spec, what: str) -> None:
    """features= parses serialized records: the examples must be scalar tf.string."""
    import tensorflow as tf

    if not (
        isinstance(element_spec, tf.TensorSpec)
        and element_spec.dtype == tf.string
        and element_spec.shape.rank in (0, None)
    ):
        raise ValueError(
            f"features= parses serialized tf.train.Example records, so {what} must yield "
            f"one scalar tf.string per example. Received examples of {element_spec!r}. "
            "HINT: pass the records themselves (e.g. tf.data.TFRecordDataset(files)), or, "
            "for examples already parsed, drop features= (and use map_fn= / batch_map_fn=)."
        )


def parse_batches(dataset, features: dict):
    """Each batch of serialized records -> the dict of parsed features, in parallel, in order."""
    import tensorflow as tf

    return dataset.map(
        lambda records: tf.io.parse_example(records, features),
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=True,
    )

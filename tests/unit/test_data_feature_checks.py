"""tfdist.data, tier 1: the checks of `features=` that need no TensorFlow (its container, its
keys, and its combination with map_fn). The parsing itself: tests/inprocess/test_data.py."""

import pytest

from tfdist.data import dataset_fn_for


def per_record(record):
    return record


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (
            dict(features=["x", "y"]),
            TypeError,
            r"features must be a dict of feature name -> tf\.io\.FixedLenFeature.*"
            r"Received: features=\['x', 'y'\] \(of type list\)\. HINT: e\.g\. features=\{'x'",
        ),
        (
            dict(features="x"),
            TypeError,
            r"Received: features='x' \(of type str\)",
        ),
        (
            dict(features={}),
            ValueError,
            r"features is an empty dict, so no feature would be parsed\. HINT: name every "
            r"feature",
        ),
        (
            dict(features={1: None}),
            TypeError,
            r"features keys are the feature names.*Received the key 1 \(of type int\)\. "
            r"HINT: use the name under which the feature was written",
        ),
        (
            dict(features={"": None}),
            TypeError,
            r"Received the key '' \(of type str\)",
        ),
        (
            dict(features={"x": None}, map_fn=per_record),
            ValueError,
            r"features= and map_fn= cannot be combined: map_fn \(<function per_record.*"
            r"HINT: transform the parsed batch with batch_map_fn=",
        ),
    ],
)
def test_bad_features_are_refused_with_the_fix(kwargs, error, match):
    # checked before anything looks at the data (or imports TensorFlow)
    with pytest.raises(error, match=match):
        dataset_fn_for(object(), 8, **kwargs)

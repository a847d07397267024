"""Gradient compression on mirrored (4 virtual CPUs in this process): the cast reaches a custom
loop's step, `model.fit` and `tfdist.fit`. multi_worker_mirrored and tf_keras:
tests/cluster/test_gradient_compression.py."""

import keras
import pytest
import tensorflow as tf

import tfdist

from helpers.compression import (
    NOT_BFLOAT16,
    OVER_FLOAT16,
    build_digits_classifier,
    digits,
    one_step,
    within_one_percent,
)

SINGLE = tfdist.ClusterSpec({})
MODES = (None, "bf16", "fp16")


def _mirrored(mode):
    return tfdist.make_strategy("mirrored", cluster=SINGLE, gradient_compression=mode)


def test_a_custom_loop_step_sums_the_cast_gradients(virtual_cpus):
    steps = {str(mode): one_step(keras, tf, _mirrored(mode), NOT_BFLOAT16) for mode in MODES}
    # bfloat16 rounds each replica's (1 + 2**-10) / 4 to 1/4; float16 and float32 hold it
    assert steps == {"None": -NOT_BFLOAT16, "bf16": -1.0, "fp16": -NOT_BFLOAT16}
    # float16: each replica sends its gradient / 4, so the sum on the wire never overflows
    assert one_step(keras, tf, _mirrored("fp16"), OVER_FLOAT16) == -OVER_FLOAT16


@pytest.mark.parametrize("trainer", ["model.fit", "tfdist.fit"])
def test_fit_with_compression_keeps_the_loss_within_one_percent(virtual_cpus, trainer):
    x, y = digits()
    losses = {}
    for mode in MODES:
        strategy = _mirrored(mode)
        if trainer == "tfdist.fit":
            history = tfdist.fit(
                lambda: build_digits_classifier(keras, seed=0),
                (x, y),
                strategy=strategy,
                global_batch_size=64,
                verbose=0,
            )
        else:
            with strategy.scope():
                model = build_digits_classifier(keras, seed=0)
            history = model.fit(x, y, batch_size=64, epochs=1, shuffle=False, verbose=0)
        losses[str(mode)] = history.history["loss"][-1]
    assert not within_one_percent(losses), losses

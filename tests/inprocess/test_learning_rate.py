"""tfdist.learning_rate, tier 2: the linear scaling rule with warmup, as a Keras schedule (its
values, a base schedule followed, a strategy as the replica count, serialization) and the
values it refuses."""

import pytest
import tensorflow as tf

import tfdist
from tfdist.learning_rate import scale_learning_rate

SINGLE = tfdist.ClusterSpec({})


def test_linear_scaling_with_warmup_values():
    import keras

    schedule = scale_learning_rate(0.1, 8, warmup_steps=100)
    assert isinstance(schedule, keras.optimizers.schedules.LearningRateSchedule)
    values = [float(schedule(step)) for step in (0, 50, 100, 1000)]
    # step 0: the single-replica rate; halfway: 0.1 x (1 + 7 x 0.5); then 0.1 x 8
    assert values == pytest.approx([0.1, 0.45, 0.8, 0.8])
    assert float(scale_learning_rate(0.1, 8)(0)) == pytest.approx(0.8)  # no warmup
    assert float(scale_learning_rate(0.1, 1, warmup_steps=10)(5)) == pytest.approx(0.1)


def test_scaling_follows_a_base_schedule_and_takes_a_strategy(virtual_cpus):
    import keras

    decay = keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=10, decay_rate=0.5)
    strategy = tfdist.make_strategy("mirrored", cluster=SINGLE)
    schedule = scale_learning_rate(decay, strategy, warmup_steps=10)
    assert float(schedule(0)) == pytest.approx(0.1)
    assert float(schedule(10)) == pytest.approx(0.05 * 4)
    assert float(schedule(20)) == pytest.approx(0.025 * 4)
    assert float(schedule(5)) == pytest.approx(0.1 * 0.5**0.5 * (1 + 3 * 0.5))


def test_schedule_works_in_a_keras_optimizer_and_round_trips():
    import keras

    schedule = scale_learning_rate(0.01, 4, warmup_steps=4, name="scaled")
    optimizer = keras.optimizers.SGD(learning_rate=schedule)
    variable = keras.Variable(1.0)
    rates = []
    for _ in range(6):
        rates.append(float(optimizer.learning_rate))
        optimizer.apply([tf.constant(1.0)], [variable])
    assert rates == pytest.approx([0.01, 0.0175, 0.025, 0.0325, 0.04, 0.04])
    config = keras.optimizers.schedules.serialize(schedule)
    again = keras.optimizers.schedules.deserialize(config)
    assert type(again) is type(schedule) and float(again(2)) == pytest.approx(0.025)
    decay = keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=10, decay_rate=0.5)
    nested = scale_learning_rate(decay, 2, warmup_steps=3)
    restored = type(nested).from_config(nested.get_config())
    assert float(restored(7)) == pytest.approx(float(nested(7)))


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        (
            dict(base_lr=0.1, num_replicas=0),
            ValueError,
            r"num_replicas must be a positive int or a "
            r"strategy\. Received: num_replicas=0",
        ),
        (dict(base_lr=0.1, num_replicas=2, warmup_steps=-1), ValueError, r"warmup_steps=-1"),
        (dict(base_lr=-0.1, num_replicas=2), ValueError, r"base_lr must be a positive number"),
        (
            dict(base_lr="0.1", num_replicas=2),
            TypeError,
            r"base_lr must be a float or a "
            r"LearningRateSchedule",
        ),
    ],
)
def test_scale_learning_rate_bad_values(kwargs, error, match):
    with pytest.raises(error, match=match):
        scale_learning_rate(**kwargs)

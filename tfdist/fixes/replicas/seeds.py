"""The fix of random draws under a strategy: a different dropout mask (and other random values)
per replica.

Nothing here imports TensorFlow or Keras at import time.
"""

from tfdist.fixes.keras_backend import IMAGE_OPS, RANDOM_OPS
from tfdist.fixes.record import Fix, Target

PER_REPLICA_SEEDS = Fix(
    name="different_random_draws_per_replica",
    summary=(
        "Random layers draw from a mirrored seed, so every replica draws the same dropout mask."
    ),
    upstream="none found",
    strategies=("mirrored", "multi_worker_mirrored"),
    consequence="every replica draws the same Dropout mask (no error; weaker regularisation).",
)


_SEED_TARGETS = [
    Target("keras.src.random.seed_generator:draw_seed", ("seed",)),
    RANDOM_OPS.target("draw_seed", ("seed",)),
    "keras.src.random.seed_generator:SeedGenerator",
]


@PER_REPLICA_SEEDS.variant("3.3", "3.10", targets=_SEED_TARGETS)
def _per_replica_seeds_random():
    # Keras 3.3-3.9: the TensorFlow backend's random ops are the only users of draw_seed.
    _patch_draw_seed(image=False)


@PER_REPLICA_SEEDS.variant(
    "3.10", targets=[*_SEED_TARGETS, IMAGE_OPS.target("draw_seed", ("seed",))]
)
def _per_replica_seeds_random_and_image():
    # Keras 3.10 on: random image ops (keras/src/backend/tensorflow/image.py, ops/image.py from
    # Keras 3.16) draw seeds too.
    _patch_draw_seed(image=True)


def _patch_draw_seed(image: bool):
    # No upstream issue found. Keras 3 draws dropout masks and other random values with
    # tf.random.stateless_* seeded from a SeedGenerator's state variable
    # (keras/src/random/seed_generator.py draw_seed); under a strategy that variable is
    # mirrored, so every replica draws the same mask (tf_keras drew per-device masks), which
    # silently weakens regularisation. The fix folds the replica id into the seed, in replica
    # context with more than one replica only: runs stay reproducible with
    # keras.utils.set_random_seed, explicit integer seeds and single-device runs are unchanged,
    # and initialisers (cross-replica context) still give every replica the same weights.
    import tensorflow as tf
    from keras.src.random import seed_generator

    original = seed_generator.draw_seed

    def draw_seed(seed):
        drawn = original(seed)
        if seed is not None and not isinstance(seed, seed_generator.SeedGenerator):
            return drawn
        if not tf.distribute.has_strategy() or tf.distribute.in_cross_replica_context():
            return drawn
        context = tf.distribute.get_replica_context()
        if context is None or context.num_replicas_in_sync <= 1:
            return drawn
        folded = tf.random.experimental.stateless_fold_in(
            tf.cast(drawn, tf.int64), tf.cast(context.replica_id_in_sync_group, tf.int64)
        )
        return tf.cast(folded, drawn.dtype)

    RANDOM_OPS.get().draw_seed = draw_seed
    if image:
        IMAGE_OPS.get().draw_seed = draw_seed

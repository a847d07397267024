"""Fixes for replicas of one model: the plain Keras 3 idiom under mirrored (and every strategy).

The sums over the replicas (`sums`: gradients, metric totals, the loss scaled for them; and
`logged_loss`: the loss a custom step logs, scaled back), the optimizer (`optimizer`: made
outside the scope, the mixed_float16 skip decided by all replicas, gradient accumulation), the
trainer (`trainer`: the symbolic build, XLA across local
replicas) and random draws (`seeds`: per replica). Each is a `Fix` record (see
tfdist/fixes/record.py): a no-op outside the strategies it concerns, with a test that fails
without it. `FIXES` lists them in the order they are applied.

Nothing here imports TensorFlow or Keras at import time.
"""

from tfdist.fixes.replicas.logged_loss import CUSTOM_STEP_LOSS
from tfdist.fixes.replicas.optimizer import (
    GRADIENT_ACCUMULATION,
    LOSS_SCALE_SKIP,
    OPTIMIZER_OUTSIDE_SCOPE,
)
from tfdist.fixes.replicas.seeds import PER_REPLICA_SEEDS
from tfdist.fixes.replicas.sums import GRADIENTS_SUMMED, LOSS_SCALED_FOR_REPLICAS, METRICS_SUMMED
from tfdist.fixes.replicas.trainer import NO_XLA_ACROSS_REPLICAS, SYMBOLIC_BUILD

FIXES = (
    GRADIENTS_SUMMED,
    METRICS_SUMMED,
    LOSS_SCALED_FOR_REPLICAS,
    CUSTOM_STEP_LOSS,
    OPTIMIZER_OUTSIDE_SCOPE,
    LOSS_SCALE_SKIP,
    SYMBOLIC_BUILD,
    GRADIENT_ACCUMULATION,
    PER_REPLICA_SEEDS,
    NO_XLA_ACROSS_REPLICAS,
)

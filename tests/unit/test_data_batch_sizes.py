"""tfdist.data, tier 1: the per-replica batch size of a global batch, and the sizes it
refuses (no TensorFlow). The rest of tfdist.data: tests/inprocess/test_data.py."""

import pytest

from tfdist.data import per_replica_batch_size

# ------------------------------------------------------------------------- batch sizes


@pytest.mark.parametrize(
    "global_batch, replicas, expected", [(32, 4, 8), (8, 8, 1), (7, 1, 7), (64, 2, 32)]
)
def test_per_replica_batch_size(global_batch, replicas, expected):
    assert per_replica_batch_size(global_batch, replicas) == expected


@pytest.mark.parametrize(
    "global_batch, replicas, error, match",
    [
        (
            30,
            4,
            ValueError,
            r"global_batch_size=30 is not divisible by the 4 replicas in sync.*"
            r"HINT: use a multiple of 4, e\.g\. global_batch_size=28 \(per-replica "
            r"batch 7\) or 32 \(per-replica batch 8\)\.",
        ),
        (
            3,
            4,
            ValueError,
            r"global_batch_size=3 is not divisible by the 4 replicas.*"
            r"e\.g\. global_batch_size=4 \(per-replica batch 1\)\.$",
        ),
        (0, 4, ValueError, r"global_batch_size must be >= 1\. Received: global_batch_size=0"),
        (32, 0, ValueError, r"num_replicas must be >= 1"),
        (
            32.0,
            4,
            TypeError,
            r"global_batch_size must be an int\. Received: global_batch_size=32\.0 "
            r"\(of type float\)",
        ),
        (True, 4, TypeError, r"must be an int"),
    ],
)
def test_per_replica_batch_size_refuses_bad_values(global_batch, replicas, error, match):
    with pytest.raises(error, match=match):
        per_replica_batch_size(global_batch, replicas)

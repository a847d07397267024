"""tfdist.fit / tfdist.evaluate on multi_worker_mirrored: every epoch trains its steps on 2
workers, once with Keras 3 and once with tf_keras (TF_USE_LEGACY_KERAS=1)."""

import pytest

from helpers.training import _assert_every_epoch_trained_its_steps, epochs_of_each_fit

FLAVOURS = {"keras3": {}, "tf_keras": {"TF_USE_LEGACY_KERAS": "1"}}


@pytest.fixture(scope="module")
def two_workers():
    """Both flavours' 2-worker jobs, at the same time."""
    import concurrent.futures

    from tfdist.testing import run_cluster

    with concurrent.futures.ThreadPoolExecutor(len(FLAVOURS)) as pool:
        futures = {
            flavour: pool.submit(run_cluster, epochs_of_each_fit, workers=2, env=env, timeout=300)
            for flavour, env in FLAVOURS.items()
        }
        return {flavour: future.result() for flavour, future in futures.items()}


@pytest.mark.slow
@pytest.mark.parametrize("flavour", sorted(FLAVOURS))
def test_each_epoch_trains_its_steps_on_two_workers(two_workers, flavour):
    # tf_keras needs the steps of a distributed dataset ("When providing a distributed
    # dataset, you must specify the number of steps to run"): tfdist gives them
    first, second = (two_workers[flavour][f"worker:{i}"].value for i in range(2))
    assert first["keras"].startswith("tf_keras") == (flavour == "tf_keras")
    _assert_every_epoch_trained_its_steps(first)
    assert first == second

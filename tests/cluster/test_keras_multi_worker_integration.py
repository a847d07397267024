"""The plain Keras idiom under multi_worker_mirrored: 2 real processes on loopback.

One job per configuration runs every scenario (process start-up costs seconds): with
tfdist's fixes, without them (the upstream failure), without single fixes (each is needed),
and on tf_keras. Three jobs run at a time.
"""

import concurrent.futures
import glob
import os
import tempfile

import pytest

from tfdist import flavour
from tfdist.fixes.record import NOT_NEEDED
from tfdist.testing import run_cluster

from helpers import keras_scenarios as scenarios

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def jobs():
    configurations = {
        "tfdist": {},
        "no_fixes": {"TFDIST_KERAS_FIXES": "0"},
        "tf_keras": {"TF_USE_LEGACY_KERAS": "1"},
        "no_loop_fix": {
            "TFDIST_KERAS_FIXES": "-multi_worker_steps_per_execution",
            "TFDIST_PROGRESS": "all",
        },
        "no_mean_fix": {"TFDIST_KERAS_FIXES": "-multi_worker_mean_of_metric_results"},
    }
    names = {
        "tfdist": scenarios.MULTI_WORKER,
        "no_fixes": ["fit_evaluate_predict"],
        "no_mean_fix": ["fit_evaluate_predict"],
        "no_loop_fix": ["steps_per_execution", "progress_bar", "all_reduces_per_step"],
        "tf_keras": [n for n in scenarios.MULTI_WORKER if n not in scenarios.NOT_IN_TF_KERAS],
    }
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        futures = {
            key: pool.submit(
                run_cluster,
                scenarios.in_multi_worker,
                workers=2,
                args=(names[key],),
                env=env,
                timeout=900,
            )
            for key, env in configurations.items()
        }
        runs = {key: future.result() for key, future in futures.items()}
    for run in runs.values():  # each worker's output, for the tests of what is printed
        for i in range(2):
            run[f"worker:{i}"].value["output"] = run[f"worker:{i}"].output
    return {key: [run[f"worker:{i}"].value for i in range(2)] for key, run in runs.items()}


def both(jobs, configuration, name):
    results = []
    for worker in jobs[configuration]:
        result = worker["results"][name]
        assert "ok" in result, result["error"] + "\n" + result["where"]
        results.append(result["ok"])
    return results


def test_fit_evaluate_predict_on_two_workers(jobs):
    for worker in jobs["tfdist"]:
        assert worker["strategy"] == "CollectiveAllReduceStrategy" and worker["replicas"] == 2
    first, second = both(jobs, "tfdist", "fit_evaluate_predict")
    for key in ("xy_loss", "weighted_loss", "dict_loss"):
        assert first[key][-1] < first[key][0], key
        assert first[key] == second[key], key  # the global loss, the same on both workers
    for key in ("xy_weights", "weighted_weights", "dict_weights"):
        assert first[key] == second[key], key  # identical weights on both workers
    assert first["evaluate"] == second["evaluate"]
    assert first["predict_shape"] == [64, 1] and first["predict_matches_call"] < 1e-5


MEAN_OF_LOGS = "Invalid reduction dimension 0 for input with 0 dimensions"


def test_a_step_all_reduces_all_its_logs_in_one_collective(jobs):
    """Three logs cost the step no more all-reduces than one (upstream: one per log), with the
    step built by tfdist (Keras 3.7 on) and with Keras' own (the loop fix off); every worker
    logs the same global values."""
    for configuration in ("tfdist", "no_loop_fix"):
        first, second = both(jobs, configuration, "all_reduces_per_step")
        for result in (first, second):
            assert result["three_logs"]["all_reduces"] == result["one_log"]["all_reduces"]
            assert sorted(result["three_logs"]["logs"]) == ["loss", "mae", "mse"]
        assert first["three_logs"]["logs"] == second["three_logs"]["logs"], configuration


def test_keras_3_alone_fails_where_tfdist_works(jobs):
    # the symbolic build fails first where Keras has one (3.5 on), else the mean of the logs
    for worker in jobs["no_fixes"]:
        result = worker["results"]["fit_evaluate_predict"]
        if scenarios.fix_state("symbolic_build_from_a_local_batch") == NOT_NEEDED:
            scenarios.fails_upstream(result, "multi_worker_mean_of_metric_results", MEAN_OF_LOGS)
        else:
            text = "Attempt to convert a value (PerReplica"
            scenarios.fails_upstream(result, "symbolic_build_from_a_local_batch", text)


def test_each_multi_worker_fix_is_needed(jobs):
    for worker in jobs["no_mean_fix"]:
        result = worker["results"]["fit_evaluate_predict"]
        scenarios.fails_upstream(result, "multi_worker_mean_of_metric_results", MEAN_OF_LOGS)


def test_steps_per_execution_fails_on_two_workers_without_its_fix(jobs):
    for worker in jobs["no_loop_fix"]:
        result = worker["results"]["steps_per_execution"]
        scenarios.fails_upstream(
            result,
            "multi_worker_steps_per_execution",
            "You must feed a value for placeholder tensor",
        )


def test_two_workers_train_exactly_as_one_device_with_the_global_batch(jobs):
    for result in both(jobs, "tfdist", "matches_one_device"):
        assert result["moved"] > 0.05
        assert result["max_weight_difference"] < 1e-5


def test_gradient_accumulation_and_steps_per_execution(jobs):
    for result in both(jobs, "tfdist", "gradient_accumulation"):
        assert result["iterations"] == result["one_device_iterations"] in (4, 8)
        assert result["max_weight_difference"] < 1e-5
    first, second = both(jobs, "tfdist", "steps_per_execution")
    if first["one_device_iterations"] != 20:  # n/a on Keras 3.3-3.6: see test_keras_mirrored
        assert flavour.keras_version_tuple() < (3, 7)
        return
    for result in (first, second):
        assert result["iterations"] == 20 and result["max_weight_difference"] < 1e-6
        # the logs of fit and evaluate (groups of 3, 3, 3, 1 steps) are those of 1 step per call
        assert result["max_log_difference"] < 1e-5
    assert first["loss"] == second["loss"]  # averaged over both workers


def test_dropout_masks_differ_between_workers(jobs):
    # one replica per worker: each process sees one mask; the two workers' masks differ
    first, second = both(jobs, "tfdist", "dropout_masks")
    assert first["replicas"] == second["replicas"] == 1 and first["reproducible"]
    assert first["digests"] != second["digests"]


def _progress(worker) -> str:
    assert "ok" in worker["results"]["progress_bar"], worker["results"]["progress_bar"]
    text = worker["output"]
    return text[text.index("PROGRESS-START") : text.index("PROGRESS-END")]


def test_progress_bars_on_the_chief_only_unless_asked_for_everywhere(jobs):
    chief, other = jobs["tfdist"]
    assert "3/3" in _progress(chief) and "loss" in _progress(chief)
    assert _progress(other).strip() == "PROGRESS-START"  # nothing drawn on worker 1
    # TFDIST_PROGRESS=all: on every worker
    assert all("3/3" in _progress(worker) for worker in jobs["no_loop_fix"])
    chief, other = jobs["tf_keras"]  # the same under tf_keras
    assert "3/3" in _progress(chief) and _progress(other).strip() == "PROGRESS-START"


def test_same_scenarios_on_tf_keras(jobs):
    first, second = both(jobs, "tf_keras", "fit_evaluate_predict")
    assert first["xy_weights"] == second["xy_weights"]
    assert first["xy_loss"][-1] < first["xy_loss"][0]
    for result in both(jobs, "tf_keras", "matches_one_device"):
        assert result["max_weight_difference"] < 1e-5


def _worker_temp_dirs():
    return set(glob.glob(os.path.join(tempfile.gettempdir(), "tfdist-worker*")))


def test_checkpoints_write_once_and_backup_resumes_at_the_right_epoch(tmp_path):
    directory = str(tmp_path)
    temp_dirs_before = _worker_temp_dirs()
    first = run_cluster(
        scenarios.backup_and_restore, workers=2, args=(directory, 1), check=False, timeout=600
    )
    for run in first.values():
        assert "interrupted after epoch 1" in run.output
    assert sorted(os.listdir(tmp_path)) == ["backup", "epoch1.weights.h5", "epoch2.weights.h5"]
    second = run_cluster(scenarios.backup_and_restore, workers=2, args=(directory,), timeout=600)
    results = [second[f"worker:{i}"].value for i in range(2)]
    assert [r["chief"] for r in results] == [True, False]
    for result in results:
        assert result["trained_epochs"] == [2, 3]  # resumed after the 2 finished epochs
        assert result["max_weight_difference"] < 1e-5  # as if never interrupted
    # written once, by the chief; the non-chief's temporary copies are gone; backup removed
    assert sorted(os.listdir(tmp_path)) == [f"epoch{e}.weights.h5" for e in range(1, 5)]
    assert _worker_temp_dirs() == temp_dirs_before

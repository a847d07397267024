"""Shared set-up; the tfdist.testing plugin itself is loaded through its entry point.

The logical CPU count is fixed once per process (setup.cfg: tfdist_virtual_cpus = 4), before
any test initialises TensorFlow; tests that need another count run in a subprocess.
"""

import os

import pytest

pytest_plugins = ["pytester"]

# Quiet TensorFlow's C++ logs here and in every child process the tests start.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


@pytest.fixture(scope="session", autouse=True)
def _logical_cpus_first(virtual_cpus):
    """Splits the CPU before any test can initialise TensorFlow."""
    return virtual_cpus


# ------------------------------------------------------------------ the README's scenarios
# Each row of the README's "What works where" table, and the tests that prove it. These tests
# carry the `scenario` marker: `pytest -m scenario` runs them (the version matrix does, on each
# pair of tfdist.releases.MATRIX), and `--scenario-report=FILE` writes each row's outcome.
SCENARIOS = {
    "mirrored: validation_split, uneven last batch": [
        "test_keras_mirrored.py::test_validation_split_with_an_uneven_last_batch"
    ],
    "mirrored: dataset batches that do not split": [
        "test_keras_mirrored.py::test_batches_that_do_not_split_over_the_replicas",
        "test_keras_mirrored.py::test_fit_evaluate_predict_dicts_and_sample_weights",
    ],
    "mirrored: string inputs": ["test_keras_mirrored.py::test_string_inputs_through_string"],
    "mirrored: steps_per_execution": ["test_keras_mirrored.py::test_steps_per_execution"],
    "mirrored: gradient_accumulation_steps": [
        "test_keras_mirrored.py::test_gradient_accumulation_matches_one_device"
    ],
    "mirrored: Dropout mask per replica": ["test_keras_mirrored.py::test_dropout_draws"],
    "mirrored: Embedding with jit_compile": ["test_keras_mirrored.py::test_sparse_embedding"],
    "mirrored: equals one-device training": [
        "test_keras_mirrored.py::test_training_equals_one_device_training"
    ],
    "mirrored: optimizer made outside the scope": [
        "test_keras_mirrored.py::test_optimizer_made_outside_the_scope"
    ],
    "multi_worker: fit, evaluate, predict": [
        "test_keras_multi_worker_integration.py::test_fit_evaluate_predict_on_two_workers",
        "test_keras_multi_worker_integration.py::test_keras_3_alone_fails_where_tfdist_works",
        "test_keras_multi_worker_integration.py::test_each_multi_worker_fix_is_needed",
        "test_keras_multi_worker_integration.py::test_same_scenarios_on_tf_keras",
    ],
    "multi_worker: steps_per_execution": [
        "test_keras_multi_worker_integration.py::test_steps_per_execution_fails",
        "test_keras_multi_worker_integration.py::test_gradient_accumulation_and_steps",
    ],
    "multi_worker: equals one device": [
        "test_keras_multi_worker_integration.py::test_two_workers_train_exactly"
    ],
    "multi_worker: Dropout, progress bars": [
        "test_keras_multi_worker_integration.py::test_dropout_masks_differ",
        "test_keras_multi_worker_integration.py::test_progress_bars_on_the_chief",
    ],
    "multi_worker: checkpoints and backup": [
        "test_keras_multi_worker_integration.py::test_checkpoints_write_once"
    ],
    "multi_worker: restart after a worker is killed": ["test_launcher_integration.py::"],
    "parameter_server: fit with validation and callbacks": [
        "test_parameter_server_integration.py::test_each_kind_of_keras3_model",
        "test_parameter_server_integration.py::test_batch_callbacks",
        "test_parameter_server_integration.py::test_early_stopping",
        "test_parameter_server_integration.py::test_evaluate_returns",
        "test_parameter_server_integration.py::test_weights_files",
        "test_parameter_server_integration.py::test_the_same_calls_train_a_tf_keras_model",
    ],
    "parameter_server: the plain idiom": [
        "test_parameter_server_integration.py::test_the_plain_keras_idiom",
        "test_parameter_server_integration.py::test_one_worker_counts_every_step",
        "test_parameter_server_integration.py::test_without_step_counts",
        "test_parameter_server_integration.py::test_backup_and_restore",
        "test_parameter_server.py::test_plain_fit_evaluate_predict_on_parameter_server",
    ],
    "parameter_server: lost worker, lost ps": ["test_parameter_server_faults.py::"],
    "parameter_server: optimizer.iterations exact": [
        "test_parameter_server.py::test_the_parameter_server_fixes_are_registered",
        "test_parameter_server.py::test_assign_add_on_a_ps_variable",
        "test_parameter_server.py::test_optimizer_iterations_count_every_step",
        "test_parameter_server.py::test_both_ways_of_scheduling",
    ],
    "parameter_server: sharded Embedding": [
        "test_parameter_server.py::test_an_embedding_table_sharded",
        "test_parameter_server_integration.py::test_an_embedding_table_sharded",
    ],
    "parameter_server: sharded checkpoints": [
        "test_parameter_server.py::test_a_sharded_model",
        "test_parameter_server_integration.py::test_a_fresh_job_resumes",
        "test_parameter_server_integration.py::test_a_sharded_checkpoint_restores",
    ],
    "mixed precision on every strategy": [
        "test_keras_mirrored.py::test_mixed_float16_skips_a_step",
        "test_precision.py::test_mixed_bfloat16_on_mirrored",
        "test_precision.py::test_custom_loop_loss_scaling",
        "test_precision.py::test_mixed_precision_on_two_workers",
        "test_precision.py::test_mixed_precision_on_parameter_server",
        "test_precision.py::test_tfdist_fit_with_two_asynchronous_workers",
        "test_precision.py::test_tf_keras_flavour_in_a_subprocess",
    ],
    "data: every example exactly once": ["test_data_integration.py::"],
}


def _scenario_of(nodeid: str):
    path = nodeid.split("/")[-1]
    for name, prefixes in SCENARIOS.items():
        if any(path.startswith(prefix) for prefix in prefixes):
            return name
    return None


def pytest_addoption(parser):
    parser.addoption(
        "--scenario-report", metavar="FILE", help="write each README scenario's outcome (JSON)"
    )


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "scenario(name): proves a row of the README's 'What works where' table"
    )
    config._scenario_outcomes = {}


def pytest_collection_modifyitems(config, items):
    for item in items:
        name = _scenario_of(item.nodeid)
        if name:
            item.add_marker(pytest.mark.scenario(name))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    marker = item.get_closest_marker("scenario")
    if marker is None or (report.when != "call" and report.passed):
        return
    results = item.config._scenario_outcomes.setdefault(marker.args[0], {})
    previous = results.get(item.nodeid)
    if previous in ("failed",):  # a failed setup or call stays failed
        return
    results[item.nodeid] = "failed" if report.failed else report.outcome


def pytest_sessionfinish(session):
    path = session.config.getoption("--scenario-report")
    if path:
        import json

        with open(path, "w") as out:
            json.dump(session.config._scenario_outcomes, out, indent=1, sort_keys=True)

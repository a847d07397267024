"""Shared set-up for every tier; the tfdist.testing plugin is loaded through its entry point.

The tests are sorted by tier, one directory each; every test gets its tier's marker, so
`pytest -m "not cluster"` runs the fast tiers:

    unit/       pure Python: never imports TensorFlow (parsing, validation, plans, records, docs)
    inprocess/  real TensorFlow in the pytest process (the 4 logical CPUs, in-process servers)
    cluster/    starts processes: run_cluster, the launcher, subprocesses, examples, the doctor
    gpu/        the prepared GPU check (`make test-gpu`): its steps, skipped without a GPU
    helpers/    what several tiers share, imported as `helpers.<module>`; no tests

pytest imports this file first and puts tests/ on sys.path (its "prepend" import mode; no
__init__.py in tests/ or in the tier directories), so `helpers` imports from every tier, and
run_cluster passes that path on to its child processes. Test module names are their file
names: no two test files may share one, in any tier.

The logical CPU count is fixed once per process (setup.cfg: tfdist_virtual_cpus = 4), before
any test outside tests/unit can initialise TensorFlow; tests that need another count run in a
subprocess.
"""

import os
import pathlib

import pytest

pytest_plugins = ["pytester"]

# Quiet TensorFlow's C++ logs here and in every child process the tests start.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


TESTS = pathlib.Path(__file__).resolve().parent
TIERS = {
    "unit": "pure Python, no TensorFlow (tests/unit)",
    "inprocess": "real TensorFlow in the pytest process, no child process (tests/inprocess)",
    "cluster": "starts processes: local clusters, jobs, subprocesses (tests/cluster)",
    "gpu": "the steps of the prepared GPU check, each in a process of its own; skipped on "
    "hosts without a GPU (tests/gpu)",
}


_CONFIG = []  # the session's pytest config (pytest_runtest_logreport gets no config)


def _path_in_tests(nodeid):
    """The file of a test's node id ("tests/cluster/test_x.py::...") relative to tests/
    ("cluster/test_x.py"), or None outside tests/."""
    try:
        file = _CONFIG[0].rootpath / nodeid.partition("::")[0]
        return file.resolve().relative_to(TESTS).as_posix()
    except ValueError:
        return None


@pytest.fixture(scope="session", autouse=True)
def _logical_cpus_first(virtual_cpus):
    """Splits the CPU before any test can initialise TensorFlow (tests/unit overrides this:
    its tests never import TensorFlow, and run without it)."""
    return virtual_cpus


# ------------------------------------------------------------------ the README's scenarios
# Each row of the README's "What works where" table, and the tests that prove it. These tests
# carry the `scenario` marker: `pytest -m scenario` runs them (the version matrix does, on each
# pair of tfdist.releases.MATRIX), and `--scenario-report=FILE` writes each row's outcome.
SCENARIOS = {
    "mirrored: validation_split, uneven last batch": [
        "cluster/test_keras_mirrored.py::test_validation_split_with_an_uneven_last_batch"
    ],
    "mirrored: dataset batches that do not split": [
        "cluster/test_keras_mirrored.py::test_batches_that_do_not_split_over_the_replicas",
        "cluster/test_keras_mirrored.py::test_fit_evaluate_predict_dicts_and_sample_weights",
    ],
    "mirrored: string inputs": [
        "cluster/test_keras_mirrored.py::test_string_inputs_through_string"
    ],
    "mirrored: steps_per_execution": ["cluster/test_keras_mirrored.py::test_steps_per_execution"],
    "mirrored: gradient_accumulation_steps": [
        "cluster/test_keras_mirrored.py::test_gradient_accumulation_matches_one_device"
    ],
    "mirrored: Dropout mask per replica": ["cluster/test_keras_mirrored.py::test_dropout_draws"],
    "mirrored: Embedding with jit_compile": [
        "cluster/test_keras_mirrored.py::test_sparse_embedding"
    ],
    "mirrored: equals one-device training": [
        "cluster/test_keras_mirrored.py::test_training_equals_one_device_training"
    ],
    "mirrored: optimizer made outside the scope": [
        "cluster/test_keras_mirrored.py::test_optimizer_made_outside_the_scope"
    ],
    "multi_worker: fit, evaluate, predict": [
        "cluster/test_keras_multi_worker_integration.py::test_fit_evaluate_predict_on_two_workers",
        "cluster/test_keras_multi_worker_integration.py::test_keras_3_alone_fails_where_tfdist_works",
        "cluster/test_keras_multi_worker_integration.py::test_each_multi_worker_fix_is_needed",
        "cluster/test_keras_multi_worker_integration.py::test_same_scenarios_on_tf_keras",
    ],
    "multi_worker: steps_per_execution": [
        "cluster/test_keras_multi_worker_integration.py::test_steps_per_execution_fails",
        "cluster/test_keras_multi_worker_integration.py::test_gradient_accumulation_and_steps",
    ],
    "multi_worker: equals one device": [
        "cluster/test_keras_multi_worker_integration.py::test_two_workers_train_exactly"
    ],
    "multi_worker: Dropout, progress bars": [
        "cluster/test_keras_multi_worker_integration.py::test_dropout_masks_differ",
        "cluster/test_keras_multi_worker_integration.py::test_progress_bars_on_the_chief",
    ],
    "multi_worker: checkpoints and backup": [
        "cluster/test_keras_multi_worker_integration.py::test_checkpoints_write_once"
    ],
    "multi_worker: restart after a worker is killed": ["cluster/test_launcher_integration.py::"],
    "multi_worker: SIGTERM, exact resume": ["cluster/test_preemption.py::"],
    "multi_worker: elastic, 3 -> 2 -> 3 workers": ["cluster/test_elastic.py::"],
    "testing: assert_same_training on every strategy": ["cluster/test_same_training.py::"],
    "horovod: Horovod scripts under tfdist horovodrun": ["cluster/test_horovod_jobs.py::"],
    "parameter_server: SIGTERM to the chief, exact resume": [
        "cluster/test_preemption_parameter_server.py::"
    ],
    "parameter_server: fit with validation and callbacks": [
        "cluster/test_parameter_server_integration.py::test_each_kind_of_keras3_model",
        "cluster/test_parameter_server_integration.py::test_batch_callbacks",
        "cluster/test_parameter_server_integration.py::test_early_stopping",
        "cluster/test_parameter_server_integration.py::test_evaluate_returns",
        "cluster/test_parameter_server_integration.py::test_weights_files",
        "cluster/test_parameter_server_integration.py::test_the_same_calls_train_a_tf_keras_model",
    ],
    "parameter_server: the plain idiom": [
        "cluster/test_parameter_server_integration.py::test_the_plain_keras_idiom",
        "cluster/test_parameter_server_integration.py::test_one_worker_counts_every_step",
        "cluster/test_parameter_server_integration.py::test_without_step_counts",
        "cluster/test_parameter_server_integration.py::test_backup_and_restore",
        "cluster/test_parameter_server.py::test_plain_fit_evaluate_predict_on_parameter_server",
    ],
    "parameter_server: lost worker, lost ps": [
        "cluster/test_parameter_server_faults.py::",
        "inprocess/test_parameter_server_lost_tasks.py::",
    ],
    "parameter_server: optimizer.iterations exact": [
        "cluster/test_parameter_server.py::test_the_parameter_server_fixes_are_registered",
        "cluster/test_parameter_server.py::test_assign_add_on_a_ps_variable",
        "cluster/test_parameter_server.py::test_optimizer_iterations_count_every_step",
        "cluster/test_parameter_server.py::test_both_ways_of_scheduling",
    ],
    "parameter_server: sharded Embedding": [
        "cluster/test_parameter_server.py::test_an_embedding_table_sharded",
        "cluster/test_parameter_server_integration.py::test_an_embedding_table_sharded",
    ],
    "parameter_server: sharded checkpoints": [
        "cluster/test_parameter_server.py::test_a_sharded_model",
        "cluster/test_parameter_server_integration.py::test_a_fresh_job_resumes",
        "cluster/test_parameter_server_integration.py::test_a_sharded_checkpoint_restores",
    ],
    "mixed precision on every strategy": [
        "cluster/test_keras_mirrored.py::test_mixed_float16_skips_a_step",
        "inprocess/test_precision.py::test_mixed_bfloat16_on_mirrored",
        "inprocess/test_precision.py::test_custom_loop_loss_scaling",
        "cluster/test_precision_jobs.py::test_mixed_precision_on_two_workers",
        "cluster/test_precision_jobs.py::test_mixed_precision_on_parameter_server",
        "cluster/test_precision_jobs.py::test_tfdist_fit_with_two_asynchronous_workers",
        "cluster/test_precision_jobs.py::test_tf_keras_flavour_in_a_subprocess",
    ],
    "data: every example exactly once": ["cluster/test_data_integration.py::"],
    "keras.distribution: DataParallel, row-sharded ModelParallel": [
        "inprocess/test_keras_distribution.py::",
        "cluster/test_keras_distribution_jobs.py::",
    ],
}


def _scenario_of(nodeid):
    """The README row a test proves: its "tier/test_file.py::test_name[id]" (from its node id,
    "tests/tier/test_file.py::test_name[id]") against the prefixes."""
    path = _path_in_tests(nodeid)
    if path is None:
        return None
    test_id = f"{path}::{nodeid.partition('::')[2]}"
    for name, prefixes in SCENARIOS.items():
        if any(test_id.startswith(prefix) for prefix in prefixes):
            return name
    return None


def _tier_of(item):
    path = _path_in_tests(item.nodeid)
    tier = path.split("/")[0] if path else None
    return tier if tier in TIERS else None


def pytest_addoption(parser):
    parser.addoption(
        "--scenario-report", metavar="FILE", help="write each README scenario's outcome (JSON)"
    )


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "scenario(name): proves a row of the README's 'What works where' table"
    )
    for tier, meaning in TIERS.items():
        config.addinivalue_line("markers", f"{tier}: {meaning}; set from the directory")
    config._scenario_outcomes = {}
    _CONFIG[:] = [config]


# The order in which `make test` hands whole files to its two pytest processes (pytest-xdist with
# --dist loadfile --no-loadscope-reorder): the longest files first, so that no long file is left
# to run alone at the end while the other process has nothing to do. These files take 2 to 6
# minutes each on 2 cores; then the rest of the tiers, the fastest (unit) last to fill the gaps.
LONGEST_FIRST = (
    "cluster/test_chaos_campaign.py",
    "inprocess/test_training.py",
    "cluster/test_each_fix.py",
    "cluster/test_horovod_jobs.py",
    "cluster/test_keras_mirrored.py",
    "cluster/test_preemption.py",
    "cluster/test_multi_node.py",
    "cluster/test_gpu_check_rehearsal.py",
)
TIER_ORDER = ("cluster", "gpu", "inprocess", "unit")


def _run_order(item):
    path = _path_in_tests(item.nodeid) or ""
    if path in LONGEST_FIRST:
        return (0, LONGEST_FIRST.index(path))
    tier = _tier_of(item)
    return (1, TIER_ORDER.index(tier) if tier else len(TIER_ORDER))


def pytest_collection_modifyitems(config, items):
    for item in items:
        tier = _tier_of(item)
        if tier:
            item.add_marker(getattr(pytest.mark, tier))
        name = _scenario_of(item.nodeid)
        if name:
            item.add_marker(pytest.mark.scenario(name))
    items.sort(key=_run_order)  # stable: each file's tests stay together, in their order


def pytest_runtest_logreport(report):
    """Each scenario test's outcome. This hook runs where the reports arrive: in the pytest
    process, or under pytest-xdist (`make test`) in the controller, which writes the report."""
    if report.when != "call" and report.passed:
        return
    name = _scenario_of(report.nodeid)
    if name is None:
        return
    results = _CONFIG[0]._scenario_outcomes.setdefault(name, {})
    if results.get(report.nodeid) == "failed":  # a failed setup or call stays failed
        return
    results[report.nodeid] = "failed" if report.failed else report.outcome


def pytest_sessionfinish(session):
    path = session.config.getoption("--scenario-report")
    if path and not hasattr(session.config, "workerinput"):  # an xdist worker has a part
        import json

        with open(path, "w") as out:
            json.dump(session.config._scenario_outcomes, out, indent=1, sort_keys=True)

"""The tfdist.testing plugin, as a user's own test suite sees it (installed entry point), and
run_cluster's report of each task."""

import textwrap

import pytest

from tfdist.testing import run_cluster


def test_plugin_fixtures_in_a_users_suite(pytester):
    pytester.makeini(
        textwrap.dedent("""
        [pytest]
        tfdist_virtual_cpus = 3
        tfdist_env_guard = true
    """)
    )
    pytester.makepyfile(
        textwrap.dedent("""
        import os
        import pytest

        def test_virtual_cpus(virtual_cpus):
            import tensorflow as tf
            assert virtual_cpus == ["/cpu:0", "/cpu:1", "/cpu:2"]
            assert len(tf.config.list_logical_devices("CPU")) == 3

        def test_free_ports(free_ports):
            ports = free_ports(3) + free_ports(3)
            assert len(set(ports)) == 6

        def test_leaks_tf_config():
            os.environ["TF_CONFIG"] = "{}"

        def test_monkeypatch_is_fine(monkeypatch):
            monkeypatch.setenv("TFDIST_NUM_PS", "1")

        @pytest.mark.requires_gpu(n=1)
        def test_needs_gpu():
            raise AssertionError("must be skipped on a host without GPUs")
    """)
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rs")
    result.assert_outcomes(passed=4, errors=1, skipped=1)  # the leak fails in teardown
    result.stdout.fnmatch_lines(
        [
            "*ERROR at teardown of test_leaks_tf_config*",
            "*The test changed environment variable(s) ?'TF_CONFIG'? and did not restore them*",
            "*needs 1 GPU(s); this host has 0*",
        ]
    )


def fail_on_worker_one():
    import os
    import sys

    if os.environ["TFDIST_TASK"] == "worker:1":
        print("worker one gives up")
        sys.exit(4)
    return "done"


def test_run_cluster_reports_each_task_and_its_output():
    runs = run_cluster(fail_on_worker_one, workers=2, check=False, timeout=60)
    assert runs["worker:1"].returncode == 4
    assert "worker one gives up" in runs["worker:1"].output
    assert runs["worker:0"].returncode in (0, -15)  # done, or stopped when its peer failed
    from tfdist.testing import ClusterRunError

    with pytest.raises(
        ClusterRunError,
        match=r"(?s)failed\..*--- worker:1: exit code 4.*"
        r"worker one gives up",
    ):
        run_cluster(fail_on_worker_one, workers=2, timeout=60)

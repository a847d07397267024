"""The pytest plugin of `tfdist.testing`, registered through the `pytest11` entry point, so
installing tfdist makes all of it available in any test suite:

- `virtual_cpus` (session): splits the host CPU into `tfdist_virtual_cpus` logical devices
  (ini option, default 2) before TensorFlow initialises; returns their names.
- `free_ports`: a function `free_ports(n)` -> n distinct free TCP ports.
- `run_cluster`: the function `tfdist.testing.run_cluster`.
- marker `tfdist_strategies(*names, replicas=2, workers=2, timeout=300, env=None)`: the test,
  which takes a `strategy` argument, runs once per strategy named (default: all of
  `pools.STRATEGIES`), inside that strategy's shared pool process (every worker's, for
  multi_worker_mirrored). Its other fixtures' values are pickled and passed along.
- marker `requires_gpu(n=1)`: skips the test on hosts with fewer than n GPUs.
- env-leak guard: with `tfdist_env_guard = true` in the ini file, a test that leaves TF_CONFIG,
  a TFDIST_* variable or CUDA_VISIBLE_DEVICES changed fails.

TensorFlow is imported inside fixture bodies only, so loading the plugin stays cheap.
"""

from __future__ import annotations

import os
import pickle

import pytest

from tfdist import settings
from tfdist.cluster import free_ports as _free_ports
from tfdist.testing.clusters import function_reference, run_cluster
from tfdist.testing.pools import STRATEGIES, check_strategies, close_pools, pool_for

GUARDED_VARIABLES = ("TF_CONFIG", "CUDA_VISIBLE_DEVICES", "TF_USE_LEGACY_KERAS")
STRATEGIES_MARKER = "tfdist_strategies"


def pytest_addoption(parser):
    parser.addini(
        "tfdist_virtual_cpus", "logical CPUs made by the virtual_cpus fixture", default="2"
    )
    parser.addini(
        "tfdist_env_guard",
        "fail tests that leak TF_CONFIG / TFDIST_* variables",
        type="bool",
        default=False,
    )


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "requires_gpu(n=1): skip unless this host has at least n GPUs"
    )
    config.addinivalue_line(
        "markers",
        f"{STRATEGIES_MARKER}(*names, replicas=2, workers=2, timeout=300, env=None): run the "
        "test (taking `strategy`) once under each strategy, in shared local processes",
    )


def pytest_unconfigure(config):
    close_pools()


def pytest_generate_tests(metafunc):
    marker = metafunc.definition.get_closest_marker(STRATEGIES_MARKER)
    if marker is None:
        return
    names = check_strategies(marker.args or STRATEGIES, STRATEGIES_MARKER)
    if "strategy" not in metafunc.fixturenames or metafunc.cls is not None:
        raise TypeError(
            f"{metafunc.definition.nodeid}: a test marked {STRATEGIES_MARKER} must be a "
            "module-level function with a `strategy` argument. HINT: def test_x(strategy): ..."
        )
    metafunc.parametrize("strategy", names, ids=names)


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    marker = pyfuncitem.get_closest_marker(STRATEGIES_MARKER)
    if marker is None:
        return None
    name = pyfuncitem.callspec.params["strategy"]
    reference = function_reference(pyfuncitem.obj, STRATEGIES_MARKER)
    kwargs = {
        arg: pyfuncitem.funcargs[arg]
        for arg in pyfuncitem._fixtureinfo.argnames
        if arg != "strategy"
    }
    for arg, value in kwargs.items():
        try:
            pickle.dumps(value)
        except Exception as err:
            raise TypeError(
                f"The fixture {arg!r} of {pyfuncitem.nodeid} cannot be sent to the strategy's "
                f"process ({err}). HINT: a test marked {STRATEGIES_MARKER} takes fixtures whose "
                "values pickle (paths, numbers, arrays); make the rest inside the test."
            ) from None
    options = marker.kwargs
    pool = pool_for(
        name,
        replicas=options.get("replicas", 2),
        workers=options.get("workers", 2),
        env=options.get("env"),
    )
    replies = pool.call(
        name, reference, (), kwargs, strategy_kwarg="strategy", timeout=options.get("timeout", 300)
    )
    for reply in replies:
        if reply.output:
            print(f"--- {name} {reply.task} printed:\n{reply.output}")
    failed = [reply for reply in replies if not reply.ok]
    if failed:
        pytest.fail(
            "\n".join(
                f"--- {name} {reply.task}: {reply.error}\n{reply.traceback}" for reply in failed
            ),
            pytrace=False,
        )
    return True


def pytest_runtest_setup(item):
    marker = item.get_closest_marker("requires_gpu")
    if marker is None:
        return
    needed = marker.kwargs.get("n", marker.args[0] if marker.args else 1)
    import tensorflow as tf

    found = len(tf.config.list_physical_devices("GPU"))
    if found < needed:
        pytest.skip(f"needs {needed} GPU(s); this host has {found}")


@pytest.fixture(scope="session")
def virtual_cpus(pytestconfig):
    """The logical CPU names ("/cpu:0", ...), made before TensorFlow initialises."""
    from tfdist.strategy import virtual_cpus as make

    return make(int(pytestconfig.getini("tfdist_virtual_cpus")))


@pytest.fixture
def free_ports():
    """`free_ports(n)` -> n distinct TCP ports free right now (never repeated in a process)."""
    return _free_ports


@pytest.fixture(name="run_cluster")
def run_cluster_fixture():
    """The `tfdist.testing.run_cluster` function."""
    return run_cluster


def _guarded(environ) -> dict:
    return {
        k: v for k, v in environ.items() if k in GUARDED_VARIABLES or k.startswith(settings.PREFIX)
    }


@pytest.fixture(autouse=True)
def _tfdist_env_guard(request):
    if not request.config.getini("tfdist_env_guard"):
        yield
        return
    before = _guarded(os.environ)
    yield
    after = _guarded(os.environ)
    if after != before:
        leaked = sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))
        for key in leaked:  # restore, so one leak does not fail every later test
            if key in before:
                os.environ[key] = before[key]
            else:
                os.environ.pop(key, None)
        pytest.fail(
            f"The test changed environment variable(s) {leaked} and did not restore "
            "them. HINT: use monkeypatch.setenv, or pass env= mappings."
        )

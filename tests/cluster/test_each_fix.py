"""Each fix of tfdist.fixes.FIXES proven by a test that removes only that fix.

For every fix, its proof (tests/helpers/fix_proofs.py) runs in a fresh process, or a 2-process
multi_worker_mirrored cluster, or a parameter-server cluster, with TFDIST_KERAS_FIXES=-<fix>:

- where the fix is "applied" on this Keras (or TensorFlow) release, the bug comes back: the
  upstream error, or the wrong number;
- where it is "not needed" (the release has no such bug), the proof passes without it. Such
  a fix is not applied even with every fix on, so the run with all fixes is that proof: it
  gets no run of its own.

With all fixes on, every proof passes: the proofs of one strategy kind share one process (or
cluster), so starting processes stays cheap. The runs the selected tests need (and no other)
start together, PARALLEL at a time, each bounded by a timeout.
"""

import concurrent.futures
import os
import time

import pytest

from tfdist import flavour, releases
from tfdist.fixes import FIXES
from tfdist.fixes.record import APPLIED, NOT_NEEDED, OFF, Fix
from tfdist.fixes.tensorflow import INTERNALS
from tfdist.testing import run_cluster

from helpers import fix_proofs
from helpers.fix_proofs import BUG, PASS, PROOFS

pytestmark = pytest.mark.slow  # starts processes and local clusters

NAMES = list(FIXES)
TIMEOUT = 300  # seconds for one run (a process or a cluster)
PARALLEL = max(2, (os.cpu_count() or 2) // 2)  # runs at a time: 2 on 2 cores is quickest


def test_every_fix_has_one_proof_and_every_proof_a_fix():
    assert all(isinstance(fix, Fix) for fix in FIXES.values())
    missing = [name for name in FIXES if name not in PROOFS]
    assert not missing, f"fix(es) without a proof in tests/helpers/fix_proofs.py: {missing}"
    assert set(PROOFS) == set(FIXES), f"proofs of no fix: {sorted(set(PROOFS) - set(FIXES))}"
    (parametrized,) = [m for m in test_removing_the_fix.pytestmark if m.name == "parametrize"]
    assert list(parametrized.args[1]) == list(FIXES)
    # the TensorFlow fix is a fix; the internals tfdist only reads are not
    assert FIXES["unsigned_variables_under_multi_worker"].library == "tensorflow"
    assert not {internal.name for internal in INTERNALS} & (set(FIXES) | set(PROOFS))
    for name, proof in PROOFS.items():
        assert proof.fix == name and proof.kind in fix_proofs.KINDS
        assert proof.kind in FIXES[name].strategies, (name, proof.kind)


def not_needed_here(name) -> bool:
    """Whether fix `name` has no bug to fix on this release (so it is never applied here)."""
    fix = FIXES[name]
    if fix.library == "tensorflow":
        import tensorflow as tf

        version = releases.parse_version(tf.__version__)
    elif fix.library == "tf_keras":
        import tf_keras

        version = releases.parse_version(tf_keras.__version__)
    else:
        version = flavour.keras_version_tuple()
    return fix.check(version)[0] == NOT_NEEDED


def flavour_of(name) -> str:
    """The Keras a fix's proofs run on: "1" (tf_keras) for a fix of tf_keras, else "0"."""
    return "1" if FIXES[name].library == "tf_keras" else "0"


def all_key(name) -> tuple:
    """The run that has every fix on, for the proof of `name`."""
    return ("all", PROOFS[name].kind, flavour_of(name))


class Runs:
    """The runs the selected tests need, started at once; `get` waits for one (bounded)."""

    def __init__(self, names, directory):
        plans = {}
        for key in dict.fromkeys(all_key(name) for name in names):
            _, kind, legacy = key
            on = [name for name in names if all_key(name) == key]
            plans[key] = (kind, on, {"TFDIST_KERAS_FIXES": "1", "TF_USE_LEGACY_KERAS": legacy})
        for name in names:
            if not_needed_here(name):
                continue  # the run with all fixes runs its proof without it
            plans[("without", name)] = (
                PROOFS[name].kind,
                [name],
                {"TFDIST_KERAS_FIXES": f"-{name}", "TF_USE_LEGACY_KERAS": flavour_of(name)},
            )
        # Multi-process runs first: they wait on each other and leave room for a single one.
        order = sorted(plans, key=lambda key: -fix_proofs.TASKS[plans[key][0]])
        self._pool = concurrent.futures.ThreadPoolExecutor(PARALLEL)
        self._futures = {
            key: self._pool.submit(self._run, *plans[key], directory / "-".join(key))
            for key in order
        }
        self._limit = TIMEOUT * (len(plans) // PARALLEL + 1)

    @staticmethod
    def _run(kind, names, env, directory):
        directory.mkdir(parents=True)
        started = time.monotonic()
        runs = run_cluster(
            fix_proofs.RUNNERS[kind],
            workers=fix_proofs.TASKS[kind],
            args=(names, str(directory)),
            env={"TF_USE_LEGACY_KERAS": "0", **env},
            timeout=TIMEOUT,
        )
        seconds = round(time.monotonic() - started, 1)
        return [dict(runs[task].value, seconds=seconds) for task in sorted(runs)]

    def get(self, key) -> list:
        """Each task's result of run `key`: ("all", kind, "0" or "1": TF_USE_LEGACY_KERAS) or
        ("without", fix name)."""
        assert key in self._futures, f"no run {key}: this process judged the fix not needed"
        return self._futures[key].result(timeout=self._limit)

    def close(self):
        for future in self._futures.values():
            future.cancel()
        self._pool.shutdown(wait=True)


@pytest.fixture(scope="module")
def runs(request, tmp_path_factory):
    selected = [
        item.callspec.params["fix"]
        for item in request.session.items
        if item.module is request.module
        and "fix" in getattr(getattr(item, "callspec", None), "params", {})
    ]
    runs = Runs(
        [name for name in NAMES if name in selected and name in PROOFS],
        tmp_path_factory.mktemp("proofs"),
    )
    yield runs
    runs.close()


def _outcomes(results, name):
    return [task["outcomes"][name] for task in results]


@pytest.mark.parametrize("fix", NAMES, ids=NAMES)
def test_removing_the_fix(fix, runs, request):
    note = request.node.user_properties.append  # each result, for --junitxml
    proof = PROOFS.get(fix)
    assert proof is not None, f"{fix} has no proof in tests/helpers/fix_proofs.py"
    with_all = runs.get(all_key(fix))
    state = with_all[0]["states"][fix]
    where = f"Keras {with_all[0]['keras']}, TensorFlow {with_all[0]['tensorflow']}"
    note(("state", state))
    note(("seconds_with_all", with_all[0]["seconds"]))  # the run all proofs of a kind share
    assert state in (APPLIED, NOT_NEEDED), f"{fix} is {state!r} on {where}"

    outcome, why = fix_proofs.verdict(proof, _outcomes(with_all, fix))
    note(("with_all", outcome))
    assert outcome == PASS, f"{fix}'s proof fails with every fix on ({where}): {why}"

    if state == NOT_NEEDED:  # never applied here: the run above was the proof without it
        assert not_needed_here(fix)
        assert all(fix not in task["applied"] for task in with_all)
        note(("without", "PASS: not applied with every fix on"))
        return
    without = runs.get(("without", fix))
    for task in without:  # that fix alone is removed
        assert task["states"][fix] == OFF
        assert set(task["applied"]) == set(with_all[0]["applied"]) - {fix}
    note(("seconds_without", without[0]["seconds"]))
    outcome, why = fix_proofs.verdict(proof, _outcomes(without, fix))
    note(("without", f"{outcome}: {why[:300]}"))
    assert outcome == BUG, f"{fix} is applied on {where}, but without it: {outcome} {why}"

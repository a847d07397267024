"""The fix records (tfdist.fixes) and the release matrix (tfdist.releases), as data.

Records are checked as data (every fix names its issue, strategies, consequence and targets),
variant selection as a table. Applying on a release whose internals moved:
tests/cluster/test_fixes_moved_internals.py.
"""

import re

import pytest

from tfdist import fixes, releases
from tfdist.fixes.record import APPLIED, NOT_NEEDED, Fix, Internal, Target

# ----------------------------------------------------------------------- tier 1: records


def _records():
    from tfdist.keras_distribution.records import RECORDS

    return {**fixes.FIXES, **{record.name: record for record in RECORDS}}


def test_every_fix_is_a_complete_record():
    assert len(fixes.FIXES) >= 13
    for name, fix in _records().items():
        assert name == fix.name and re.fullmatch(r"[a-z0-9_]+", name)
        assert fix.summary and fix.consequence and fix.upstream, name
        assert fix.strategies and set(fix.strategies) <= {
            "mirrored",
            "multi_worker_mirrored",
            "parameter_server",
        }, name
        assert fix.variants, f"{name} has no variant"
        for variant in fix.variants:
            assert variant.targets, f"{name} {variant.releases} names no target"
            for target in variant.targets:
                assert re.fullmatch(r"[\w.]+:[\w.]*", target.path), target.path


def test_variants_of_a_fix_do_not_overlap():
    for fix in _records().values():
        ordered = sorted(fix.variants, key=lambda v: v.since)
        for earlier, later in zip(ordered, ordered[1:]):
            assert earlier.until is not None and earlier.until <= later.since, fix.name


def _fake_fix(**kwargs):
    fix = Fix(
        name="fake",
        summary="s",
        upstream="none found",
        strategies=("mirrored",),
        consequence="c",
        **kwargs,
    )
    calls = []
    fix.variant("3.5", "3.8", targets=["os:path"])(lambda: calls.append("old"))
    fix.variant("3.8", targets=["os:path"])(lambda: calls.append("new"))
    return fix, calls


@pytest.mark.parametrize(
    "version, expected",
    [
        ((3, 4, 0), None),  # older than every variant: no such internal there
        ((3, 5, 0), ">=3.5,<3.8"),
        ((3, 7, 9), ">=3.5,<3.8"),
        ((3, 8, 0), ">=3.8"),
        ((3, 99, 0), ">=3.8"),  # a future release: the newest form, if its targets match
    ],
)
def test_the_variant_is_chosen_by_the_keras_release(version, expected):
    fix, _ = _fake_fix()
    variant, reason = fix.select(version)
    assert (variant.releases if variant else None) == expected
    if variant is None:
        assert "before Keras 3.5" in reason


def test_a_fix_for_a_bug_fixed_upstream_is_not_applied_there():
    fix, _ = _fake_fix(fixed_in="3.9")
    assert fix.check((3, 8, 1))[0] == APPLIED
    state, reason, _ = fix.check((3, 9, 0))
    assert state == NOT_NEEDED and reason == "fixed upstream in Keras 3.9"


def test_a_newest_variant_declared_with_an_end_is_tried_on_newer_releases():
    fix = Fix("f", "s", "none found", ("mirrored",), "c")
    fix.variant("3.3", "3.10", targets=["os:path"])(lambda: None)
    assert fix.select((3, 12, 0))[0].releases == ">=3.3,<3.10"


@pytest.mark.parametrize(
    "target, problem",
    [
        (Target("os.path:join"), None),
        (Target("os.path:join", ("a",)), None),
        (Target("no_such_module_xyz:thing"), "module no_such_module_xyz is missing"),
        (Target("os.path:no_such_name"), "os.path:no_such_name is missing (no 'no_such_name')"),
        (Target("os.path:join", ("a", "b", "c", "d")), "os.path:join takes (a, p), the fix"),
        (Target("json:JSONDecoder.decode", ("self", "s")), None),
        (Target("json:JSONDecoder.nothing"), "json:JSONDecoder.nothing is missing"),
    ],
)
def test_targets_are_checked_for_existence_and_parameters(target, problem):
    found = target.problem()
    if problem is None:
        assert found is None
    else:
        assert found is not None and found.startswith(problem), found


def test_an_internal_resolves_to_its_first_path_that_exists():
    internal = Internal("join", "tests", ("no_such_module_xyz:join", "os.path:join"))
    import os.path

    assert internal.get() is os.path.join and internal.problem() is None


def test_unknown_fix_names_in_the_variable_are_refused_with_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown fix\(es\) \['nope'\]\. Known: "):
        fixes.turned_off({"TFDIST_KERAS_FIXES": "-nope"})
    assert fixes.turned_off({"TFDIST_KERAS_FIXES": "-no_xla_step_across_replicas"}) == {
        "no_xla_step_across_replicas"
    }


def test_the_docs_table_of_fixes_is_the_registry():
    import pathlib

    from tfdist.fixes.registry import markdown_table

    text = (pathlib.Path(__file__).parents[2] / "docs" / "concepts" / "strategies.md").read_text()
    assert markdown_table() in text, "docs/concepts/strategies.md: regenerate the fixes table"


# ------------------------------------------------------------------- tier 1: the matrix


@pytest.mark.parametrize(
    "tensorflow, keras, flavour, status",
    [
        ("2.16.2", "3.3.3", "keras3", releases.TESTED),
        ("2.21.0", "3.15.1", "keras3", releases.TESTED),
        ("2.16.1", "3.15.0", "keras3", releases.TESTED),  # same minor pair
        ("2.19.0", "3.12.1", "keras3", releases.IN_RANGE),
        ("2.22.0", "3.15.1", "keras3", releases.NEWER),
        ("2.21.0", "3.16.0", "keras3", releases.NEWER),
        ("2.15.1", "3.3.3", "keras3", releases.OLDER),
        ("2.16.2", "3.2.1", "keras3", releases.OLDER),
        ("2.16.2", "2.16.0", "tf_keras", releases.TESTED),
        ("2.20.0", "2.20.1", "tf_keras", releases.TESTED),
        ("2.23.0", "2.23.0", "tf_keras", releases.NEWER),
    ],
)
def test_support_status_against_the_matrix(tensorflow, keras, flavour, status):
    here = releases.support(tensorflow, keras, flavour)
    assert here.status == status
    assert tensorflow in here.message and keras in here.message
    if status == releases.OLDER:
        assert "HINT: pip install -U" in here.message


def test_the_matrix_holds_the_pairs_users_run():
    pairs = {(r.tensorflow, r.keras) for r in releases.MATRIX}
    for pair in [
        ("2.16.2", "3.3.3"),
        ("2.17.1", "3.5.0"),
        ("2.18.1", "3.8.0"),
        ("2.19.1", "3.10.0"),
        ("2.20.0", "3.11.3"),
        ("2.21.0", "3.15.1"),
        ("2.16.2", "3.15.1"),
    ]:
        assert pair in pairs
    for release in releases.MATRIX:  # tf_keras of the same TensorFlow minor
        assert release.tf_keras.split(".")[:2] == release.tensorflow.split(".")[:2]


def test_setup_cfg_lower_bounds_are_the_oldest_pair_and_nothing_caps_newer_releases():
    import configparser
    import pathlib

    config = configparser.ConfigParser()
    config.read(pathlib.Path(__file__).parents[2] / "setup.cfg")
    requires = config["options"]["install_requires"].split()
    assert "tensorflow>=2.16" in requires and "keras>=3.3" in requires
    assert not any("<" in r for r in requires)
    oldest = releases.MATRIX[0]
    assert (oldest.tensorflow, oldest.keras) == ("2.16.2", "3.3.3")

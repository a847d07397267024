"""The fix records (tfdist.fixes) and the release matrix (tfdist.releases), as data.

Records are checked as data (every fix names its issue, strategies, consequence and targets),
variant selection as a table. Applying on a release whose internals moved:
tests/cluster/test_fixes_moved_internals.py.
"""

import re

import pytest

from tfdist import fixes, releases
from tfdist.fixes.record import APPLIED, NOT_NEEDED, Fix, Internal, Place, Target

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
                if target.place is None:
                    assert re.fullmatch(r"[\w.]+:[\w.]*", target.path), target.path
                else:  # an attribute path below an internal found by what it is
                    assert re.fullmatch(r"[\w.]*", target.path), target.path


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


def test_a_tensorflow_fix_names_tensorflow_releases():
    fix = Fix("f", "s", "none found", ("mirrored",), "c", library="tensorflow", fixed_in="2.30")
    fix.variant("2.16", targets=["os:path"])(lambda: None)
    assert fix.check((2, 21, 0))[1] == "variant for TensorFlow >=2.16"
    assert fix.check((2, 30, 0))[1] == "fixed upstream in TensorFlow 2.30"
    assert fix.select((2, 15, 0))[1] == "the bug is not in releases before TensorFlow 2.16"
    assert [f.name for f in fixes.FIXES.values() if f.library == "tensorflow"]


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


def _module(monkeypatch, name, **classes):
    """A module `name` in sys.modules defining `classes` (name -> bases)."""
    import sys
    import types

    module = types.ModuleType(name)
    for class_name, bases in classes.items():
        setattr(module, class_name, type(class_name, bases, {"__module__": name}))
    monkeypatch.setitem(sys.modules, name, module)
    return module


def test_a_class_found_by_what_it_is_follows_a_rename(monkeypatch):
    # Keras 3.16 renamed TensorFlowTrainer to Trainer and the base Trainer to BaseTrainer
    def places(base_module, module):
        base = Place.class_in("the base trainer", base_module, defines=("fit",))
        return base, Place.class_in("the TensorFlow trainer", module, base=base)

    for version, (base_name, name) in {
        "k315": ("Trainer", "TensorFlowTrainer"),
        "k316": ("BaseTrainer", "Trainer"),
    }.items():
        base_module = _module(monkeypatch, f"fake_{version}_base")
        base_cls = type(base_name, (), {"__module__": base_module.__name__, "fit": lambda s: 1})
        setattr(base_module, base_name, base_cls)
        module = _module(monkeypatch, f"fake_{version}_tf", Iterator=(object,))
        setattr(module, name, type(name, (base_cls,), {"__module__": module.__name__}))
        module.Imported = type("Imported", (base_cls,), {})  # defined elsewhere: not counted
        base, trainer = places(base_module.__name__, module.__name__)
        assert base.get() is base_cls and trainer.get() is getattr(module, name)
        assert trainer.target("fit", ("s",)).problem() is None
        problem = trainer.target("train_step").problem()
        assert problem == "the TensorFlow trainer.train_step is missing (no 'train_step')"


def test_a_class_not_found_or_ambiguous_names_what_was_looked_for(monkeypatch):
    base = Place.first_of("the base", "json:JSONDecoder")
    _module(monkeypatch, "fake_none")
    problem = Place.class_in("the trainer", "fake_none", base=base).target("x").problem()
    assert problem == (
        "the trainer is missing: fake_none defines 0 classes that subclass JSONDecoder "
        "(none), the fix expects one"
    )
    import json

    _module(monkeypatch, "fake_two", A=(json.JSONDecoder,), B=(json.JSONDecoder,))
    problem = Place.class_in("the trainer", "fake_two", base=base).target().problem()
    assert "fake_two defines 2 classes" in problem and "(A, B)" in problem


def test_a_module_found_under_its_newest_path_first(monkeypatch):
    new = _module(monkeypatch, "fake_backend_ops_image")
    old = _module(monkeypatch, "fake_backend_image")
    new.draw_seed = old.draw_seed = lambda seed: seed
    place = Place.first_of("the image ops", "fake_backend_ops_image", "fake_backend_image")
    assert place.get() is new and place.target("draw_seed", ("seed",)).problem() is None
    monkeypatch.delitem(__import__("sys").modules, "fake_backend_ops_image")
    assert place.get() is old  # a release before the move
    gone = Place.first_of("the image ops", "no_such_module_xyz", "json:nothing")
    problem = gone.target("draw_seed").problem()
    assert problem.startswith("the image ops is missing: module no_such_module_xyz is missing")
    assert "json:nothing is missing" in problem


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
        ("2.21.0", "3.17.0", "keras3", releases.NEWER),
        ("2.21.0", "3.16.0.dev2026102704", "keras3", releases.NEXT),
        ("2.21.0", "3.16.0", "keras3", releases.NEXT),
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


def test_the_next_keras_is_tested_on_a_named_nightly_and_distinct_from_newer():
    next_release = releases.NEXT_RELEASE
    assert next_release.keras == "3.16" and next_release.built == "2026-10-27"
    assert next_release.name == f"next-tf{next_release.tensorflow}-keras{next_release.nightly}"
    assert releases.parse_version(next_release.keras) > releases.parse_version(
        releases.NEWEST.keras
    )
    assert next_release.tensorflow == releases.NEWEST.tensorflow
    assert next_release.pins() == [
        "tensorflow==2.21.0",
        "keras-nightly==3.16.0.dev2026102704",
        "tf-keras==2.21.0",
    ]
    # the nightly tested: no warning; another build of 3.16, or on another TensorFlow: warned
    tested = releases.support("2.21.0", next_release.nightly)
    assert tested.status == releases.NEXT and not tested.warn
    assert "keras-nightly 3.16.0.dev2026102704 (built 2026-10-27)" in tested.message
    assert not releases.support(next_release.tf_nightly, next_release.nightly).warn
    for tensorflow, keras in [("2.21.0", "3.16.0"), ("2.22.0", next_release.nightly)]:
        other = releases.support(tensorflow, keras)
        assert other.status == releases.NEXT and other.warn
        assert "not on this pair" in other.message
    newer = releases.support("2.21.0", "3.17.0.dev2027010104")
    assert newer.status == releases.NEWER and newer.warn
    assert releases.support("2.23.0", next_release.nightly).status == releases.NEWER
    # tf_keras has no next release of its own
    assert releases.support("2.22.0", "2.22.0", "tf_keras").status == releases.NEWER


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

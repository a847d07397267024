"""The strategy registry (tfdist.strategy.registry) as the one source of strategy facts: every
list, rule and message elsewhere is what the records say, and the docs show the records.

Pure Python. The names and the clusters that contradict them, pinned by name:
tests/unit/test_strategy_names.py.
"""

import re

import pytest

from tfdist import settings
from tfdist.strategy import builders, registry
from tfdist.strategy.communication import check_communication
from tfdist.strategy.compression import check_compression
from tfdist.strategy.factory import resolve_strategy_name
from tfdist.strategy.registry import AUTO, AUTO_CASES, STRATEGIES, auto_case

from helpers.paths import ROOT
from helpers.strategy import (
    CHIEF_AND_WORKER,
    CPU1,
    CPU4,
    GPU2,
    ONE_WORKER,
    PS_JOB,
    SINGLE,
    TWO_WORKERS,
)

RECORDS = list(STRATEGIES.values())
CLUSTERS = {
    "single": SINGLE,
    "one_worker": ONE_WORKER,
    "two_workers": TWO_WORKERS,
    "chief_and_worker": CHIEF_AND_WORKER,
    "ps_job": PS_JOB,
}
STRATEGIES_PAGE = ROOT / "docs" / "concepts" / "strategies.md"
DOCS_HOOK = ROOT / "docs" / "hooks" / "registry.py"


def by_name(value):
    return value.name if isinstance(value, registry.Strategy) else None


# ------------------------------------------------------------------------------ the records


@pytest.mark.parametrize("record", RECORDS, ids=by_name)
def test_every_record_is_complete(record):
    assert re.fullmatch(r"[a-z][a-z0-9_]*", record.name)
    assert record.tensorflow and record.summary
    assert callable(getattr(builders, record.build, None)), record.build
    assert record.build in builders.__all__
    assert record.communications[0] == "auto"
    assert len(set(record.options)) == len(record.options)
    assert record.auto in ("", *AUTO_CASES)
    assert set(record.serving_tasks) <= {"chief", "worker", "ps", "evaluator"}
    assert not (record.all_reduce and record.one_replica)
    assert record.all_reduce or record.without_all_reduce
    # a strategy that chooses how to all-reduce has an all-reduce
    assert record.all_reduce or record.communications == ("auto",)


def test_names_and_aliases_are_distinct():
    spellings = list(registry.CLI_CHOICES)
    assert len(set(spellings)) == len(spellings)
    assert registry.STRATEGY_NAMES == ("auto", *STRATEGIES)
    assert set(registry.ALIASES.values()) <= set(STRATEGIES)


def test_auto_picks_one_strategy_in_each_case():
    picks = [record.auto for record in RECORDS if record.auto]
    assert sorted(picks) == sorted(AUTO_CASES)
    assert set(AUTO) == set(AUTO_CASES)


# ------------------------------------------------------------- the rules that read the facts


@pytest.mark.parametrize(
    "cluster, devices, case",
    [
        (SINGLE, CPU1, "otherwise"),
        (SINGLE, CPU4, "devices"),
        (ONE_WORKER, GPU2, "devices"),
        (TWO_WORKERS, CPU4, "workers"),
        (CHIEF_AND_WORKER, CPU1, "workers"),
        (PS_JOB, CPU1, "ps_job"),
    ],
)
def test_auto_is_the_strategy_its_case_names(cluster, devices, case):
    assert auto_case(cluster, devices) == case
    assert resolve_strategy_name("auto", cluster, devices) == AUTO[case]


def _contradicts(record, cluster) -> bool:
    """What the records say: the rules of resolve_strategy_name, from the facts alone."""
    if not record.distributes:
        return False
    several_workers = not cluster.is_single_process and cluster.num_workers > 1
    return bool(
        (record.uses_ps and not cluster.num_ps)
        or (cluster.num_ps and not record.uses_ps)
        or (several_workers and not cluster.num_ps and not record.multi_process)
    )


@pytest.mark.parametrize("cluster", CLUSTERS.values(), ids=CLUSTERS)
@pytest.mark.parametrize("record", RECORDS, ids=by_name)
def test_a_cluster_refuses_exactly_the_strategies_whose_facts_contradict_it(record, cluster):
    if _contradicts(record, cluster):
        with pytest.raises(ValueError, match=rf"strategy='{record.name}' .*HINT: "):
            resolve_strategy_name(record.name, cluster, CPU1)
    else:
        assert resolve_strategy_name(record.name, cluster, CPU1) == record.name


@pytest.mark.parametrize("cluster", CLUSTERS.values(), ids=CLUSTERS)
def test_what_auto_picks_is_never_a_strategy_the_cluster_refuses(cluster):
    for devices in (CPU1, CPU4):
        assert not _contradicts(
            STRATEGIES[resolve_strategy_name("auto", cluster, devices)], cluster
        )


def test_the_hints_name_the_strategy_auto_would_pick():
    with pytest.raises(ValueError, match=rf"HINT: use strategy='{AUTO['workers']}'"):
        resolve_strategy_name("mirrored", TWO_WORKERS, CPU1)
    with pytest.raises(ValueError, match=rf"HINT: use strategy='{AUTO['ps_job']}'"):
        resolve_strategy_name("mirrored", PS_JOB, CPU1)


# ---------------------------------------------------------------- the places that derive


@pytest.mark.parametrize("record", RECORDS, ids=by_name)
def test_gradient_compression_is_taken_exactly_where_the_record_all_reduces(record):
    if record.all_reduce:
        assert check_compression(record.name, "bf16") == "bf16"
        return
    with pytest.raises(ValueError) as caught:
        check_compression(record.name, "bf16")
    message = str(caught.value)
    taking = registry.quoted(registry.WITH_ALL_REDUCE)
    assert f"applies to the all-reduce of {taking}, but the strategy is '{record.name}'" in message
    assert f"({record.without_all_reduce})" in message and "HINT" in message


def test_the_compression_message_is_the_one_documented():
    with pytest.raises(ValueError) as caught:
        check_compression("parameter_server", "bf16")
    page = (ROOT / "docs" / "concepts" / "communication.md").read_text()
    assert str(caught.value) in page


@pytest.mark.parametrize("record", RECORDS, ids=by_name)
def test_a_communication_the_strategy_does_not_take_names_its_choices(record):
    with pytest.raises(ValueError) as caught:
        check_communication(record.name, "bogus", record.communications, record.without_all_reduce)
    message = str(caught.value)
    assert f"strategy '{record.name}'. Choose one of: {', '.join(record.communications)}" in message
    assert record.all_reduce or f"({record.without_all_reduce})." in message


def test_tfdist_strategy_takes_every_spelling_of_the_cli():
    for spelling in registry.CLI_CHOICES:
        value = settings.STRATEGY.get({"TFDIST_STRATEGY": spelling}, check=registry.known_name)
        assert value == registry.ALIASES.get(spelling, spelling)
    folded = {"TFDIST_STRATEGY": " Multi-Worker-Mirrored "}
    assert settings.STRATEGY.get(folded, check=registry.known_name) == "multi_worker_mirrored"


@pytest.mark.parametrize("text", ["mirored", "-", "one device", "auto_"])
def test_tfdist_strategy_refuses_a_name_that_is_no_strategy(text):
    with pytest.raises(ValueError) as caught:
        settings.STRATEGY.get({"TFDIST_STRATEGY": text}, check=registry.known_name)
    assert str(caught.value) == (
        f"TFDIST_STRATEGY must be a strategy name: one of {', '.join(registry.CLI_CHOICES)}. "
        f"Received: TFDIST_STRATEGY={text!r}. HINT: correct the value, or unset "
        "TFDIST_STRATEGY for the default."
    )


def test_the_cli_offers_the_registry():
    from tfdist.cli import build_parser

    parser = build_parser()
    commands = next(a for a in parser._actions if a.dest == "command").choices
    launch = {a.dest: a for a in commands["launch"]._actions}
    assert tuple(launch["strategy"].choices) == registry.CLI_CHOICES
    assert " and ".join(registry.WITH_ALL_REDUCE) in launch["gradient_compression"].help
    verify = {a.dest: a for a in commands["verify"]._actions}
    assert f"default: {', '.join(registry.POOLED)})" in verify["strategies"].help


def test_the_testing_pools_serve_what_the_records_say():
    from tfdist.testing import pools
    from tfdist.testing.strategy_server import POOL_KINDS

    assert pools.STRATEGIES == tuple(r.name for r in RECORDS if r.pool)
    assert pools.POOLS == {r.name: r.pool for r in RECORDS if r.pool}
    assert set(pools.POOLS.values()) == set(POOL_KINDS)  # every pool serves a strategy
    assert {kind.processes for kind in POOL_KINDS.values()} <= {"one", "workers"}


def test_the_fixes_name_strategies_that_distribute():
    from tfdist import fixes
    from tfdist.keras_distribution.records import RECORDS as BRIDGE

    distributing = {r.name for r in RECORDS if r.distributes}
    for fix in [*fixes.FIXES.values(), *BRIDGE]:
        assert set(fix.strategies) <= distributing, fix.name


# ----------------------------------------------------------------------------- the docs


def _hook():
    """docs/hooks/registry.py, the mkdocs hook that puts the registry's facts in the site."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("docs_registry_hook", DOCS_HOOK)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_strategies_page_shows_the_registrys_tables():
    text = STRATEGIES_PAGE.read_text()
    for name in ("markdown_table", "markdown_auto", "markdown_options"):
        assert f"<!-- generated: tfdist.strategy.registry.{name}() -->\n" in text, name
    filled = _hook().fill(text)
    for generated in (
        registry.markdown_table(),
        registry.markdown_auto(),
        registry.markdown_options(),
    ):
        assert generated in filled
    assert "<!-- generated:" not in filled


def test_the_hook_refuses_a_marker_of_no_generator():
    with pytest.raises(ValueError, match="markdown_tabel.*Choose one of: markdown_table"):
        _hook().fill("<!-- generated: tfdist.strategy.registry.markdown_tabel() -->\n")


def test_the_options_table_lists_each_strategys_options():
    rows = {}
    for line in registry.markdown_options().splitlines()[2:]:
        names, options = (cell.strip() for cell in line.strip("|").split("|"))
        for name in re.findall(r"`(\w+)`", names):
            rows[name] = options
    assert set(rows) == set(STRATEGIES), "one row per strategy"
    for record in RECORDS:
        named = set(re.findall(r"`(\w+)`", rows[record.name]))
        if record.options:
            assert set(record.options) <= named, (record.name, set(record.options) - named)
        else:
            assert rows[record.name] == "none", record.name


def test_the_docs_nav_has_a_page_per_strategy_from_the_registry():
    nav = [{"Home": "index.md"}, {"Strategies": []}, {"Testing": "testing.md"}]
    config = _hook().on_config({"nav": nav})
    (section,) = [entry["Strategies"] for entry in config["nav"] if "Strategies" in entry]
    assert section == registry.markdown_nav()
    assert {page for entry in section for page in entry.values()} == {
        record.page for record in RECORDS
    }
    assert {"one_device and default": "strategies/one-device.md"} in section
    assert "  - Strategies: []\n" in (ROOT / "mkdocs.yml").read_text(), "filled by the hook"
    assert "  - docs/hooks/registry.py\n" in (ROOT / "mkdocs.yml").read_text()


@pytest.mark.parametrize("record", RECORDS, ids=by_name)
def test_every_strategy_has_its_page_in_the_docs(record):
    page = ROOT / "docs" / record.page
    assert page.is_file(), record.page
    assert f'make_strategy("{record.name}")' in page.read_text(), record.page

"""How tfdist chooses the steps per call of fit and evaluate (tfdist/fixes/executions.py)."""

from tfdist.fixes.executions import MAX_STEPS_PER_EXECUTION, STEPS_PER_EXECUTION, choose

from helpers.paths import ROOT


def test_the_largest_divisor_of_the_steps_up_to_the_maximum():
    assert MAX_STEPS_PER_EXECUTION == 16
    assert choose(30, None, "fit") == 15
    assert choose(240, [], "fit") == 16
    assert choose(7, None, "evaluate") == 7
    assert choose(17, None, "fit") == 1  # a prime above the maximum: one step per call
    assert choose(1, None, "fit") == 1


def test_no_steps_runs_to_the_data_end_and_validation_steps_count():
    assert choose(None, None, "fit") == MAX_STEPS_PER_EXECUTION
    assert choose([30, 10], None, "fit") == 10  # fit's validation runs with fit's choice
    assert choose([None, 12], None, "fit") == 12
    assert choose(0, None, "fit") == MAX_STEPS_PER_EXECUTION  # Keras reads 0 as "no steps"
    assert choose([0, 0], None, "fit") == MAX_STEPS_PER_EXECUTION


def test_the_docs_state_the_rule_the_code_has():
    page = (ROOT / "docs" / "concepts" / "strategies.md").read_text()
    assert f"up to {MAX_STEPS_PER_EXECUTION}" in page.replace("\n", " ").replace("  ", " ")
    assert f"TFDIST_KERAS_FIXES=-{STEPS_PER_EXECUTION.name}" in page

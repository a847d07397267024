"""The `gradient_compression=` vocabulary, checked without TensorFlow."""

import pytest

from tfdist.strategy.compression import check_compression


@pytest.mark.parametrize(
    "value, mode",
    [("bf16", "bf16"), (" BFloat16 ", "bf16"), ("fp16", "fp16"), ("float16", "fp16")]
    + [(None, None), ("none", None), ("off", None)],
)
def test_the_spellings_of_each_compression(value, mode):
    assert check_compression("multi_worker_mirrored", value) == mode
    assert check_compression("mirrored", value) == mode


@pytest.mark.parametrize("value", ["int8", "fp8", 16, "bf 16"])
def test_an_unknown_compression_names_the_value_and_the_choices(value):
    with pytest.raises(ValueError, match="not a known compression") as caught:
        check_compression("mirrored", value)
    assert repr(value) in str(caught.value) and "HINT" in str(caught.value)


@pytest.mark.parametrize("strategy", ["parameter_server", "one_device", "default"])
def test_a_strategy_without_an_all_reduce_refuses_compression_but_takes_none(strategy):
    with pytest.raises(ValueError, match=strategy) as caught:
        check_compression(strategy, "bf16")
    assert "HINT" in str(caught.value)
    assert check_compression(strategy, None) is None
    assert check_compression(strategy, "none") is None

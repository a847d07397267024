"""tfdist.precision, tier 1: the "auto" rules (devices injected), the CPU flags and the policy
names, before any TensorFlow. Tier 2: tests/inprocess/test_precision.py; tier 3:
tests/cluster/test_precision_jobs.py."""

import re

import pytest

from tfdist import precision
from tfdist.precision import choose_policy

# ---------------------------------------------------------------- tier 1: the auto rules


@pytest.mark.parametrize(
    "gpus, flags, expected, reason",
    [
        ([(8, 0)], set(), "mixed_bfloat16", r"1 GPU\(s\), lowest compute capability 8\.0 >= 8\.0"),
        (
            [(9, 0), (8, 6)],
            {"avx2"},
            "mixed_bfloat16",
            r"2 GPU\(s\), lowest compute capability 8\.6",
        ),
        ([(7, 0)], set(), "mixed_float16", r"7\.0 >= 7\.0: float16 tensor cores"),
        ([(8, 0), (7, 5)], set(), "mixed_float16", r"lowest compute capability 7\.5"),
        ([(6, 1)], {"amx_bf16"}, "float32", r"6\.1 < 7\.0: no tensor cores"),  # GPUs decide
        ([(8, 0), None], set(), "float32", r"compute capability unknown"),
        ([], {"avx2", "fma"}, "float32", r"CPU only, without native bfloat16"),
        ([], {"avx512f", "avx512_bf16"}, "mixed_bfloat16", r"native bfloat16 \(avx512_bf16\)"),
        ([], {"amx_tile", "amx_bf16", "amx_int8"}, "mixed_bfloat16", r"\(amx_bf16\)"),
        ([], {"amx_tile"}, "float32", r"without native bfloat16"),
        ([], set(), "float32", r"without native bfloat16"),
    ],
)
def test_auto_rules_with_injected_devices(gpus, flags, expected, reason):
    policy, why = choose_policy(gpus, flags)
    assert policy == expected
    assert re.search(reason, why), why


def test_cpu_flags_from_cpuinfo(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(
        "processor\t: 0\nflags\t\t: fpu avx2 AVX512_BF16 amx_bf16\n\n"
        "processor\t: 1\nflags\t\t: fpu avx2\n"
    )
    assert precision.cpu_flags(str(cpuinfo)) == {"fpu", "avx2", "AVX512_BF16", "amx_bf16"}
    assert precision.cpu_flags(str(tmp_path / "missing")) == set()
    arm = tmp_path / "arm"
    arm.write_text("processor\t: 0\nFeatures\t: fp asimd bf16\n")
    assert choose_policy([], precision.cpu_flags(str(arm)))[0] == "mixed_bfloat16"


@pytest.mark.parametrize(
    "policy, error, match",
    [
        (
            "mixed_fp16",
            ValueError,
            r"policy='mixed_fp16' is not a known precision policy\. Choose "
            r"one of: auto, float32, mixed_float16, mixed_bfloat16",
        ),
        ("bf16-mixed", ValueError, r"policy='bf16-mixed' is not a known"),
        ("float16", ValueError, r"Choose one of"),
        (16, TypeError, r"must be a string\. Received: policy=16 \(of type int\)"),
    ],
)
def test_unknown_policy_names_are_refused_with_the_choices(policy, error, match):
    with pytest.raises(error, match=match):
        precision.set_precision(policy)

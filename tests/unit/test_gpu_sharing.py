"""Processes that share a host's GPUs, without TensorFlow: SLURM tasks that see the same GPUs
(fewer GPUs than tasks on a node) all-reduce on the ring where communication is "auto", and the
off switch of memory growth (TFDIST_GPU_MEMORY_GROWTH=0) governs every place that turns it on.

A stand-in `tensorflow` (`FakeTensorFlow`: `tf.config`'s GPU calls and the multi-worker
communication options, recorded) takes the place of the real one in `sys.modules`, so that
`take_slurm_gpu_share`, `hvd.init()`'s pinning and `collective_options` run as they do in a
task, on simulated GPUs. The launcher's own memory growth: tests/unit/test_launcher_gpus.py.
"""

import sys
import types

import pytest

from tfdist.strategy import devices
from tfdist.strategy.communication import collective_implementation, collective_options
from tfdist.strategy.devices import slurm_tasks_share_gpus, take_slurm_gpu_share


class FakeTensorFlow(types.SimpleNamespace):
    """`tensorflow` as far as the GPU calls go: `n` physical GPUs, what was done to them."""

    def __init__(self, n):
        physical = [f"PhysicalDevice(GPU:{i})" for i in range(n)]
        self.growth, self.visible = {}, None

        def set_visible_devices(chosen, kind):
            self.visible = (chosen, kind)

        def set_memory_growth(gpu, on):
            self.growth[gpu] = on

        config = types.SimpleNamespace(
            list_physical_devices=lambda kind: list(physical) if kind == "GPU" else ["CPU"],
            set_visible_devices=set_visible_devices,
            experimental=types.SimpleNamespace(set_memory_growth=set_memory_growth),
        )
        implementation = types.SimpleNamespace(NCCL="NCCL", RING="RING")
        distribute = types.SimpleNamespace(
            experimental=types.SimpleNamespace(
                CommunicationImplementation=implementation,
                CommunicationOptions=lambda **options: options,
            )
        )
        super().__init__(config=config, distribute=distribute)


@pytest.fixture
def fake_tf(monkeypatch):
    """FakeTensorFlow(n) installed as `tensorflow`, its runtime not yet started."""

    def install(n):
        tf = FakeTensorFlow(n)
        monkeypatch.setitem(sys.modules, "tensorflow", tf)
        return tf

    monkeypatch.setattr(devices, "runtime_initialized", lambda: False)
    for name in ("TFDIST_GPU_MEMORY_GROWTH", "TFDIST_COLLECTIVE_TIMEOUT"):
        monkeypatch.delenv(name, raising=False)
    return install


def _srun_task(local, per_node="2", **more):
    """A task of an srun step, as SLURM sets it when it binds no GPU to tasks."""
    return {"SLURM_STEP_ID": "0", "SLURM_LOCALID": str(local), "SLURM_NODEID": "0",
            "SLURM_STEP_TASKS_PER_NODE": per_node, **more}  # fmt: skip


@pytest.mark.parametrize(
    "env, seen, shares",
    [
        pytest.param(_srun_task(1), 1, True, id="2 tasks, 1 GPU"),
        pytest.param(_srun_task(2, per_node="4"), 2, True, id="4 tasks, 2 GPUs"),
        pytest.param(_srun_task(1), 2, False, id="2 tasks, 2 GPUs: one each"),
        pytest.param(_srun_task(1, SLURM_GPUS_PER_TASK="1"), 1, False, id="bound by SLURM"),
        pytest.param(_srun_task(0, per_node="1"), 1, False, id="alone on its node"),
        pytest.param(_srun_task(1), 0, False, id="no GPU"),
        pytest.param({}, 1, False, id="not SLURM"),
    ],
)
def test_which_slurm_tasks_share_a_gpu(env, seen, shares):
    assert slurm_tasks_share_gpus(env, seen=seen) is shares


@pytest.mark.parametrize(
    "communication, devices_, share, expected",
    [
        ("auto", ["/gpu:0"], False, "nccl"),
        ("auto", ["/gpu:0"], True, "ring"),  # NCCL: "Duplicate GPU detected"
        ("auto", ["/gpu:0", "/gpu:1"], True, "ring"),
        ("auto", ["/cpu:0"], False, "ring"),
        ("NCCL", ["/gpu:0"], True, "nccl"),  # the caller's own choice is kept
        ("ring", ["/gpu:0"], False, "ring"),
    ],
)
def test_auto_all_reduces_on_the_ring_where_tasks_share_a_gpu(
    communication, devices_, share, expected
):
    assert collective_implementation(communication, devices_, share) == expected


def test_a_slurm_task_that_shares_its_gpu_builds_ring_options(fake_tf, monkeypatch):
    """What multi_worker_mirrored's builder gets (`collective_options(communication, found)`)
    in each task of a 2-task srun step on a node with one GPU, and with two."""
    for name, value in _srun_task(1).items():
        monkeypatch.setenv(name, value)
    fake_tf(1)
    assert collective_options("auto", ["/gpu:0"])["implementation"] == "RING"
    assert collective_options("nccl", ["/gpu:0"])["implementation"] == "NCCL"  # theirs
    fake_tf(2)
    assert collective_options("auto", ["/gpu:0"])["implementation"] == "NCCL"


def test_a_slurm_task_grows_the_memory_of_a_shared_gpu_unless_switched_off(fake_tf):
    tf = fake_tf(1)
    assert take_slurm_gpu_share(_srun_task(1)) == ["/gpu:0"]
    assert tf.growth == {"PhysicalDevice(GPU:0)": True}
    tf = fake_tf(1)
    assert take_slurm_gpu_share(_srun_task(1, TFDIST_GPU_MEMORY_GROWTH="0")) == ["/gpu:0"]
    assert tf.growth == {} and tf.visible == (["PhysicalDevice(GPU:0)"], "GPU")
    tf = fake_tf(4)  # one GPU each: nothing shared, TensorFlow's default
    assert take_slurm_gpu_share(_srun_task(1, per_node="4")) == ["/gpu:0"]
    assert tf.growth == {} and tf.visible == (["PhysicalDevice(GPU:1)"], "GPU")


def test_hvd_init_pins_its_gpu_and_grows_memory_unless_switched_off(fake_tf, monkeypatch):
    from tfdist.horovod.runtime import _pin_gpu

    tf = fake_tf(2)
    _pin_gpu(1)
    assert tf.visible == ("PhysicalDevice(GPU:1)", "GPU")
    assert tf.growth == {"PhysicalDevice(GPU:0)": True, "PhysicalDevice(GPU:1)": True}
    monkeypatch.setenv("TFDIST_GPU_MEMORY_GROWTH", "0")
    tf = fake_tf(2)
    _pin_gpu(1)
    assert tf.visible == ("PhysicalDevice(GPU:1)", "GPU") and tf.growth == {}
    with pytest.raises(RuntimeError, match=r"local rank 2, but the host has 2 GPUs"):
        _pin_gpu(2)

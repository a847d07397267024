"""make_strategy / virtual_cpus, tier 2: the options tfdist gives TensorFlow, and real
strategies in this process. The pure name resolution: tests/unit/test_strategy_names.py."""

import pytest
import tensorflow as tf

import tfdist
from tfdist import ClusterSpec
from tfdist.strategy import collective_options, make_strategy, mirrored_cross_device_ops

from helpers.strategy import CPU1, CPU4, GPU2, SINGLE

# ----------------------------------------------------- communication: exact options for TF


@pytest.mark.parametrize(
    "communication, devices, implementation",
    [
        ("auto", CPU1, "RING"),
        ("auto", GPU2, "NCCL"),
        ("ring", GPU2, "RING"),
        ("nccl", GPU2, "NCCL"),
        ("auto", ["/gpu:0", "/cpu:0"], "RING"),
    ],
)
def test_multi_worker_communication_options(communication, devices, implementation):
    options = collective_options(communication, devices, bytes_per_pack=1 << 20, timeout_seconds=42)
    assert options.implementation == getattr(
        tf.distribute.experimental.CommunicationImplementation, implementation
    )
    assert options.bytes_per_pack == 1 << 20
    assert options.timeout_seconds == 42


def test_multi_worker_collective_timeout_is_opt_in(monkeypatch):
    # a per-collective timeout costs a sleeping thread per collective (bench_keras); dead
    # peers are caught by the coordination service's heartbeats instead
    assert collective_options("auto", CPU1).timeout_seconds is None
    monkeypatch.setenv("TFDIST_COLLECTIVE_TIMEOUT", "17")
    assert collective_options("auto", CPU1).timeout_seconds == 17
    assert collective_options("auto", CPU1, timeout_seconds=0).timeout_seconds is None


def test_multi_worker_packs_by_four_mib_on_the_ring_and_keeps_tensorflows_default_for_nccl():
    assert collective_options("auto", CPU1).bytes_per_pack == 4 << 20
    assert collective_options("auto", GPU2).bytes_per_pack == 0
    assert collective_options("ring", CPU1, bytes_per_pack=0).bytes_per_pack == 0


def test_communication_options_from_tensorflows_public_constructor_are_taken(monkeypatch):
    from tfdist.strategy import multi_worker

    monkeypatch.setattr(multi_worker, "_MWMS_CACHE", {})  # leave no strategy to later tests
    # the exported constructor returns collective_util.Options, not an instance of itself
    options = tf.distribute.experimental.CommunicationOptions(bytes_per_pack=123)
    strategy = make_strategy("multi_worker_mirrored", cluster=SINGLE, communication_options=options)
    assert type(strategy).__name__ == "CollectiveAllReduceStrategy"


@pytest.mark.parametrize(
    "communication, devices, cls",
    [
        ("auto", GPU2, tf.distribute.NcclAllReduce),
        ("nccl", GPU2, tf.distribute.NcclAllReduce),
        ("auto", CPU4, tf.distribute.ReductionToOneDevice),
        ("hierarchical_copy", GPU2, tf.distribute.HierarchicalCopyAllReduce),
        ("reduce_to_one_device", GPU2, tf.distribute.ReductionToOneDevice),
    ],
)
def test_mirrored_cross_device_ops(communication, devices, cls):
    assert type(mirrored_cross_device_ops(communication, devices)) is cls


def test_logical_gpus_of_one_gpu_reduce_on_one_device_where_nccl_would_see_one_gpu_twice():
    from tfdist.strategy.devices import gpus_share_a_device

    assert gpus_share_a_device(GPU2, per_physical=[2])  # two logical GPUs of GPU 0
    assert not gpus_share_a_device(GPU2, per_physical=[1, 1])
    assert not gpus_share_a_device(["/gpu:0", "/gpu:2"], per_physical=[2, 2])
    assert gpus_share_a_device(["/gpu:2", "/gpu:3", "/cpu:0"], per_physical=[2, 2])
    assert not gpus_share_a_device(CPU4)  # this host: no GPU at all
    shared = mirrored_cross_device_ops("auto", GPU2, gpus_share_a_device=True)
    assert type(shared) is tf.distribute.ReductionToOneDevice
    forced = mirrored_cross_device_ops("nccl", GPU2, gpus_share_a_device=True)
    assert type(forced) is tf.distribute.NcclAllReduce  # asked for: tried as asked


def test_gloo_on_gpu_replicas_is_refused_naming_nccl():
    with pytest.raises(
        ValueError,
        match=r"communication='gloo' .* \['/gpu:0', '/gpu:1'\]\. HINT: use communication='nccl'",
    ):
        collective_options("gloo", GPU2)


def test_gloo_leaves_tensorflows_own_collectives_on_the_ring():
    options = collective_options("gloo", CPU4)
    assert options.implementation == tf.distribute.experimental.CommunicationImplementation.RING


@pytest.mark.parametrize(
    "strategy_fn, choices",
    [
        (lambda: collective_options("nccl", CPU4), "'auto' or 'ring' or 'gloo'"),
        (
            lambda: mirrored_cross_device_ops("nccl", ["/gpu:0", "/cpu:0"]),
            "'auto' or 'hierarchical_copy' or 'reduce_to_one_device'",
        ),
    ],
)
def test_nccl_without_gpus_is_a_clear_error_naming_what_the_strategy_accepts(strategy_fn, choices):
    with pytest.raises(
        ValueError,
        match=r"communication='nccl' needs every replica on a GPU, "
        rf"but .* would run on \[.*'/cpu:0'.*\]\. HINT: use communication={choices} \(",
    ):
        strategy_fn()


def test_nccl_requested_on_this_cpu_host_through_make_strategy():
    with pytest.raises(ValueError, match=r"needs every replica on a GPU.*/cpu:0"):
        make_strategy("mirrored", cluster=SINGLE, communication="nccl")


@pytest.mark.parametrize(
    "name, communication",
    [("mirrored", "ring"), ("multi_worker_mirrored", "hierarchical_copy"), ("one_device", "nccl")],
)
def test_communication_not_valid_for_the_strategy(name, communication):
    with pytest.raises(
        ValueError,
        match=rf"communication='{communication}' is not valid for "
        rf"strategy '{name}'\. Choose one of",
    ):
        make_strategy(name, cluster=SINGLE, communication=communication)


def test_unknown_options_are_refused_with_the_accepted_list():
    with pytest.raises(
        TypeError,
        match=r"unexpected option\(s\) \['variable_partitioner'\]\. "
        r"Options accepted for 'mirrored': cross_device_ops",
    ):
        make_strategy("mirrored", cluster=SINGLE, variable_partitioner=None)


@pytest.mark.parametrize(
    "devices, error, match",
    [
        ("/cpu:0", TypeError, "must be a list"),
        ([], ValueError, "names no device"),
        (["cpu0"], ValueError, r"\['cpu0'\] are not device strings"),
        (["/cpu:0", "/CPU:0"], ValueError, "names a device twice"),
    ],
)
def test_bad_device_lists(devices, error, match):
    with pytest.raises(error, match=match):
        make_strategy("mirrored", cluster=SINGLE, devices=devices)


@pytest.mark.requires_gpu(n=2)
def test_nccl_mirrored_on_real_gpus():
    strategy = make_strategy("mirrored", cluster=SINGLE, communication="nccl")
    total = strategy.reduce("SUM", strategy.run(lambda: tf.constant(1.0)), axis=None)
    assert float(total) == strategy.num_replicas_in_sync


# --------------------------------------------------- tier 2: real strategies in this process


def test_virtual_cpus_are_set_once_and_idempotent(virtual_cpus):
    assert virtual_cpus == CPU4
    assert tfdist.virtual_cpus(4) == CPU4
    tf.constant(1.0)  # TensorFlow is initialised from here on
    assert tfdist.virtual_cpus(4) == CPU4
    assert len(tf.config.list_logical_devices("CPU")) == 4
    with pytest.raises(
        RuntimeError,
        match=r"virtual_cpus\(2\) was called after TensorFlow "
        r"initialised its devices, with 4 logical CPU\(s\)\. HINT",
    ):
        tfdist.virtual_cpus(2)
    with pytest.raises(ValueError, match=r"Received: n=0"):
        tfdist.virtual_cpus(0)


def test_auto_on_four_logical_cpus_is_mirrored_and_reduces_the_exact_sum(virtual_cpus):
    strategy = make_strategy(cluster=SINGLE)
    assert isinstance(strategy, tf.distribute.MirroredStrategy)
    assert strategy.num_replicas_in_sync == 4
    assert isinstance(strategy.extended._cross_device_ops, tf.distribute.ReductionToOneDevice)

    def replica_value():
        ctx = tf.distribute.get_replica_context()
        return tf.cast(ctx.replica_id_in_sync_group + 1, tf.float32) * 10.0

    per_replica = strategy.run(replica_value)
    devices = {v.device for v in strategy.experimental_local_results(per_replica)}
    assert len(devices) == 4
    assert float(strategy.reduce("SUM", per_replica, axis=None)) == 100.0
    assert float(strategy.reduce("MEAN", per_replica, axis=None)) == 25.0


def test_mirrored_on_chosen_devices_and_one_device_and_default(virtual_cpus):
    two = make_strategy("mirrored", cluster=SINGLE, devices=["/cpu:1", "/cpu:2"])
    assert two.num_replicas_in_sync == 2
    assert sorted(two.extended.worker_devices) == [
        "/job:localhost/replica:0/task:0/device:CPU:1",
        "/job:localhost/replica:0/task:0/device:CPU:2",
    ]
    one = make_strategy("one_device", cluster=SINGLE, devices=["/cpu:3"])
    assert isinstance(one, tf.distribute.OneDeviceStrategy)
    assert one.extended.worker_devices[0].endswith("CPU:3")
    with one.scope():
        v = tf.Variable(1.0)
    assert v.device.endswith("CPU:3")
    assert make_strategy("off", cluster=SINGLE) is tf.distribute.get_strategy()
    with pytest.raises(ValueError, match="one_device takes exactly one device"):
        make_strategy("one_device", cluster=SINGLE, devices=["/cpu:0", "/cpu:1"])


def test_mirrored_passes_cross_device_ops_through(virtual_cpus):
    ops = tf.distribute.HierarchicalCopyAllReduce()
    strategy = make_strategy("mirrored", cluster=SINGLE, cross_device_ops=ops)
    assert strategy.extended._cross_device_ops is ops
    with pytest.raises(ValueError, match="either communication='nccl' or cross_device_ops="):
        make_strategy("mirrored", cluster=SINGLE, communication="nccl", cross_device_ops=ops)


def test_multi_worker_after_initialisation_is_refused_with_the_fix(virtual_cpus):
    tf.constant(1.0)
    with pytest.raises(
        RuntimeError,
        match=r"multi_worker_mirrored must be built before "
        r"TensorFlow initialises.*HINT: call tfdist.make_strategy\(\) first",
    ):
        make_strategy("multi_worker_mirrored", cluster=ClusterSpec.local(workers=2))


def test_parameter_server_partitioner_strings():
    from tfdist.strategy.builders import _partitioner

    partitioners = tf.distribute.experimental.partitioners
    p = _partitioner("min_size", 2, min_shard_bytes=1024)
    assert isinstance(p, partitioners.MinSizePartitioner)
    # 10 x 64 float32 = 2560 bytes, min 1024 bytes per shard -> capped at the 2 ps tasks
    assert p(tf.TensorShape([10, 64]), tf.float32) == [2, 1]
    # at most 1024 bytes per shard -> 3 shards, whatever the number of ps tasks
    p = _partitioner("max_size", 2, max_shard_bytes=1024)
    assert p(tf.TensorShape([10, 64]), tf.float32) == [3, 1]
    assert _partitioner("fixed", 3)(tf.TensorShape([10, 4]), tf.float32) == [3, 1]
    with pytest.raises(ValueError, match=r"variable_partitioner='even' is not known"):
        _partitioner("even", 2)
    with pytest.raises(ValueError, match=r"max_shards go\(es\) with variable_partitioner="):
        _partitioner(partitioners.FixedShardsPartitioner(2), 2, max_shards=3)


def test_tfdist_strategy_variable_overrides_auto_only(monkeypatch, virtual_cpus):
    monkeypatch.setenv("TFDIST_STRATEGY", "one_device")
    assert isinstance(make_strategy(cluster=SINGLE), tf.distribute.OneDeviceStrategy)
    assert isinstance(make_strategy("mirrored", cluster=SINGLE), tf.distribute.MirroredStrategy)
    monkeypatch.setenv("TFDIST_STRATEGY", "mirored")
    with pytest.raises(ValueError, match="Received: TFDIST_STRATEGY='mirored'"):
        make_strategy(cluster=SINGLE)


def test_tfdist_communication_applies_only_where_it_is_a_valid_choice(monkeypatch, virtual_cpus):
    monkeypatch.setenv("TFDIST_COMMUNICATION", "hierarchical_copy")
    strategy = make_strategy("mirrored", cluster=SINGLE)
    assert isinstance(strategy.extended._cross_device_ops, tf.distribute.HierarchicalCopyAllReduce)
    monkeypatch.setenv("TFDIST_COMMUNICATION", "ring")  # a multi-worker choice: mirrored keeps auto
    strategy = make_strategy("mirrored", cluster=SINGLE)
    assert isinstance(strategy.extended._cross_device_ops, tf.distribute.ReductionToOneDevice)
    monkeypatch.setenv("TFDIST_COMMUNICATION", "nccl")
    with pytest.raises(ValueError, match="needs every replica on a GPU"):
        make_strategy("mirrored", cluster=SINGLE)

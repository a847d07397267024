"""The TensorFlow internals tfdist's fixes read are found on this release (imports
TensorFlow)."""


def test_the_coordination_protobufs_are_found_on_this_release():
    from tfdist.fixes.tensorflow import COORDINATION_CONFIG

    module = COORDINATION_CONFIG.get()
    assert hasattr(module, "CoordinatedJob") and hasattr(module, "CoordinationServiceConfig")

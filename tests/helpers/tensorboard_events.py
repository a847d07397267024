"""The scalars of TensorBoard event files, read back with TensorFlow's own reader."""

import glob
import os


def event_files(log_dir, run="train"):
    return sorted(glob.glob(os.path.join(log_dir, run, "events.out.tfevents.*")))


def scalars(path) -> dict:
    """{tag: [value of each step, in step order]} of the scalar float summaries of one file."""
    import tensorflow as tf
    from tensorflow.python.summary.summary_iterator import summary_iterator

    found = {}
    for event in summary_iterator(path):
        for value in event.summary.value:
            if not value.HasField("tensor"):
                continue
            array = tf.make_ndarray(value.tensor)
            if array.ndim == 0 and array.dtype.kind == "f":
                found.setdefault(value.tag, []).append((event.step, float(array)))
    return {tag: [v for _, v in sorted(steps)] for tag, steps in found.items()}

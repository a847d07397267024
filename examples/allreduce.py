"""Every worker contributes (its index + 1); each prints the all-reduced sum.

tfdist launch --workers 2 examples/allreduce.py
"""

import tfdist


def main():
    strategy = tfdist.make_strategy()  # first thing: multi-worker collectives start here
    import tensorflow as tf

    spec = tfdist.detect_cluster()
    contribution = float((spec.task_index or 0) + 1)
    total = strategy.reduce("SUM", strategy.run(lambda: tf.constant(contribution)), axis=None)
    print(
        f"{type(strategy).__name__} with {strategy.num_replicas_in_sync} replicas: "
        f"task {spec.task} gave {contribution:g}, all-reduced sum = {float(total):g}"
    )


if __name__ == "__main__":
    main()

"""What gradient compression must do to one training step, and to training, on any strategy.

Shared by the mirrored tests (tests/inprocess/test_compression_mirrored.py) and the
multi_worker_mirrored job (tests/cluster/test_gradient_compression.py).
"""

NOT_BFLOAT16 = 1 + 2**-10  # float16 holds it exactly; bfloat16 (8 bits of mantissa) makes it 1
OVER_FLOAT16 = 81920.0  # a sum of replicas' gradients past float16's largest value (65504)


def one_step(keras, tf, strategy, total: float) -> float:
    """A custom loop's first step (GradientTape, optimizer.apply_gradients in strategy.run):
    a zero kernel of 2048 weights, SGD(1.0), each replica's gradient total / replicas. Returns
    the kernel's first weight after the step: -total when the replicas' sum was exact."""
    replicas = strategy.num_replicas_in_sync
    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input((1,)),
                keras.layers.Dense(2048, use_bias=False, kernel_initializer="zeros"),
            ]
        )
        optimizer = keras.optimizers.SGD(1.0)

    @tf.function
    def step():
        def replica():
            with tf.GradientTape() as tape:
                loss = tf.reduce_sum(model(tf.fill([1, 1], total / replicas)))
            variables = model.trainable_variables
            optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))

        strategy.run(replica)

    step()
    return float(model.layers[0].kernel.numpy()[0, 0])


def digits():
    """sklearn's digits, scaled to [0, 1]: (x float32, y int32)."""
    from sklearn.datasets import load_digits

    data = load_digits()
    return (data.data / 16.0).astype("float32"), data.target.astype("int32")


def build_digits_classifier(keras, seed: int):
    """The compiled 64-128-128-10 classifier of the compression tests (call in the scope)."""
    keras.utils.set_random_seed(seed)
    model = keras.Sequential(
        [
            keras.Input((64,)),
            keras.layers.Dense(128, activation="relu"),
            keras.layers.Dense(128, activation="relu"),
            keras.layers.Dense(10, activation="softmax"),
        ]
    )
    model.compile(optimizer=keras.optimizers.Adam(1e-3), loss="sparse_categorical_crossentropy")
    return model


def within_one_percent(losses: dict) -> list:
    """Problems of {"None": loss, "bf16": loss, "fp16": loss}: a compressed loss more than 1%
    from the uncompressed one, or every loss equal to it (nothing was cast)."""
    base = losses["None"]
    problems = [
        f"{mode}: {losses[mode]} vs {base}"
        for mode in ("bf16", "fp16")
        if mode in losses and abs(losses[mode] - base) > 0.01 * base
    ]
    if all(losses[mode] == base for mode in losses):
        problems.append(f"every loss equals the uncompressed one: nothing was cast ({losses})")
    return problems

"""Mixed precision on whatever strategy this machine (or job) gets, trained with tfdist.fit.

    python examples/mixed_precision.py                              # "auto": chosen for the devices
    python examples/mixed_precision.py --precision mixed_bfloat16 --virtual_cpus 2
    python examples/mixed_precision.py --precision mixed_float16    # on GPUs; warns on CPUs
    tfdist launch --workers 2 examples/mixed_precision.py           # multi_worker_mirrored

`tfdist.set_precision` sets the global Keras dtype policy and returns its name: "auto"
picks mixed_bfloat16 on GPUs of compute capability 8.0 or more and on CPUs with native
bfloat16 (amx_bf16 / avx512_bf16), mixed_float16 on older tensor-core GPUs, else float32.
Under a mixed policy the layers compute in 16 bits and keep their variables in float32; the
last layer is given dtype="float32" so that the softmax and the loss are computed in float32.
mixed_float16 also needs loss scaling: `compile` wraps the optimizer in a LossScaleOptimizer.
Set the policy before building the model: layers read it when they are created. Prints the
policy, the dtypes of a hidden and of the last layer, the optimizer, and the held-out
accuracy on scikit-learn's digits (chance: 0.100).
"""

import digits
from absl import app, flags

import tfdist

FLAGS = flags.FLAGS
digits.define_flags(epochs=6)  # --epochs, --global_batch_size, --learning_rate
flags.DEFINE_enum(
    "precision",
    "auto",
    ["auto", "mixed_bfloat16", "mixed_float16", "float32"],
    "Keras dtype policy, or auto.",
)
flags.DEFINE_integer(
    "virtual_cpus",
    0,
    "Split the CPU into this many logical devices "
    "(mirrored on one machine); 0 keeps the devices as they are.",
)


def main(argv):
    del argv
    if FLAGS.virtual_cpus:
        tfdist.virtual_cpus(FLAGS.virtual_cpus)
    strategy = tfdist.make_strategy()  # "auto": from TF_CONFIG / SLURM / the local devices
    policy = tfdist.set_precision(FLAGS.precision)  # before the model is built
    import tensorflow as tf

    keras = tf.keras  # Keras 3, or tf_keras with TF_USE_LEGACY_KERAS=1
    chief = tfdist.detect_cluster().is_chief
    if chief:
        print(
            f"{type(strategy).__name__}, replicas in sync: {strategy.num_replicas_in_sync}, "
            f"precision policy: {policy}",
            flush=True,
        )

    def build_model():  # called by tfdist.fit inside strategy.scope()
        model = digits.dense_model()
        model.compile(
            optimizer=keras.optimizers.Adam(FLAGS.learning_rate),
            loss="sparse_categorical_crossentropy",
            metrics=["accuracy"],
        )
        return model

    (x_train, y_train), (x_test, y_test) = digits.load()
    history = tfdist.fit(
        build_model,
        (x_train, y_train),
        strategy=strategy,
        epochs=FLAGS.epochs,
        global_batch_size=FLAGS.global_batch_size,
        shuffle=True,
        seed=0,
    )  # an epoch: one pass over the examples
    model = history.model
    results = tfdist.evaluate(
        model,
        (x_test, y_test),
        strategy=strategy,
        global_batch_size=FLAGS.global_batch_size,
        verbose=0,
    )
    if chief:
        for name in ("hidden", "probabilities"):
            layer = model.get_layer(name)
            print(
                f"layer {name}: compute dtype {layer.compute_dtype}, variable dtype "
                f"{layer.variable_dtype}"
            )
        print(f"optimizer: {type(model.optimizer).__name__}")  # loss scaling: mixed_float16
        print(
            f"{type(strategy).__name__}: held-out accuracy {results['accuracy']:.3f} "
            f"(chance 0.100), loss {results['loss']:.3f}",
            flush=True,
        )


if __name__ == "__main__":
    app.run(main)

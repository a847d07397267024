"""`Compression`: what a tensor is cast to on the wire, and back (Horovod's `hvd.Compression`).

`Compression.none` sends tensors as they are; `Compression.fp16` sends floating-point tensors as
float16 (half the bytes of float32), `Compression.bf16` (tfdist's addition) as bfloat16, which
keeps float32's range. Other dtypes are sent as they are. Imports TensorFlow only inside
functions.
"""

from __future__ import annotations

__all__ = ["Compression", "Compressor", "FP16Compressor", "NoneCompressor"]


class Compressor:
    """Casts a tensor for the wire (`compress`) and back (`decompress`)."""

    wire_dtype_name = None

    @classmethod
    def compress(cls, tensor):
        """Returns (tensor for the wire, context for `decompress`)."""
        import tensorflow as tf

        if cls.wire_dtype_name is None or not tensor.dtype.is_floating:
            return tensor, None
        wire = tf.as_dtype(cls.wire_dtype_name)
        if tensor.dtype == wire:
            return tensor, None
        return tf.cast(tensor, wire), tensor.dtype

    @staticmethod
    def decompress(tensor, ctx):
        import tensorflow as tf

        return tensor if ctx is None else tf.cast(tensor, ctx)


class NoneCompressor(Compressor):
    """Tensors go as they are."""


class FP16Compressor(Compressor):
    """Floating-point tensors go as float16. With `op=Average`, tfdist divides by the number of
    processes before the cast, so the sum on the wire stays within float16's range when each
    process's tensor does."""

    wire_dtype_name = "float16"


class BF16Compressor(Compressor):
    """Floating-point tensors go as bfloat16: float32's range, 8 bits of mantissa."""

    wire_dtype_name = "bfloat16"


class Compression:
    """The compressors, by Horovod's names: `Compression.none`, `Compression.fp16`, and
    tfdist's `Compression.bf16`."""

    none = NoneCompressor
    fp16 = FP16Compressor
    bf16 = BF16Compressor

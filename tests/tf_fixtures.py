"""TensorFlow test fixtures: frozen GraphDefs and SavedModels built with TensorFlow itself, and
TensorFlow's outputs.

Run as a script (``python tests/tf_fixtures.py OUT_DIR``) so that the test process never imports
TensorFlow. For each fixture it writes ``NAME.pb`` (the frozen GraphDef, binary), ``NAME.pbtxt``
(text, small fixtures only), ``NAME_saved_model/`` (the SavedModel, as ``model.export`` or
``tf.saved_model.save`` writes it), ``NAME.json`` (the placeholder names and fetched tensor names of
the frozen graph; the signature's input and output keys) and ``NAME.npz`` (inputs ``in_*``, the frozen
function's outputs ``out_*`` and the reloaded SavedModel signature's ``sig_<key>``).
``fixtures_dir`` caches the lot under a directory keyed by this file's hash, so a change here
regenerates them.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

CACHE = Path(os.environ.get("AOTC_TF_FIXTURES", Path(tempfile.gettempdir()) / "aotc-tf-fixtures"))
NAMES = ("mlp", "cnn", "reduce_sum", "nn_ops", "math_ops", "shape_ops", "more_ops", "variables", "bert",
         "mobilenet_v2", "resnet50", "efficientnet_b0")
# Fixtures too large for a text GraphDef to be worth writing.
LARGE = ("mobilenet_v2", "resnet50", "efficientnet_b0")


def fixtures_dir() -> Path:
    """The directory holding every fixture, generated (in a subprocess) on first use."""
    return generated_dir(Path(__file__), hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16])


def generated_dir(script: Path, key: str) -> Path:
    """``CACHE/key``, written by running ``script DIR`` under TensorFlow the first time it is asked for."""
    out = CACHE / key
    if (out / "done").is_file():
        return out
    CACHE.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"{key}.", dir=CACHE))  # written whole, then renamed into place
    proc = subprocess.run([sys.executable, str(script), str(tmp)], capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join(proc.stderr.strip().splitlines()[-15:])
        hint = ("TensorFlow generates these fixtures: pip install 'aotc[test]' (tensorflow-cpu)"
                if "No module named 'tensorflow'" in proc.stderr else "the fixture script failed")
        raise RuntimeError(f"{hint}:\n{tail}")
    (tmp / "done").write_text("ok\n")
    try:
        tmp.rename(out)
    except OSError:  # another process got there first: its copy is as good
        pass
    return out


# -- the fixtures (run under TensorFlow only) -------------------------------------------------------
def _rng():
    import numpy as np

    return np.random.default_rng(0)


def _randomize(model) -> None:
    """Random weights everywhere, positive variances: fresh BatchNorm layers are an identity."""
    import numpy as np

    rng = _rng()
    for w in model.weights:
        shape = tuple(w.shape)
        if "variance" in w.path:
            w.assign(rng.uniform(0.5, 1.5, shape).astype(np.float32))
        else:
            w.assign((rng.standard_normal(shape) * 0.3).astype(np.float32))


def _calibrate(model, x) -> None:
    """Deep networks with random weights: BatchNorm's statistics set to the batch's own (one training
    step with momentum 0) and random scales and offsets, so activations neither vanish nor explode."""
    import keras
    import numpy as np

    rng = _rng()
    for layer in model.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            layer.momentum = 0.0
            layer.gamma.assign(rng.uniform(0.5, 1.5, tuple(layer.gamma.shape)).astype(np.float32))
            layer.beta.assign((rng.standard_normal(tuple(layer.beta.shape)) * 0.2).astype(np.float32))
    model(x, training=True)


def _keras(model, spec, args):
    """A Keras model's frozen function, and its SavedModel as ``model.export`` writes it."""
    import tensorflow as tf

    fn = tf.function(lambda x: model(x, training=False)).get_concrete_function(spec)
    return fn, args, lambda path: model.export(path, format="tf_saved_model", verbose=False, input_signature=[spec])


def _module(f, spec, args, module=None):
    """A tf.function's frozen graph, and a SavedModel with it as serving_default (``module`` holds its
    variables and further signatures, ``more_signatures``)."""
    import tensorflow as tf

    concrete = f.get_concrete_function(*spec)
    if module is None:
        module = tf.Module()
        module.f = f
    signatures = {"serving_default": concrete, **getattr(module, "more_signatures", {})}
    return concrete, args, lambda path: tf.saved_model.save(module, path, signatures=signatures)


def mlp():
    import keras
    import numpy as np
    import tensorflow as tf

    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu"),
                              keras.layers.Dense(16, activation="tanh"), keras.layers.Dense(10),
                              keras.layers.Softmax()])
    _randomize(model)
    return _keras(model, tf.TensorSpec([4, 16], tf.float32), [_rng().standard_normal((4, 16)).astype(np.float32)])


def cnn():
    import keras
    import numpy as np
    import tensorflow as tf

    layers = keras.layers
    model = keras.Sequential([
        keras.Input((12, 12, 3)),
        layers.Conv2D(8, 3, padding="same"), layers.BatchNormalization(), layers.ReLU(max_value=6.0),
        layers.DepthwiseConv2D(3, padding="valid", depth_multiplier=2), layers.BatchNormalization(),
        layers.Activation("swish"), layers.MaxPooling2D(2),
        layers.Conv2D(8, 3, dilation_rate=2, padding="same", activation="relu"),
        layers.Conv2D(6, 3, strides=2, padding="same"), layers.AveragePooling2D(2, padding="same"),
        layers.GlobalAveragePooling2D(), layers.Dense(5)])
    _randomize(model)
    # The batch is left open: the test pins it as a user would with --input-shape.
    return _keras(model, tf.TensorSpec([None, 12, 12, 3], tf.float32, name="image"),
                  [_rng().standard_normal((2, 12, 12, 3)).astype(np.float32)])


def bert():
    """A Transformer encoder block of Keras layers: token and position embeddings, self-attention,
    a gelu MLP (the exact form; the tanh approximation in a second layer) and layer norms."""
    import keras
    import numpy as np
    import tensorflow as tf

    layers = keras.layers
    seq, width = 8, 32
    ids = keras.Input((seq,), dtype="int32", name="ids")
    x = layers.Embedding(100, width)(ids)
    x = x + layers.Embedding(seq, width)(keras.ops.arange(seq))
    x = layers.LayerNormalization(epsilon=1e-6)(x)
    att = layers.MultiHeadAttention(num_heads=4, key_dim=width // 4)(x, x)
    x = layers.LayerNormalization(epsilon=1e-6)(x + att)
    h = layers.Dense(64, activation="gelu")(x)
    h = layers.Dense(64, activation=lambda t: keras.activations.gelu(t, approximate=True))(h)
    x = layers.LayerNormalization(epsilon=1e-6)(x + layers.Dense(width)(h))
    model = keras.Model(ids, layers.Dense(3)(x[:, 0]))
    _randomize(model)
    rng = _rng()
    return _keras(model, tf.TensorSpec([2, seq], tf.int32, name="ids"),
                  [rng.integers(0, 100, (2, seq)).astype(np.int32)])


def _application(ctor, size):
    import numpy as np
    import tensorflow as tf

    model = ctor(input_shape=(size, size, 3), weights=None, classes=10, classifier_activation=None)
    x = _rng().standard_normal((1, size, size, 3)).astype(np.float32)
    _calibrate(model, _rng().standard_normal((4, size, size, 3)).astype(np.float32))
    return _keras(model, tf.TensorSpec([1, size, size, 3], tf.float32, name="image"), [x])


def mobilenet_v2():
    import keras

    return _application(lambda **kw: keras.applications.MobileNetV2(alpha=0.35, **kw), 96)


def resnet50():
    import keras

    return _application(keras.applications.ResNet50, 64)


def efficientnet_b0():
    import keras

    return _application(keras.applications.EfficientNetB0, 64)


def reduce_sum():
    import numpy as np
    import tensorflow as tf

    spec = tf.TensorSpec([1000], tf.float32)
    rng = _rng()
    return _module(tf.function(lambda x, y, z: tf.reduce_sum(x + y * z)), [spec] * 3,
                   [rng.standard_normal(1000).astype(np.float32) for _ in range(3)])


def nn_ops():
    import numpy as np
    import tensorflow as tf

    rng = _rng()
    c = lambda *shape: tf.constant((rng.standard_normal(shape) * 0.5).astype(np.float32))  # noqa: E731
    w, dw, scale, offset, mean = c(3, 3, 4, 6), c(3, 3, 4, 2), c(4), c(4), c(4)
    var = tf.constant(rng.uniform(0.5, 1.5, 4).astype(np.float32))
    m1, m2, m3, bm = c(3, 5), c(7, 5), c(5, 2), c(2, 6, 5)

    @tf.function
    def f(x, v, a):
        bn, *_ = tf.compat.v1.nn.fused_batch_norm(x, scale, offset, mean, var, epsilon=1e-3, is_training=False)
        outs = [
            tf.nn.conv2d(bn, w, strides=1, padding=[[0, 0], [1, 2], [0, 1], [0, 0]]),
            tf.nn.conv2d(x, w, strides=[1, 2, 1, 1], padding="SAME", dilations=1),
            tf.nn.conv2d(x, w, strides=1, padding="VALID", dilations=[1, 2, 2, 1]),
            tf.nn.depthwise_conv2d(x, dw, strides=[1, 2, 2, 1], padding="SAME"),
            tf.nn.max_pool2d(x, 3, 2, "SAME"), tf.nn.avg_pool2d(x, [2, 3], [1, 2], "SAME"),
            tf.nn.avg_pool2d(x, 2, 2, "VALID"),
            tf.nn.elu(v), tf.nn.selu(v), tf.nn.leaky_relu(v, 0.1), tf.nn.softplus(v), tf.math.erf(v),
            tf.nn.log_softmax(v), tf.nn.softmax(v), tf.nn.relu6(v * 4), tf.nn.relu(v), tf.sigmoid(v), tf.tanh(v),
            tf.matmul(a, m1, transpose_a=True), tf.matmul(m2, a, transpose_b=True),
            tf.matmul(m3, a, transpose_a=True, transpose_b=True),
            tf.linalg.matmul(c(2, 7, 6), bm), tf.linalg.matmul(bm, c(6, 4), adjoint_a=True),
            tf.nn.bias_add(v, c(5)),
        ]
        return outs

    spec = [tf.TensorSpec([2, 7, 6, 4], tf.float32), tf.TensorSpec([3, 5], tf.float32),
            tf.TensorSpec([3, 5], tf.float32)]
    return _module(f, spec, [rng.standard_normal(s.shape).astype(np.float32) for s in spec])


def math_ops():
    import numpy as np
    import tensorflow as tf

    rng = _rng()

    @tf.function
    def f(x, y, p, i):
        outs = [
            x - y, x / y, tf.maximum(x, y), tf.minimum(x, 0.5), tf.math.rsqrt(p), tf.sqrt(p), tf.square(x),
            tf.math.squared_difference(x, y), tf.pow(p, y), tf.exp(x), tf.math.log(p), -x, tf.abs(x),
            tf.reduce_mean(x, axis=[1, 2], keepdims=True), tf.reduce_sum(x, axis=-1), tf.reduce_max(x, axis=0),
            tf.reduce_min(x), tf.reduce_prod(p, axis=1, keepdims=True),
            tf.argmax(x, axis=2), tf.argmax(x, axis=0, output_type=tf.int32),
            tf.cast(x * 10, tf.int32), tf.cast(i, tf.float32) + 0.5,
            tf.where(x > y, x, y), tf.raw_ops.Select(condition=i[:, 0] > 2, x=x, y=y),
            tf.where(x > 0, x, 0.0) * 2.0, i * 3 + i // 2,
        ]
        return outs

    shape = (3, 4, 5)
    args = [rng.standard_normal(shape).astype(np.float32), rng.standard_normal(shape).astype(np.float32),
            rng.uniform(0.5, 2.0, shape).astype(np.float32), rng.integers(0, 6, (3, 4)).astype(np.int32)]
    spec = [tf.TensorSpec(a.shape, tf.as_dtype(a.dtype)) for a in args]
    return _module(f, spec, args)


def shape_ops():
    import numpy as np
    import tensorflow as tf

    rng = _rng()

    @tf.function
    def f(x, y, idx):
        n = tf.shape(x)[0]
        outs = [
            tf.concat([x, y], axis=-1), tf.stack([x, y], axis=1), tf.reshape(x, [n, -1]),
            tf.transpose(x, [2, 0, 1]), tf.squeeze(tf.reshape(x, [1, 2, 1, 3, 4])),
            tf.squeeze(tf.reshape(x, [2, 1, 3, 1, 4]), axis=[3]), tf.expand_dims(x, -1), tf.expand_dims(x, 1),
            tf.cast(tf.shape(x), tf.float32),
            x[1], x[:, 1:], x[..., ::-2], x[:, tf.newaxis, -2:, 1], x[..., 0], x[-1, ::-1, tf.newaxis],
            x[1:, ..., 1:3], x[::2, 2:0:-1], x[:, :, tf.newaxis, ...],
            tf.slice(x, [0, 1, 1], [2, -1, 2]), tf.tile(x, [1, 2, 3]), tf.fill([2, 3], 1.5) + y[0, :2, :3],
            tf.range(2, 11, 3), tf.cast(tf.range(n), tf.float32) * 0.5,
            tf.gather(x, idx, axis=1), tf.gather(x, [1, 0], axis=0),
            tf.pad(x, [[0, 1], [2, 0], [1, 1]]), tf.pad(x, [[1, 0], [0, 0], [0, 2]], constant_values=-3.0),
            tf.identity_n([x, y])[1] * 2.0,
        ]
        return outs

    args = [rng.standard_normal((2, 3, 4)).astype(np.float32), rng.standard_normal((2, 3, 4)).astype(np.float32),
            np.array([2, 0, 2, 1], np.int32)]
    spec = [tf.TensorSpec(a.shape, tf.as_dtype(a.dtype)) for a in args]
    return _module(f, spec, args)


def more_ops():
    import numpy as np
    import tensorflow as tf

    rng = _rng()
    c = lambda *shape: tf.constant((rng.standard_normal(shape) * 0.5).astype(np.float32))  # noqa: E731
    wt, wt2, e1, e2 = c(3, 3, 4, 3), c(2, 2, 2, 3), c(2, 6, 3), c(6, 2)
    v1 = tf.compat.v1.image

    @tf.function
    def f(x, img, ids, s):
        return [
            tf.nn.conv2d_transpose(img, wt, [1, 10, 12, 4], strides=2, padding="SAME"),
            tf.nn.conv2d_transpose(img, wt, [1, 11, 13, 4], strides=2, padding="VALID"),
            tf.nn.conv2d_transpose(img, wt2, [1, 5, 6, 2], strides=1, padding="SAME"),
            *tf.unstack(x, axis=1), *tf.unstack(s, axis=0),
            tf.pad(x, [[0, 0], [2, 1], [1, 3]], mode="REFLECT"), tf.pad(x, [[1, 1], [2, 2], [0, 1]], mode="SYMMETRIC"),
            tf.einsum("bij,bjk->bik", x, e1), tf.einsum("ij->ji", s), tf.einsum("bij,jk->bik", x, e2),
            tf.einsum("ij,ij->i", s, s), tf.einsum("bij,bkj->bki", x, x), tf.einsum("...j,jk->...k", x, e2),
            *tf.math.top_k(s, k=3), tf.math.top_k(x, k=1).indices,
            tf.one_hot(ids, 5), tf.one_hot(ids, 4, on_value=2.0, off_value=-1.0, axis=0),
            tf.cumsum(s, axis=1), tf.cumsum(s, axis=0, exclusive=True), tf.cumsum(s, axis=1, reverse=True),
            tf.cumsum(s, axis=-1, exclusive=True, reverse=True),
            v1.resize_bilinear(img, [8, 9], half_pixel_centers=True),
            v1.resize_bilinear(img, [8, 9], align_corners=True),
            v1.resize_bilinear(img, [3, 4]), tf.image.resize(img, [8, 9], "bilinear"),
            v1.resize_nearest_neighbor(img, [8, 9]), v1.resize_nearest_neighbor(img, [8, 9], align_corners=True),
            v1.resize_nearest_neighbor(img, [3, 4], half_pixel_centers=True), tf.image.resize(img, [9, 13], "nearest"),
            tf.nn.gelu(x, approximate=False), tf.nn.gelu(x, approximate=True), tf.math.erfc(s),
        ]

    args = [rng.standard_normal((2, 5, 6)).astype(np.float32), rng.standard_normal((1, 5, 6, 3)).astype(np.float32),
            np.array([2, 0, -1, 7, 3], np.int32), rng.standard_normal((3, 7)).astype(np.float32)]
    spec = [tf.TensorSpec(a.shape, tf.as_dtype(a.dtype)) for a in args]
    return _module(f, spec, args)


def variables():
    """A module with variables, as tf.saved_model.save writes it: ResourceGather (an embedding
    lookup), a nested tf.function (a PartitionedCall within the signature's call), and a second
    signature that updates a variable."""
    import numpy as np
    import tensorflow as tf

    rng = _rng()

    class Module(tf.Module):
        def __init__(self):
            super().__init__()
            self.table = tf.Variable(rng.standard_normal((10, 4)).astype(np.float32), name="table")
            self.w = tf.Variable(rng.standard_normal((4, 3)).astype(np.float32), name="w")
            self.scale = tf.Variable(np.float32(1.5), name="scale")
            self.step = tf.Variable(np.float32(0), name="step")

        @tf.function
        def project(self, e):
            return tf.matmul(e, self.w) * self.scale

        @tf.function(input_signature=[tf.TensorSpec([5], tf.int32)])
        def lookup(self, ids):
            e = tf.nn.embedding_lookup(self.table, ids)
            return {"rows": e, "proj": self.project(e), "fixed": tf.constant([1.0, 2.0])}

        @tf.function(input_signature=[tf.TensorSpec([], tf.float32)])
        def bump(self, by):
            self.step.assign_add(by)
            return {"step": self.step.read_value() * 2.0}

    m = Module()
    m.more_signatures = {"bump": m.bump.get_concrete_function()}
    return _module(m.lookup, [], [np.array([3, 0, 9, 3, 1], np.int32)], module=m)


def _write(name: str, out: Path) -> None:
    import json

    import numpy as np
    import tensorflow as tf
    from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

    fn, args, export = globals()[name]()
    frozen = convert_variables_to_constants_v2(fn)
    graph_def = frozen.graph.as_graph_def()
    inputs = [t.name for t in frozen.inputs if t.dtype != tf.resource]
    outputs = [t.name for t in frozen.outputs]
    results = frozen(*[tf.constant(a) for a in args])
    results = results if isinstance(results, (list, tuple)) else [results]
    (out / f"{name}.pb").write_bytes(graph_def.SerializeToString())
    if name not in LARGE:
        tf.io.write_graph(graph_def, str(out), f"{name}.pbtxt", as_text=True)
    arrays = {f"in_{i}": a for i, a in enumerate(args)}
    arrays.update({f"out_{i}": np.asarray(r) for i, r in enumerate(results)})

    saved = out / f"{name}_saved_model"
    export(str(saved))
    sig = tf.saved_model.load(str(saved)).signatures["serving_default"]
    keys = list(sig.structured_input_signature[1])
    if len(keys) > 1:  # a tf.function's: its parameters' names, in order
        keys = [spec.name for spec in fn.structured_input_signature[0]]
    sig_out = sig(**{k: tf.constant(a) for k, a in zip(keys, args, strict=True)})
    arrays.update({f"sig_{k}": np.asarray(v) for k, v in sig_out.items()})
    # What TensorFlow reads from the checkpoint, to test aotc's reader of the format against.
    prefix = str(saved / "variables" / "variables")
    checkpoint = {n: list(s) for n, s in tf.train.list_variables(prefix)}
    if name == "variables":
        arrays.update({f"ckpt_{n}": tf.train.load_variable(prefix, n) for n in checkpoint if "ATTRIBUTES" in n})
    (out / f"{name}.json").write_text(json.dumps({"inputs": inputs, "outputs": outputs, "signature_inputs": keys,
                                                  "signature_outputs": sorted(sig_out), "checkpoint": checkpoint}))
    np.savez(out / f"{name}.npz", **arrays)


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)  # others share the machine
    tf.config.threading.set_inter_op_parallelism_threads(1)
    for fixture in NAMES:
        _write(fixture, Path(sys.argv[1]))

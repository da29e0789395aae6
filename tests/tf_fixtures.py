"""TensorFlow test fixtures: frozen GraphDefs built with TensorFlow itself, and TensorFlow's outputs.

Run as a script (``python tests/tf_fixtures.py OUT_DIR``) so that the test process never imports
TensorFlow. For each fixture it writes ``NAME.pb`` (binary GraphDef), ``NAME.pbtxt`` (text),
``NAME.json`` (the placeholder names and the fetched tensor names) and ``NAME.npz`` (inputs ``in_*``
and TensorFlow's outputs ``out_*``). ``fixtures_dir`` caches the lot under a directory keyed by this
file's hash, so a change here regenerates them.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

CACHE = Path(os.environ.get("AOTC_TF_FIXTURES", Path(tempfile.gettempdir()) / "aotc-tf-fixtures"))
NAMES = ("mlp", "cnn", "reduce_sum", "nn_ops", "math_ops", "shape_ops")


def fixtures_dir() -> Path:
    """The directory holding every fixture, generated (in a subprocess) on first use."""
    key = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]
    out = CACHE / key
    if (out / "done").is_file():
        return out
    CACHE.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f"{key}.", dir=CACHE))  # written whole, then renamed into place
    proc = subprocess.run([sys.executable, __file__, str(tmp)], capture_output=True, text=True)
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


def mlp():
    import keras
    import numpy as np
    import tensorflow as tf

    model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu"),
                              keras.layers.Dense(16, activation="tanh"), keras.layers.Dense(10),
                              keras.layers.Softmax()])
    _randomize(model)
    fn = tf.function(lambda x: model(x, training=False)).get_concrete_function(tf.TensorSpec([4, 16], tf.float32))
    return fn, [_rng().standard_normal((4, 16)).astype(np.float32)]


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
    fn = tf.function(lambda x: model(x, training=False)).get_concrete_function(
        tf.TensorSpec([None, 12, 12, 3], tf.float32, name="image"))
    return fn, [_rng().standard_normal((2, 12, 12, 3)).astype(np.float32)]


def reduce_sum():
    import numpy as np
    import tensorflow as tf

    spec = tf.TensorSpec([1000], tf.float32)
    fn = tf.function(lambda x, y, z: tf.reduce_sum(x + y * z)).get_concrete_function(spec, spec, spec)
    rng = _rng()
    return fn, [rng.standard_normal(1000).astype(np.float32) for _ in range(3)]


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
    return f.get_concrete_function(*spec), [rng.standard_normal(s.shape).astype(np.float32) for s in spec]


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
    return f.get_concrete_function(*spec), args


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
    return f.get_concrete_function(*spec), args


def _write(name: str, out: Path) -> None:
    import json

    import numpy as np
    import tensorflow as tf
    from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

    fn, args = globals()[name]()
    frozen = convert_variables_to_constants_v2(fn)
    graph_def = frozen.graph.as_graph_def()
    inputs = [t.name for t in frozen.inputs if t.dtype != tf.resource]
    outputs = [t.name for t in frozen.outputs]
    results = frozen(*[tf.constant(a) for a in args])
    results = results if isinstance(results, (list, tuple)) else [results]
    (out / f"{name}.pb").write_bytes(graph_def.SerializeToString())
    tf.io.write_graph(graph_def, str(out), f"{name}.pbtxt", as_text=True)
    (out / f"{name}.json").write_text(json.dumps({"inputs": inputs, "outputs": outputs}))
    arrays = {f"in_{i}": a for i, a in enumerate(args)}
    arrays.update({f"out_{i}": np.asarray(r) for i, r in enumerate(results)})
    np.savez(out / f"{name}.npz", **arrays)


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)  # others share the machine
    tf.config.threading.set_inter_op_parallelism_threads(1)
    for fixture in NAMES:
        _write(fixture, Path(sys.argv[1]))

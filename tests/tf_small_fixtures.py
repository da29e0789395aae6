"""Small TensorFlow fixtures built with TensorFlow itself, with what TensorFlow computes on them:
variables updated in place (run twice) and dilated convolutions as tf.nn.convolution writes them.

Run as a script (``python tests/tf_small_fixtures.py OUT_DIR``) so that the test process never imports
TensorFlow; ``small_fixtures_dir`` caches the result under a directory keyed by this file's hash.

- ``graph.pb``: a TF1-style graph (resource variables as VarHandleOp nodes, as tfcompile's users
  write them) whose fetch ``y`` depends, through control edges, on an AssignAddVariableOp and an
  AssignSubVariableOp and reads the variables before and after them; ``c`` is only read. ``graph.npz``
  holds the feeds of two session runs, ``y`` of each, the variables' initial values and their values
  after each run.
- ``ref.pb``: the same pattern with a TF1 reference variable (VariableV2, Assign/AssignAdd, reads as
  Identity); ``ref.npz`` the fetch and the variable after each of two runs.
- ``module_saved_model/``: a tf.Module whose tf.function signature ``step`` assigns, adds to and
  subtracts from its variables; ``module.npz`` the same for two calls of the reloaded signature.
- ``train_saved_model/``: a softmax regression's training step (GradientTape through sparse and dense
  softmax cross-entropy, then assign_sub), and ``train.npz`` its loss over three calls and the
  variables after them.
- ``dilated.pb``: tf.nn.convolution and tf.nn.depthwise_conv2d with dilation rates, SAME and VALID,
  which TensorFlow writes as SpaceToBatchND -> Conv2D (or DepthwiseConv2dNative) -> BatchToSpaceND;
  ``dilated.npz`` the input ``x`` and the outputs ``y_<name>``.
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

from tf_fixtures import generated_dir


def small_fixtures_dir() -> Path:
    """The directory holding the fixtures, generated (in a subprocess) on first use."""
    key = "small-" + hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]
    return generated_dir(Path(__file__), key)


def _graph(out: Path) -> None:
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(0)
    init = {"w": rng.standard_normal((3, 4)).astype(np.float32),
            "b": rng.standard_normal(4).astype(np.float32),
            "c": rng.standard_normal((2, 4)).astype(np.float32)}
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [2, 3], name="x")
        w = tf.Variable(init["w"], name="w")
        b = tf.Variable(init["b"], name="b")
        c = tf.Variable(init["c"], name="c")
        before = tf.matmul(x, w.read_value()) + b.read_value()  # the old values
        with tf.control_dependencies([before]):
            add = w.assign_add(tf.matmul(tf.transpose(x), c.read_value()) * 0.1, read_value=False)
            sub = b.assign_sub(tf.reduce_mean(before, axis=0), read_value=False)
        with tf.control_dependencies([add, sub]):  # the new values
            after = tf.matmul(x, w.read_value()) + b.read_value()
        tf.identity(before * 2.0 + after, name="y")
        feeds = [rng.standard_normal((2, 3)).astype(np.float32) for _ in range(2)]
        arrays = {f"init_{k}": v for k, v in init.items()}
        with tf.compat.v1.Session(graph=g) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for i, f in enumerate(feeds):
                arrays[f"x_{i}"] = f
                arrays[f"y_{i}"] = sess.run("y:0", {x: f})
                for k, v in (("w", w), ("b", b), ("c", c)):
                    arrays[f"{k}_{i}"] = sess.run(v.read_value())
    (out / "graph.pb").write_bytes(g.as_graph_def().SerializeToString())
    np.savez(out / "graph.npz", **arrays)


def _ref(out: Path) -> None:
    import numpy as np
    import tensorflow as tf

    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [3], name="x")
        v = tf.compat.v1.Variable(np.arange(3, dtype=np.float32), name="v", use_resource=False)
        old = tf.identity(v) * 1.0
        with tf.control_dependencies([old]):
            new = tf.compat.v1.assign_add(v, x)
        with tf.control_dependencies([new]):
            tf.identity(old + new * 2.0, name="y")
        arrays = {}
        with tf.compat.v1.Session(graph=g) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            for i in range(2):
                arrays[f"x_{i}"] = np.full(3, i + 1, np.float32)
                arrays[f"y_{i}"], arrays[f"v_{i}"] = sess.run(["y:0", v], {x: arrays[f"x_{i}"]})
    (out / "ref.pb").write_bytes(g.as_graph_def().SerializeToString())
    np.savez(out / "ref.npz", **arrays)


def _module(out: Path) -> None:
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(1)

    class Module(tf.Module):
        def __init__(self):
            super().__init__()
            self.acc = tf.Variable(rng.standard_normal((3, 2)).astype(np.float32), name="acc")
            self.count = tf.Variable(np.float32(0), name="count")
            self.last = tf.Variable(np.zeros(2, np.float32), name="last")
            self.scale = tf.Variable(np.float32(0.5), name="scale")

        @tf.function(input_signature=[tf.TensorSpec([3, 2], tf.float32)])
        def step(self, x):
            self.acc.assign_add(x * self.scale)
            self.count.assign_add(1.0)
            self.acc.assign_sub(tf.broadcast_to(tf.reduce_mean(self.acc, axis=0, keepdims=True), [3, 2]))
            self.last.assign(tf.reduce_sum(self.acc, axis=0) / self.count)
            return {"out": self.acc * 2.0, "n": self.count.read_value()}

    m = Module()
    tf.saved_model.save(m, str(out / "module_saved_model"), signatures={"serving_default": m.step})
    loaded = tf.saved_model.load(str(out / "module_saved_model"))
    names = ("acc", "count", "last", "scale")
    arrays = {f"init_{k}": getattr(loaded, k).numpy() for k in names}
    for i in range(2):
        x = rng.standard_normal((3, 2)).astype(np.float32)
        res = loaded.signatures["serving_default"](x=tf.constant(x))
        arrays[f"x_{i}"] = x
        arrays.update({f"{k}_{i}": v.numpy() for k, v in res.items()})
        arrays.update({f"{k}_{i}": getattr(loaded, k).numpy() for k in names if k not in res})
    np.savez(out / "module.npz", **arrays)


def _train(out: Path) -> None:
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(3)

    class Step(tf.Module):
        def __init__(self):
            super().__init__()
            self.w = tf.Variable(rng.standard_normal((6, 4)).astype(np.float32) * 0.1, name="w")
            self.b = tf.Variable(np.zeros(4, np.float32), name="b")

        @tf.function(input_signature=[tf.TensorSpec([5, 6], tf.float32), tf.TensorSpec([5], tf.int64)])
        def step(self, x, y):
            with tf.GradientTape() as tape:
                logits = tf.matmul(x, self.w) + self.b
                sparse = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits)
                dense = tf.nn.softmax_cross_entropy_with_logits(labels=tf.one_hot(y, 4), logits=logits * 0.5)
                loss = tf.reduce_mean(sparse) + 0.1 * tf.reduce_mean(dense)
            gw, gb = tape.gradient(loss, [self.w, self.b])
            self.w.assign_sub(0.5 * gw)
            self.b.assign_sub(0.5 * gb)
            return {"loss": loss}

    m = Step()
    tf.saved_model.save(m, str(out / "train_saved_model"), signatures={"serving_default": m.step})
    loaded = tf.saved_model.load(str(out / "train_saved_model"))
    arrays = {"init_w": loaded.w.numpy(), "init_b": loaded.b.numpy()}
    for i in range(3):
        arrays[f"x_{i}"] = rng.standard_normal((5, 6)).astype(np.float32)
        arrays[f"y_{i}"] = rng.integers(0, 4, 5)
        res = loaded.signatures["serving_default"](x=tf.constant(arrays[f"x_{i}"]), y=tf.constant(arrays[f"y_{i}"]))
        arrays[f"loss_{i}"] = res["loss"].numpy()
    arrays.update(w=loaded.w.numpy(), b=loaded.b.numpy())
    np.savez(out / "train.npz", **arrays)


def _dilated(out: Path) -> None:
    import numpy as np
    import tensorflow as tf

    rng = np.random.default_rng(2)
    x0 = rng.standard_normal((2, 13, 11, 4)).astype(np.float32)
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, x0.shape, name="x")
        w = tf.constant(rng.standard_normal((3, 3, 4, 6)).astype(np.float32))
        dw = tf.constant(rng.standard_normal((3, 2, 4, 2)).astype(np.float32))
        outs = {
            "same": tf.nn.convolution(x, w, padding="SAME", dilations=[2, 3]),
            "valid": tf.nn.convolution(x, w, padding="VALID", dilations=[3, 2]),
            "depthwise": tf.nn.depthwise_conv2d(x, dw, [1, 1, 1, 1], "SAME", dilations=[2, 2]),
        }
        for k, v in outs.items():
            tf.identity(v, name=f"y_{k}")
        with tf.compat.v1.Session(graph=g) as sess:
            arrays = {f"y_{k}": sess.run(f"y_{k}:0", {x: x0}) for k in outs}
    (out / "dilated.pb").write_bytes(g.as_graph_def().SerializeToString())
    np.savez(out / "dilated.npz", x=x0, **arrays)


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    _graph(Path(sys.argv[1]))
    _ref(Path(sys.argv[1]))
    _module(Path(sys.argv[1]))
    _train(Path(sys.argv[1]))
    _dilated(Path(sys.argv[1]))

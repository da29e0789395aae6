"""A TensorFlow training step, the seeds' MNIST softmax example on scikit-learn's digits: a tf.Module whose
tf.function ``train_step(x, labels)`` computes the softmax cross-entropy of x @ W + b, its gradients with
GradientTape, and ``assign_sub``s lr * gradient from W and b; saved as a SavedModel with what TensorFlow
computes when the reloaded signature runs 100 steps (``train.npz``: the batches, each step's loss, the
initial and final variables).

Run as a script (``python tests/train_tf_fixture.py OUT_DIR``) so that the test process never imports
TensorFlow; ``train_fixture_dir`` caches the result under a directory keyed by this file's hash.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

from tf_fixtures import generated_dir

STEPS, BATCH, LR = 100, 100, 0.5


def train_fixture_dir() -> Path:
    """The directory holding the fixture, generated (in a subprocess) on first use."""
    here = Path(__file__)  # the data comes from train_models.py: its changes make a new fixture too
    key = "train-" + hashlib.sha256(here.read_bytes() + (here.parent / "train_models.py").read_bytes()).hexdigest()[:16]
    return generated_dir(Path(__file__), key)


def _build(out: Path) -> None:
    import numpy as np
    import tensorflow as tf
    from train_models import batches, digits

    class Softmax(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            self.W = tf.Variable(tf.zeros([64, 10]), name="W")
            self.b = tf.Variable(tf.zeros([10]), name="b")

        @tf.function(input_signature=[tf.TensorSpec([BATCH, 64], tf.float32), tf.TensorSpec([BATCH], tf.int64)])
        def train_step(self, x, labels):
            with tf.GradientTape() as tape:
                logits = tf.matmul(x, self.W) + self.b
                loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))
            dw, db = tape.gradient(loss, [self.W, self.b])
            self.W.assign_sub(LR * dw)
            self.b.assign_sub(LR * db)
            return {"loss": loss}

    m = Softmax()
    tf.saved_model.save(m, str(out / "saved_model"), signatures={"serving_default": m.train_step})
    loaded = tf.saved_model.load(str(out / "saved_model"))
    x, y = digits()
    xs, ys, losses = [], [], []
    for xb, yb in batches(x, y, STEPS):
        losses.append(float(loaded.signatures["serving_default"](x=tf.constant(xb), labels=tf.constant(yb))["loss"]))
        xs.append(xb)
        ys.append(yb)
    np.savez(out / "train.npz", x=np.stack(xs), labels=np.stack(ys), loss=np.array(losses, np.float32),
             W=loaded.W.numpy(), b=loaded.b.numpy())


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    _build(Path(sys.argv[1]))

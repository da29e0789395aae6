"""Writes the example's frozen graph, mlp.pb, and TensorFlow's outputs for the program's input.

    python make_model.py            # needs tensorflow (pip install tensorflow-cpu)

A Keras MLP (8 -> 16 relu -> 4 softmax, batch 2) with fixed-seed weights, frozen into constants the
way tfcompile users froze their graphs (the placeholder is "x", the output node "Identity"), so the
graph is a few KB. mlp.pb and expected.txt are committed: building the example needs neither this
script nor TensorFlow; run it again only to change the model.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent


def program_input() -> np.ndarray:
    """The input main.cc fills in: x[i] = ((7 i) mod 11) / 8 - 0.5, row-major (exact in float32)."""
    i = np.arange(16)
    return (((7 * i) % 11) / 8 - 0.5).astype(np.float32).reshape(2, 8)


def main(out: Path) -> None:
    import keras
    import tensorflow as tf
    from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(4), keras.layers.Softmax()])
    rng = np.random.default_rng(21)
    for w in model.weights:
        w.assign((rng.standard_normal(tuple(w.shape)) * 0.5).astype(np.float32))
    fn = tf.function(lambda x: model(x, training=False)).get_concrete_function(
        tf.TensorSpec([2, 8], tf.float32, name="x"))
    graph_def = convert_variables_to_constants_v2(fn).graph.as_graph_def()
    (out / "mlp.pb").write_bytes(graph_def.SerializeToString())
    probs = fn(tf.constant(program_input()))
    probs = np.asarray(probs[0] if isinstance(probs, (list, tuple)) else probs)
    lines = [f"probs[{r}][{c}] = {probs[r, c]:.6f}" for r in range(2) for c in range(4)]
    (out / "expected.txt").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE)

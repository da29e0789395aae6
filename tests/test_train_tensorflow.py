"""A TensorFlow training step compiled from its graph: the seeds' MNIST softmax example (tf.function,
GradientTape, assign_sub) on the handwritten digits, its variables in-place arguments, holds
TensorFlow's variables after 100 steps (fixture from TensorFlow: tests/train_tf_fixture.py)."""

from __future__ import annotations

import numpy as np
import pytest
from train_models import digits
from train_tf_fixture import STEPS, train_fixture_dir

import aotc
from aotc.compiler import compile_model


@pytest.mark.slow
def test_tensorflow_training_step_matches_tensorflow_for_100_steps(tmp_path) -> None:
    fx = train_fixture_dir()
    data = np.load(fx / "train.npz")
    model = aotc.load(compile_model(fx / "saved_model", tmp_path, "tfstep", variables_to_feed=["all"]).prefix)
    assert [(t.name, t.updated) for t in model.inputs] == [("labels", False), ("x", False), ("W", True), ("b", True)]
    w, b = np.zeros((64, 10), np.float32), np.zeros(10, np.float32)
    for i in range(STEPS):
        (loss,) = model.run({"x": data["x"][i], "labels": data["labels"][i], "W": w, "b": b})
        assert float(loss) == pytest.approx(float(data["loss"][i]), rel=1e-4)
    np.testing.assert_allclose(w, data["W"], rtol=0, atol=1e-4)
    np.testing.assert_allclose(b, data["b"], rtol=0, atol=1e-4)
    x, y = digits()  # what TensorFlow learnt, aotc learnt: >= 0.91 on the held-out digits
    assert ((x[-200:] @ w + b).argmax(1) == y[-200:]).mean() >= 0.91

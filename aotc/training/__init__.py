"""Training: reverse-mode autodiff over the IR (autodiff.py) and the compiled training step."""

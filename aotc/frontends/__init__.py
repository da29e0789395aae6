"""Frontends translate a model file into the IR; they know nothing of C."""

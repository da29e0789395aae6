"""User-facing errors.

Anything the user can cause (a bad model, a bad config, a bad feed) raises ``AotcError`` or one of its
subclasses; the CLI prints its message on one line and exits non-zero. Any other exception is a bug.
"""


class AotcError(Exception):
    """An error caused by the user's input, reported without a traceback."""


class UnsupportedOpsError(AotcError):
    """The model uses ops aotc cannot compile. Lists every op type and the nodes that use it."""

    def __init__(self, missing: dict[str, list[str]]) -> None:
        self.missing = missing
        parts = [f"{op} (nodes: {', '.join(names[:5])}{', ...' if len(names) > 5 else ''})"
                 for op, names in sorted(missing.items())]
        super().__init__(f"unsupported ops: {'; '.join(parts)}")


class BuildError(AotcError):
    """The C compiler failed on generated code (a bug in aotc, reported with the build directory)."""

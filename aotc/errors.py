"""User-facing errors.

Anything the user can cause (a bad model, a bad config, a bad feed) raises ``AotcError`` or one of its
subclasses; the CLI prints its message on one line and exits non-zero. Any other exception is a bug.
"""


class AotcError(Exception):
    """An error caused by the user's input, reported without a traceback."""


class MissingOpsError(AotcError):
    """Ops aotc cannot handle, all listed in one message with the first nodes of each (``missing``: op
    type -> the nodes that use it); a subclass says in ``what`` what they lack."""

    what: str

    def __init__(self, missing: dict[str, list[str]]) -> None:
        self.missing = missing
        parts = [f"{op} (nodes: {', '.join(names[:5])}{', ...' if len(names) > 5 else ''})"
                 for op, names in sorted(missing.items())]
        super().__init__(f"{self.what}: {'; '.join(parts)}")


class UnsupportedOpsError(MissingOpsError):
    """The model uses ops aotc cannot compile."""

    what = "unsupported ops"


class BuildError(AotcError):
    """The C compiler failed on generated code (a bug in aotc, reported with the build directory)."""


class RunError(AotcError, RuntimeError):
    """A compiled model's run returned a nonzero status. Subclasses are the documented statuses of
    NAME_run (``code``, and ``status``: the C macro's name after NAME_); a status aotc does not know
    (a library from a newer aotc) raises RunError itself."""

    code = -1
    status = "ERR_UNKNOWN"
    meaning = "unknown status"

    def __init__(self, model: str, code: int | None = None) -> None:
        if code is not None:
            self.code = code
        self.model = model
        meaning = self.meaning.replace("NAME_", f"{model.upper()}_")
        super().__init__(f"{model}_run returned {self.code} ({model.upper()}_{self.status}): {meaning}; "
                         "the outputs are unspecified")


class NullArgumentError(RunError):
    code = 1
    status = "ERR_NULL_ARGUMENT"
    meaning = "a pointer argument (an input, an output, the inputs or outputs array, or times) is NULL"


class WorkspaceError(RunError):
    code = 2
    status = "ERR_WORKSPACE"
    meaning = "the workspace is NULL, not 64-byte aligned, or smaller than NAME_WORKSPACE_BYTES"


class IndexOutOfRangeError(RunError):
    code = 3
    status = "ERR_INDEX_OUT_OF_RANGE"
    meaning = ("an index input holds a value outside -n..n-1 for an axis of length n (0..n-1 for "
               "ArrayFeatureExtractor, RoiAlign's batch indices and MaxUnpool), or a sequence length "
               "(ReverseSequence, RNN/GRU/LSTM sequence_lens) outside 0..n")


# Every documented status but NAME_OK (0): the header, the run function and the bindings list these.
RUN_ERRORS: tuple[type[RunError], ...] = (NullArgumentError, WorkspaceError, IndexOutOfRangeError)


def run_error(model: str, code: int) -> RunError:
    """The exception for status ``code`` of model ``model``'s run."""
    for cls in RUN_ERRORS:
        if cls.code == code:
            return cls(model)
    return RunError(model, code)

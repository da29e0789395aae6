"""The ONNX backend test suite through aotc: one test per case whose ops aotc claims to support
(``_expanded`` variants included when all their nodes are supported), compared with the suite's own
expected outputs at its tolerances (rtol 1e-3, atol 1e-7 unless the case says otherwise).

Cases are compiled in merged batches (see ``backend_suite.Runner``); the known failures of
``backend_expected_failures`` are strict xfails, batched apart so that they cannot slow down the rest.
"""

from __future__ import annotations

import pytest
from backend_expected_failures import EXPECTED_FAILURES
from backend_suite import BackendCase, Runner, is_collected, load_cases, make_batches

CASES = [c for c in load_cases() if is_collected(c)]
BATCHES = make_batches(CASES, alone=lambda c: c.id in EXPECTED_FAILURES)
BATCH_OF = {c.id: b for b in BATCHES for c in b}


def _params() -> list:
    res = []
    for c in CASES:
        marks = []
        if c.id in EXPECTED_FAILURES:
            marks.append(pytest.mark.xfail(reason=EXPECTED_FAILURES[c.id], strict=True))
        res.append(pytest.param(c, id=c.id, marks=marks))
    return res


@pytest.fixture(scope="module")
def runner(tmp_path_factory) -> Runner:
    # -O1: the suite checks op semantics (no fast-math either way), and compiles twice as fast.
    return Runner(tmp_path_factory.mktemp("backend"), cflags=["-O1"])


@pytest.mark.parametrize("case", _params())
def test_backend_case(case: BackendCase, runner: Runner) -> None:
    runner.run(BATCH_OF[case.id])
    status, detail = runner.results[case.id]
    assert status == "pass", f"{status}: {detail}"


def test_expected_failures_are_collected() -> None:
    """A stale entry (renamed case, op no longer claimed) would silently never run."""
    ids = {c.id for c in CASES}
    assert not sorted(set(EXPECTED_FAILURES) - ids)

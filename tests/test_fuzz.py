"""The mutation fuzzer (tools/fuzz.py) as tests: a bounded campaign, and every model that ever failed.

Every mutated model must give a clean one-line error, or a library that matches the reference under
ASan/UBSan. ``AOTC_FUZZ_CASES=10000 pytest tests/test_fuzz.py -k campaign`` runs a longer campaign
(``AOTC_FUZZ_SEED`` picks another one, ``AOTC_FUZZ_JOBS`` the number of workers); a failure names
each case, which ``python tools/fuzz.py --case SEED:INDEX`` reruns.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import onnx
import onnxruntime as ort
import pytest
from onnx_helpers import require_sanitizers

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tools"))
import fuzz  # noqa: E402

CORPUS = Path(__file__).resolve().parent / "fuzz_corpus"
# About a minute on two cores: most cases end at a clean error, the rest build and run under ASan.
CASES = int(os.environ.get("AOTC_FUZZ_CASES", "400"))
SEED = int(os.environ.get("AOTC_FUZZ_SEED", "0"))
JOBS = int(os.environ.get("AOTC_FUZZ_JOBS", str(min(2, os.cpu_count() or 1))))
# A case compiles and runs in a few seconds even on a loaded machine; one that takes a minute is a hang.
CASE_TIMEOUT = 60.0


def _describe(failures: list[fuzz.Result]) -> str:
    return "\n".join(f"{r.case_id}: {r.signature}: {str(r.info.get('message', ''))[:200]}" for r in failures[:30])


def test_cases_are_deterministic():
    a, b = fuzz.make_case(3, 17), fuzz.make_case(3, 17)
    assert a.data == b.data and a.specs == b.specs and a.seed_model == b.seed_model
    models = {fuzz.make_case(3, i).data for i in range(3000)}  # every generator meets every seed
    assert len(models) > 2500


@pytest.mark.parametrize("name", sorted(fuzz.SEEDS))
def test_seed_models_are_valid(name):
    """Every failure must come from a mutation, so each seed passes the checker and loads in onnxruntime."""
    data = fuzz.build_model(name, [])
    onnx.checker.check_model(onnx.ModelProto.FromString(data), full_check=True)
    ort.InferenceSession(data, providers=["CPUExecutionProvider"])


def test_fuzz_campaign(tmp_path):
    require_sanitizers(tmp_path)
    results = fuzz.campaign(SEED, CASES, jobs=JOBS, case_timeout=CASE_TIMEOUT)
    assert len(results) == CASES
    failures = [r for r in results if r.outcome in fuzz.FAILURES]
    assert not failures, f"{len(failures)} of {CASES} cases failed:\n{_describe(failures)}"


def test_corpus_replays_to_its_expected_outcome(tmp_path):
    require_sanitizers(tmp_path)
    replayed = fuzz.replay_corpus(CORPUS, JOBS, CASE_TIMEOUT)
    assert replayed, "the corpus is empty"
    wrong = [f"{case.id}: {r.outcome}, expected {' or '.join(meta['expected'])}: {str(r.info.get('message', ''))[:200]}"
             for case, meta, r in replayed if r.outcome not in meta["expected"]]
    assert not wrong, "\n".join(wrong)

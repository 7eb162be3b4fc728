"""benchmarks/bench_peers.py: peer engines on the same target and prompts, one process each."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from argparse import Namespace
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "bench_peers.py"


def _module():
    spec = importlib.util.spec_from_file_location("bench_peers", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_summary_and_table_from_engine_results():
    peers = _module()
    args = Namespace(zoo="micro", scenario="jargon", max_prompts=2, max_new_tokens=4, gamma=3, threads=1,
                     device="cpu", k_max=2)
    result = {"ar": {"ms": [10.0, 30.0], "ids": [[1, 2, 3, 4], [5, 6, 7, 8]], "cost_ms": [1.0, 1.5]},
              "pld": {"ms": [5.0, 15.0], "ids": [[1, 2, 3, 4], [5, 6, 7, 9]]},
              "hf-greedy": {"ms": [40.0, 40.0], "ids": [[1, 2, 3, 4], [5, 6, 7, 8]], "cost_ms": [2.0, 2.5]},
              "llama-cpp": {"skipped": "ModuleNotFoundError: No module named 'llama_cpp'"}}
    doc = peers.summarise(result, args)
    e = doc["engines"]
    assert e["ar"]["tok_s"] == pytest.approx(8 / 0.04) and e["pld"]["tok_s"] == pytest.approx(8 / 0.02)
    assert e["pld"]["outputs_equal_to_ar"] == 1 and e["pld"]["cost_ms"] == [1.0, 1.5]    # ar's curve: one target path
    assert e["hf-greedy"]["cost_measured_by"] == "hf-greedy" and e["llama-cpp"] == result["llama-cpp"]
    assert doc["ar_over_hf_greedy"] == pytest.approx((8 / 0.04) / (8 / 0.08))
    text = peers.table(doc)
    assert "llama-cpp skipped: ModuleNotFoundError" in text and "harness ar / HF generate() greedy: 2.00x" in text


def test_an_unknown_engine_is_refused():
    res = subprocess.run([sys.executable, str(SCRIPT), "--engines", "ar,vllm"], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 2 and res.stderr.startswith("error: unknown engine 'vllm'")
    assert len(res.stderr.strip().splitlines()) == 1


@pytest.mark.subprocess
def test_the_micro_zoo_runs_every_engine_in_its_own_process(tmp_path):
    out = tmp_path / "peers.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    res = subprocess.run([sys.executable, str(SCRIPT), "--zoo", "micro", "--max-prompts", "2", "--max-new-tokens", "6",
                          "--k-max", "3", "--json", str(out)], capture_output=True, text=True, env=env, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    doc = json.loads(out.read_text())
    engines = doc["engines"]
    assert set(engines) == {"ar", "vanilla", "pld", "hf-greedy", "hf-assisted", "hf-lookup", "llama-cpp"}
    for name in ("ar", "vanilla", "pld", "hf-greedy", "hf-assisted", "hf-lookup"):
        e = engines[name]
        assert e["tokens"] == 2 * 6 and e["tok_s"] > 0 and len(e["cost_ms"]) == 3, (name, e)
    assert engines["vanilla"]["outputs_equal_to_ar"] == engines["pld"]["outputs_equal_to_ar"] == 2   # greedy: exact
    if importlib.util.find_spec("llama_cpp") is None:
        assert "skipped" in engines["llama-cpp"]
    assert "harness ar / HF generate() greedy" in res.stdout

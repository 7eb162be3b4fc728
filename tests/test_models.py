"""Loading pairs from local checkpoints: tokenizer checks, fingerprints, bad paths."""

from __future__ import annotations

import pytest
import torch

from drift_cli.errors import BadInput
from drift_cli.models import fingerprint, load_pair
from tests.models import saved_pair


def test_load_pair_and_fingerprint(tmp_path):
    d, t = saved_pair(tmp_path)
    pair = load_pair(d, t, "cpu", "float32")
    assert pair.draft_info.fingerprint == fingerprint(d) != pair.target_info.fingerprint
    assert pair.target_info.parameters == sum(p.numel() for p in pair.target.parameters())
    assert not any(p.requires_grad for p in pair.draft.parameters())
    assert pair.eos_id is not None


def test_fingerprint_changes_with_weights_and_config(tmp_path):
    d, _ = saved_pair(tmp_path)
    before = fingerprint(d)
    cfg = (d / "config.json").read_text()
    (d / "config.json").write_text(cfg.replace('"rms_norm_eps"', '"rms_norm_eps_"'))
    assert fingerprint(d) != before
    (d / "config.json").write_text(cfg)
    assert fingerprint(d) == before
    w = d / "model.safetensors"
    data = bytearray(w.read_bytes())
    data[-1] ^= 1
    w.write_bytes(bytes(data))
    assert fingerprint(d) != before


def test_tokenizer_mismatch_is_refused_before_loading_models(tmp_path, monkeypatch):
    d, t = saved_pair(tmp_path, draft_extra=" zebra quagga okapi " * 50)
    import drift_cli.models as models

    monkeypatch.setattr(models, "load_model", lambda *a: pytest.fail("a model was loaded"))
    with pytest.raises(BadInput, match="tokenizers differ"):
        load_pair(d, t)


@pytest.mark.parametrize("what", ["missing", "no-config", "no-weights"])
def test_bad_paths(tmp_path, what):
    d, t = saved_pair(tmp_path)
    if what == "missing":
        d = tmp_path / "nope"
        msg = "not found"
    elif what == "no-config":
        (d / "config.json").unlink()
        msg = "no config.json"
    else:
        (d / "model.safetensors").unlink()
        msg = "no weight files"
    with pytest.raises(BadInput, match=msg):
        load_pair(d, t)


def test_bad_dtype_and_device(tmp_path):
    d, t = saved_pair(tmp_path)
    with pytest.raises(BadInput, match="did you mean 'float16'"):
        load_pair(d, t, "cpu", "flaot16")
    if not torch.cuda.is_available():
        with pytest.raises(BadInput, match="CUDA is not available"):
            load_pair(d, t, "cuda")

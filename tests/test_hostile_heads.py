"""Hostile model files: an EAGLE head whose config.json or weights are wrong, and non-finite weights
in any model a command loads. Each is refused when it loads, in one line naming the problem (the
field, the file or the tensor) with exit 2, whichever command loads it (bench --draft, bench
--offline-draft, ablate, regress pin), and nothing is written."""

from __future__ import annotations

import json
import pickle
import struct
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from drift_cli.cli import main
from tests.eagle_writer import write_eagle1, write_eagle3
from tests.models import saved_pair

CORPUS = Path("/usr/share/common-licenses")
VOCAB = 300


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    root = tmp_path_factory.mktemp("heads")
    draft, target_dir = saved_pair(root / "pair", vocab=VOCAB)
    target = AutoModelForCausalLM.from_pretrained(str(target_dir))
    return {"root": root, "draft": draft, "target": target_dir, "model": target,
            "eagle3": write_eagle3(root / "eagle3", target, draft_vocab=list(range(0, VOCAB, 3)))}


def run_cli(args, capsys):
    with pytest.raises(SystemExit) as exc:
        main([str(a) for a in args])
    out, err = capsys.readouterr()
    return exc.value.code, out, err


def assert_one_line(code, err, fragment):
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert fragment in lines[0], lines[0]


def bench(draft, target, out, *extra):
    return ["bench", "--corpus", CORPUS, "--draft", draft, "--target", target, "--max-prompts", "1",
            "--max-new-tokens", "4", "--no-control", "--out", out, *extra]


def edit_config(path: Path, **fields) -> Path:
    config = json.loads((path / "config.json").read_text())
    config.update(fields)
    (path / "config.json").write_text(json.dumps(config))
    return path


def edit_weight(path: Path, name: str, fn) -> Path:
    file = next(path.glob("*.safetensors"))
    tensors = load_file(str(file))
    tensors[name] = fn(tensors[name].clone())
    save_file(tensors, str(file))
    return path


def eagle3(t, p, **fields):
    return edit_config(write_eagle3(p, t, draft_vocab=list(range(0, VOCAB, 3))), **fields)


def eagle1(t, p, **fields):
    return edit_config(write_eagle1(p, t), **fields)


def shape_not_a_list(t, p):
    """A safetensors header whose first tensor's shape is a number."""
    write_eagle3(p, t)
    file = p / "model.safetensors"
    data = file.read_bytes()
    (size,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + size])
    name = next(k for k in header if k != "__metadata__")
    header[name]["shape"] = 7
    text = json.dumps(header).encode()
    file.write_bytes(struct.pack("<Q", len(text)) + text + data[8 + size:])
    return p


def pickled_bin(t, p):
    """A pytorch_model.bin that unpickles an arbitrary callable (never run: refused)."""
    write_eagle1(p, t)
    tensors = load_file(str(p / "model.safetensors"))
    (p / "model.safetensors").unlink()
    with open(p / "pytorch_model.bin", "wb") as fh:
        pickle.dump({**tensors, "x": print}, fh)
    return p


# (id, writer(target model, path), message fragment)
BAD_HEADS = [
    ("architectures a number", lambda t, p: eagle3(t, p, architectures=7), "architectures must be a list of names"),
    ("target_hidden_size a string", lambda t, p: eagle3(t, p, target_hidden_size="48"),
     "target_hidden_size must be a positive integer, got '48'"),
    ("draft_vocab_size a string", lambda t, p: eagle3(t, p, draft_vocab_size="100"),
     "draft_vocab_size must be a positive integer"),
    ("hidden_act unknown", lambda t, p: eagle3(t, p, hidden_act="bogus"), "hidden_act 'bogus' is not an activation"),
    ("hidden_act a number", lambda t, p: eagle3(t, p, hidden_act=3), "hidden_act must be an activation name"),
    ("eagle-1 layers a string", lambda t, p: eagle1(t, p, num_hidden_layers="1"),
     "num_hidden_layers must be a positive integer, got '1'"),
    ("eagle-1 layers 10^6", lambda t, p: eagle1(t, p, num_hidden_layers=10**6),
     "num_hidden_layers 1000000 but its weights hold 1 layers"),
    ("eagle-1 layers negative", lambda t, p: eagle1(t, p, num_hidden_layers=-1),
     "num_hidden_layers must be a positive integer, got -1"),
    ("zero KV heads", lambda t, p: eagle3(t, p, num_key_value_heads=0), "num_key_value_heads must be a positive"),
    ("KV heads not dividing", lambda t, p: eagle3(t, p, num_key_value_heads=3), "is not a multiple of"),
    ("intermediate size 10^9", lambda t, p: eagle3(t, p, intermediate_size=10**9),
     "midlayer.mlp.gate_proj.weight has shape"),
    ("rope_theta 0", lambda t, p: eagle3(t, p, rope_theta=0), "rope_theta must be a positive finite number, got 0"),
    ("rope_parameters theta negative", lambda t, p: eagle3(t, p, rope_parameters={"rope_type": "default",
                                                                                  "rope_theta": -1.0}),
     "rope_parameters.rope_theta must be a positive finite number"),
    ("rms eps negative", lambda t, p: eagle3(t, p, rms_norm_eps=-1e-6), "rms_norm_eps must be a positive finite"),
    ("aux layers empty", lambda t, p: eagle3(t, p, eagle_config={"eagle_aux_hidden_state_layer_ids": []}),
     "must be a non-empty list of integers, got []"),
    ("eagle_config a list", lambda t, p: eagle3(t, p, eagle_config=[0, 1]), "eagle_config must be a JSON object"),
    ("d2t fractional", lambda t, p: edit_weight(write_eagle3(p, t, draft_vocab=list(range(0, VOCAB, 3))), "d2t",
                                                lambda a: a.double() + 0.5), "d2t holds fractional values"),
    ("safetensors shape not a list", shape_not_a_list, "shape 7 is not a list of sizes"),
    ("pickled .bin", pickled_bin, "holds pickled objects that are not tensors"),
    ("NaN weight", lambda t, p: edit_weight(write_eagle3(p, t), "midlayer.mlp.up_proj.weight",
                                            lambda a: a.index_fill_(0, torch.tensor([1]), float("nan"))),
     "weight midlayer.mlp.up_proj.weight holds non-finite values"),
    ("inf weight", lambda t, p: edit_weight(write_eagle1(p, t), "fc.bias", lambda a: a.fill_(float("-inf"))),
     "weight fc.bias holds non-finite values"),
]


@pytest.mark.parametrize("case", BAD_HEADS, ids=[c[0] for c in BAD_HEADS])
def test_a_bad_head_is_refused_when_it_loads_in_one_line(case, saved, tmp_path, capsys):
    _, write, fragment = case
    head = write(saved["model"], tmp_path / "head")
    code, out, err = run_cli(bench(head, saved["target"], tmp_path / "runs", "--methods", "vanilla"), capsys)
    assert_one_line(code, err, fragment)
    assert "Warning" not in err and not list((tmp_path / "runs").rglob("run.json"))


def nan_head(saved, path):
    return edit_weight(write_eagle3(path, saved["model"], draft_vocab=list(range(0, VOCAB, 3))), "norm.weight",
                       lambda a: a.fill_(float("nan")))


def nan_model(saved, path):
    """A copy of the saved draft model with one NaN in its lm_head."""
    import shutil

    shutil.copytree(saved["draft"], path)
    return edit_weight(path, "lm_head.weight", lambda a: a.index_fill_(0, torch.tensor([3]), float("nan")))


# Every command and flag that loads a model: (id, argv(saved, bad path, out), what the bad file is, fragment)
LOADERS = [
    ("bench --draft HEAD", lambda s, bad, o: bench(bad, s["target"], o, "--methods", "vanilla"), nan_head,
     "weight norm.weight holds non-finite values"),
    ("bench --draft HEAD, T 0.8, B 1", lambda s, bad, o: bench(bad, s["target"], o, "--methods", "vanilla",
                                                               "--temperature", "0.8", "--batch-size", "1"),
     nan_head, "weight norm.weight"),
    ("bench --draft HEAD, T 0.8, B 2", lambda s, bad, o: bench(bad, s["target"], o, "--methods", "vanilla",
                                                               "--temperature", "0.8", "--batch-size", "2"),
     nan_head, "weight norm.weight"),
    ("bench --offline-draft HEAD", lambda s, bad, o: bench(s["eagle3"], s["target"], o, "--methods", "offline",
                                                           "--offline-draft", bad), nan_head, "weight norm.weight"),
    ("ablate --draft HEAD", lambda s, bad, o: ["ablate", "--corpus", CORPUS, "--draft", bad, "--target", s["target"],
                                               "--max-prompts", "1", "--max-new-tokens", "4", "--out", o,
                                               "--sweep", "lambda", "--values", "0.5"], nan_head, "weight norm.weight"),
    ("regress pin --draft HEAD", lambda s, bad, o: ["regress", "pin", "--corpus", CORPUS, "--draft", bad, "--target",
                                                    s["target"], "--max-prompts", "1", "--max-new-tokens", "4",
                                                    "--out", o / "base.json"], nan_head, "weight norm.weight"),
    ("bench --draft MODEL", lambda s, bad, o: bench(bad, s["target"], o, "--methods", "vanilla"), nan_model,
     "weight lm_head.weight holds non-finite values"),
    ("bench --target MODEL", lambda s, bad, o: bench(s["draft"], bad, o, "--methods", "vanilla"), nan_model,
     "weight lm_head.weight holds non-finite values"),
    ("bench --offline-draft MODEL", lambda s, bad, o: bench(s["draft"], s["target"], o, "--methods", "offline",
                                                            "--offline-draft", bad), nan_model, "weight lm_head.weight"),
    ("regress pin --draft MODEL", lambda s, bad, o: ["regress", "pin", "--corpus", CORPUS, "--draft", bad, "--target",
                                                     s["target"], "--max-prompts", "1", "--max-new-tokens", "4",
                                                     "--out", o / "base.json"], nan_model, "weight lm_head.weight"),
]


@pytest.mark.parametrize("case", LOADERS, ids=[c[0] for c in LOADERS])
def test_non_finite_weights_are_refused_by_every_loader_naming_the_tensor(case, saved, tmp_path, capsys):
    _, argv, make, fragment = case
    bad = make(saved, tmp_path / "bad")
    code, out, err = run_cli(argv(saved, bad, tmp_path / "out"), capsys)
    assert_one_line(code, err, fragment)
    assert str(bad) in err
    assert not [p for p in (tmp_path / "out").rglob("*") if p.is_file()]


def test_a_bad_config_is_refused_the_same_way_through_each_command(saved, tmp_path, capsys):
    """The config checks live in the loader: --offline-draft and ablate see the same line."""
    bad = eagle3(saved["model"], tmp_path / "bad", rms_norm_eps=-1.0)
    for argv in (bench(saved["eagle3"], saved["target"], tmp_path / "o", "--methods", "offline", "--offline-draft", bad),
                 ["ablate", "--corpus", CORPUS, "--draft", bad, "--target", saved["target"], "--max-prompts", "1",
                  "--max-new-tokens", "4", "--out", tmp_path / "o", "--sweep", "lambda", "--values", "0.5"]):
        code, out, err = run_cli(argv, capsys)
        assert_one_line(code, err, "rms_norm_eps must be a positive finite number, got -1.0")


def test_a_good_bin_head_still_loads(saved, tmp_path):
    """The weights-only reader keeps what it should: a .bin of tensors loads like its safetensors."""
    from drift_cli.eagle.load import read_weights

    head = write_eagle1(tmp_path / "head", saved["model"])
    tensors = load_file(str(head / "model.safetensors"))
    (head / "model.safetensors").unlink()
    torch.save(tensors, head / "pytorch_model.bin")
    got = read_weights(head)
    assert set(got) == set(tensors) and all(torch.equal(got[k], tensors[k]) for k in tensors)

"""Heads by path on the command line: a head in the vLLM / SpecForge layout runs losslessly with
--draft HEAD --target TARGET; a head that does not fit its target, or a --draft-kind that does not
describe the checkpoint, is refused in one line with exit 2; the flags apply where they mean
something; the smollm-style head is built by recipe and cached."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM

from drift_cli.cli import main
from drift_cli.models import fingerprint, load_pair
from tests.eagle_writer import write_eagle1, write_eagle3
from tests.models import saved_pair

CORPUS = Path("/usr/share/common-licenses")
VOCAB = 300


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A saved tiny target (2 layers, d 48, its tokenizer) and heads written for it."""
    root = tmp_path_factory.mktemp("heads")
    draft, target_dir = saved_pair(root / "pair", vocab=VOCAB)
    target = AutoModelForCausalLM.from_pretrained(str(target_dir))
    heads = {"eagle3": write_eagle3(root / "eagle3", target, draft_vocab=list(range(0, VOCAB, 3))),
             "eagle": write_eagle1(root / "eagle1", target)}
    return {"root": root, "draft": draft, "target": target_dir, "model": target, **heads}


def run_cli(args, capsys):
    with pytest.raises(SystemExit) as exc:
        main([str(a) for a in args])
    out, err = capsys.readouterr()
    return exc.value.code, out, err


def bench(head, target, out, *extra):
    return ["bench", "--corpus", CORPUS, "--draft", head, "--target", target, "--max-prompts", "2",
            "--max-new-tokens", "8", "--no-control", "--out", out, "--json", *extra]


def assert_one_line(code, err, fragment):
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert fragment in lines[0], lines[0]


@pytest.mark.parametrize("kind", ["eagle3", "eagle"])
def test_a_head_in_its_published_layout_runs_by_path(saved, kind, tmp_path, capsys):
    head = saved[kind]
    code, out, err = run_cli(bench(head, saved["target"], tmp_path, "--draft-kind", "auto",
                                   "--methods", "vanilla,drift,offline,osd", "--offline-draft", head), capsys)
    assert code == 0, err
    run = json.loads(out)
    for method in ("vanilla", "drift", "offline", "osd"):
        assert run["methods"][method]["ar_match_rate"] == 1.0, method
    draft = run["models"]["draft"]
    assert draft["kind"] == kind and draft["fingerprint"] == fingerprint(head) and draft["path"] == str(head)
    assert run["models"]["target"]["kind"] == "model"
    assert 0 < draft["parameters"] < run["models"]["target"]["parameters"]     # the head's own: not the target's


def test_the_python_loader_reads_a_head_and_binds_it_to_its_target(saved):
    from drift_cli.eagle import is_head
    from drift_cli.eagle.drafter import HeadDrafter
    from drift_cli.methods.base import draft_lm

    pair = load_pair(saved["eagle3"], saved["target"])
    assert is_head(pair.draft) and pair.draft_info.kind == "eagle3"
    assert pair.draft.get_input_embeddings() is pair.target.get_input_embeddings()
    assert isinstance(draft_lm(pair.draft), HeadDrafter) and draft_lm(pair.draft).vocab_size == VOCAB
    assert load_pair(saved["draft"], saved["target"]).draft_info.kind == "model"


MISFITS = {
    "hidden size": (lambda t, p: write_eagle3(p, t, hidden=32), "hidden size 32 does not fit the target's 48"),
    "target hidden size": (lambda t, p: write_eagle3(p, t, target_hidden=64),
                           "target_hidden_size 64 does not fit the target's hidden size 48"),
    "d2t out of range": (lambda t, p: write_eagle3(p, t, draft_vocab=list(range(10)), d2t_shift=295),
                         f"outside the target's vocabulary of {VOCAB}"),
    "aux layer id": (lambda t, p: write_eagle3(p, t, aux=[0, 1, 2]), "aux layer id 2 is not a layer of the 2-layer target"),
    "vocabulary": (lambda t, p: write_eagle3(p, t, config={"vocab_size": VOCAB + 1}),
                   f"vocabulary of {VOCAB + 1} tokens does not fit the target's {VOCAB}"),
    "eagle-1 hidden size": (lambda t, p: write_eagle1(p, t, hidden=32), "hidden size 32 does not fit the target's 48"),
}


@pytest.mark.parametrize("what", sorted(MISFITS))
def test_a_head_that_does_not_fit_its_target_is_refused_in_one_line(saved, what, tmp_path, capsys):
    write, fragment = MISFITS[what]
    head = write(saved["model"], tmp_path / "head")
    code, out, err = run_cli(bench(head, saved["target"], tmp_path / "out", "--methods", "vanilla"), capsys)
    assert_one_line(code, err, fragment)
    assert out == "" and not list((tmp_path / "out").rglob("run.json"))


@pytest.mark.parametrize("args,fragment", [
    (lambda s: ["--draft", s["eagle3"], "--target", s["target"], "--draft-kind", "eagle"], "is an EAGLE-3 head"),
    (lambda s: ["--draft", s["eagle"], "--target", s["target"], "--draft-kind", "eagle3"], "is an EAGLE-1 head"),
    (lambda s: ["--draft", s["draft"], "--target", s["target"], "--draft-kind", "eagle3"], "is not an EAGLE head"),
    (lambda s: ["--draft", s["eagle3"], "--target", s["target"], "--drafter", "eagle"], "--drafter picks a zoo's drafter"),
    (lambda s: ["--zoo", "micro", "--draft-kind", "eagle3"], "--draft-kind eagle3 describes --draft PATH"),
    (lambda s: ["--zoo", "micro", "--drafter", "eagle"], "--drafter eagle applies to the pretrained presets"),
    (lambda s: ["--zoo", "smollm", "--drafter", "eagle", "--draft-layers", "4"], "--draft-layers sizes the layer draft"),
])
def test_the_drafter_flags_are_refused_where_they_do_not_apply(saved, args, fragment, tmp_path, capsys):
    code, out, err = run_cli(["bench", "--corpus", CORPUS, "--methods", "vanilla", "--no-control", "--out", tmp_path,
                              *args(saved)], capsys)
    assert_one_line(code, err, fragment)


def test_bench_help_says_what_a_head_is_and_how_to_run_one(capsys):
    code, out, _ = run_cli(["bench", "--help"], capsys)
    text = " ".join(out.split())
    assert code == 0
    assert "EAGLE head: one decoder layer that drafts from the target's own hidden states" in text
    assert "drift bench --draft HEAD_DIR --target TARGET --draft-kind auto" in text
    assert "--drafter eagle" in text and "--draft-kind [auto|eagle|eagle3]" in text


# -- the zoo's head: built by recipe, cached ----------------------------------------------------------

@pytest.fixture
def toy_preset(tmp_path, monkeypatch):
    """A pretrained preset on a tiny GGUF target, its training text a few documents."""
    from drift_cli import scenarios
    from drift_cli.scenarios.document import Document
    from drift_cli.zoo import pretrained
    from drift_cli.zoo.presets import PRETRAINED, DraftFromTarget, HeadRecipe, KDRecipe, LabelledData
    from tests.gguf_writer import tiny_gguf_model, write_gguf
    from tests.models import TEXT, tiny_tokenizer

    tok = tiny_tokenizer(VOCAB)
    file = write_gguf(tmp_path / "toy.gguf", tiny_gguf_model(len(tok), tied=True), tok)
    words = TEXT.split()
    docs = [Document(f"prose:toy/{i}", " ".join(words[i * 40:(i + 1) * 40] * 3), "prose", "toy") for i in range(21)]
    monkeypatch.setattr(pretrained, "target_file", lambda p: file)
    monkeypatch.setattr(scenarios, "documents", lambda scenario, split: docs)
    data = LabelledData(raw_tokens=256, generated_tokens=256, seq_len=32, prefix_len=8, gen_batch=4, top_k=8)
    return replace(PRETRAINED["smollm"], name="toy", draft=DraftFromTarget(1, 64),
                   draft_train=KDRecipe(data, 1, 4, 1e-3, 1), offline=KDRecipe(data, 1, 4, 1e-3, 1),
                   head=HeadRecipe(epochs=2, batch=4, lr=3e-3, warmup=1, ttt_steps=2, aux_layers=(0, 1, 1)),
                   head_offline=HeadRecipe(epochs=1, batch=4, lr=1e-3, warmup=1))


@pytest.mark.zoo_build
def test_the_zoo_builds_its_head_once_by_recipe(toy_preset, capsys):
    from drift_cli.eagle.load import load_head
    from drift_cli.gguf import checkpoint
    from drift_cli.zoo import cache
    from drift_cli.zoo.pretrained import ensure_pretrained_head, ensure_pretrained_offline_head, target_file

    path = ensure_pretrained_head(toy_preset)
    recipe, build = cache.read_json(path / "recipe.json"), cache.read_json(path / "build.json")
    assert recipe["component"] == "eagle3-head" and recipe["labels"]["raw_tokens"] == 256
    assert {"labels", "check labels", "train", "agreement before", "agreement after"} <= set(build["steps"])
    assert all({"wall_s", "cpu_s"} <= set(s) for s in build["steps"].values())
    assert build["vocab"] == 64 and build["aux_layers"] == [0, 1, 1] and build["wall_time_s"] > 0
    mtime = (path / "model.safetensors").stat().st_mtime_ns
    assert ensure_pretrained_head(toy_preset) == path and (path / "model.safetensors").stat().st_mtime_ns == mtime
    target = AutoModelForCausalLM.from_pretrained(str(checkpoint(target_file(toy_preset))[0]))
    head = load_head(path, target)
    assert head.eagle_kind == "eagle3" and len(head.config.draft_vocab_ids) == 64
    offline = ensure_pretrained_offline_head(toy_preset, "code")
    assert cache.read_json(offline / "recipe.json")["base_head"] == recipe["hash"]
    assert load_head(offline, target).lm_head.weight.shape == head.lm_head.weight.shape
    changed = replace(toy_preset, head=replace(toy_preset.head, ttt_steps=1))
    assert ensure_pretrained_head(changed) != path                          # another recipe: another build

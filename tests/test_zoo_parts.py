"""Zoo building blocks without training a zoo: presets, FLOPs, data order, schedule, cache."""

import math
import os

import pytest
import torch
from transformers import LlamaForCausalLM

from drift_cli.zoo import cache
from drift_cli.zoo.models import llama_config, new_model, parameter_count, per_token_flops
from drift_cli.zoo.presets import PRESETS, ModelShape, TrainRecipe
from drift_cli.zoo.tokenizer import budgeted, train_tokenizer
from drift_cli.zoo.training import DomainSampler, lr_at, next_token_loss, run_steps


def count_params(shape: ModelShape, vocab: int) -> int:
    with torch.device("meta"):
        return parameter_count(LlamaForCausalLM(llama_config(shape, vocab, 0, 1)))


@pytest.mark.parametrize("name", list(PRESETS))
def test_every_preset_is_a_valid_config_with_a_cheap_draft(name):
    p = PRESETS[name]
    assert count_params(p.target, p.vocab_size) > count_params(p.draft, p.vocab_size)
    assert per_token_flops(p.draft, p.vocab_size) <= per_token_flops(p.target, p.vocab_size) / 5


def test_small_meets_the_size_floor():
    p = PRESETS["small"]
    assert count_params(p.target, p.vocab_size) >= 4_000_000 and p.target.layers >= 4


def test_per_token_flops_by_hand():
    # hidden 8, 2 heads (head_dim 4), 1 kv head, ffn 16, 1 layer, vocab 10, ctx 3:
    # attn = 8*4*(2*2 + 2*1) = 192, mlp = 3*8*16 = 384, lm_head = 80 -> 2*656 = 1312; attention 4*3*8 = 96
    shape = ModelShape(hidden=8, layers=1, heads=2, kv_heads=1, ffn=16, context=3)
    assert per_token_flops(shape, 10) == 1312 + 96
    # the count matches the model's matmul weights exactly
    model_matmul = count_params(shape, 10) - 10 * 8 - 8 * 3        # minus embeddings and 3 norm vectors
    assert 2 * model_matmul == 1312


def test_sampler_is_a_pure_function_of_seed_and_step():
    by_domain = [torch.arange(40).view(10, 4), torch.arange(100, 108).view(2, 4)]
    a = DomainSampler(by_domain, batch=3, seed=7)
    b = DomainSampler(by_domain, batch=3, seed=7)
    late = b.batch_at(5)
    assert torch.equal(a.batch_at(0), b.batch_at(0)) and torch.equal(a.batch_at(5), late)
    assert not torch.equal(DomainSampler(by_domain, 3, seed=8).batch_at(0), a.batch_at(0))


def test_sampler_mix_alpha():
    by_domain = [torch.zeros(90, 2, dtype=torch.long), torch.ones(10, 2, dtype=torch.long)]
    natural = DomainSampler(by_domain, batch=1000, seed=0, alpha=1.0).batch_at(0)[:, 0].float().mean()
    uniform = DomainSampler(by_domain, batch=1000, seed=0, alpha=0.0).batch_at(0)[:, 0].float().mean()
    # share of domain 1: 0.1 and 0.5; binomial sd over 1000 draws is <= 0.016, bounds are 4 sd
    assert abs(natural.item() - 0.1) < 0.064 and abs(uniform.item() - 0.5) < 0.064


def test_lr_schedule_warms_up_then_decays_to_the_floor():
    assert lr_at(0, 100, 1.0, 10, 0.1) == pytest.approx(0.1)
    assert lr_at(9, 100, 1.0, 10, 0.1) == pytest.approx(1.0)
    assert lr_at(99, 100, 1.0, 10, 0.1) == pytest.approx(0.1)
    mid = 10 + (100 - 10 - 1) / 2
    assert lr_at(int(mid), 100, 1.0, 10, 0.1) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * int(mid - 10) / 89)))


def test_training_is_deterministic():
    shape = ModelShape(hidden=16, layers=1, heads=2, kv_heads=2, ffn=32, context=32)
    batches = DomainSampler([torch.randint(0, 50, (20, 9), generator=torch.Generator().manual_seed(0))], 4, 0)

    def train():
        model = new_model(llama_config(shape, 50, 0, 1), seed=3)
        curve = run_steps(model, lambda s: next_token_loss(model, batches.batch_at(s)), 4, 1e-2, 1, 0.1, 0.1,
                          "t", None)
        return curve, model.state_dict()

    (c1, s1), (c2, s2) = train(), train()
    assert c1 == c2 and all(torch.equal(s1[k], s2[k]) for k in s1)


def test_tokenizer_training_is_deterministic_and_byte_complete():
    import json.decoder
    import inspect

    texts = [inspect.getsource(json.decoder), "the quick brown fox jumps over the lazy dog " * 20]
    a, b = train_tokenizer(texts, 400), train_tokenizer(texts, 400)
    assert a.get_vocab() == b.get_vocab() and len(a) == 400
    assert a.convert_ids_to_tokens([0, 1]) == ["<|endoftext|>", "<|pad|>"]
    odd = "Zürich ☃ \x00"
    assert a.decode(a(odd)["input_ids"]) == odd


def test_budgeted_round_robin():
    groups = [["aaaa", "aaaa", "aaaa"], ["bb"]]
    assert list(budgeted(groups, 9)) == ["aaaa", "bb", "aaa"]


def test_atomic_directory_leaves_nothing_on_failure(tmp_path):
    final = tmp_path / "target"
    with pytest.raises(RuntimeError):
        with cache.atomic_directory(final) as tmp:
            (tmp / "half.bin").write_bytes(b"x")
            raise RuntimeError("interrupted")
    assert list(tmp_path.iterdir()) == []
    with cache.atomic_directory(final) as tmp:
        (tmp / "done.bin").write_bytes(b"y")
    assert [p.name for p in tmp_path.iterdir()] == ["target"] and (final / "done.bin").read_bytes() == b"y"


def test_recipe_hash_is_order_independent():
    assert cache.recipe_hash({"a": 1, "b": [1, 2]}) == cache.recipe_hash({"b": [1, 2], "a": 1})
    assert cache.recipe_hash({"a": 1}) != cache.recipe_hash({"a": 2})


def test_replay_greedy_by_hand():
    from drift_cli.zoo.shift import replay_greedy

    # gamma 4, 9 new tokens: [1 1 0 1] accepts 2 and the target corrects position 2; [1 1 1 1]
    # accepts 4 and the target adds a bonus at position 7; one token is left, which the target
    # emits itself (the engine's budget: never draft past it). Drafted 8, accepted 6.
    marks = torch.tensor([[1, 1, 0, 1, 1, 1, 1, 0, 0]], dtype=torch.bool)
    assert replay_greedy(marks, 4) == (6, 8)
    assert replay_greedy(torch.ones(2, 10, dtype=torch.bool), 4) == (2 * 8, 2 * 8)   # 4+4 drafted, 2 left for bonus


@pytest.mark.parametrize("gamma,new", [(4, 30), (3, 17), (1, 9)])
def test_replay_gives_the_engines_greedy_acceptance(gamma, new):
    """The replay's α equals run_stream(vanilla)'s on the same stream (no EOS)."""
    from drift_cli.engine.lm import CausalLM
    from drift_cli.engine.loop import DecodeConfig, run_stream
    from drift_cli.methods.vanilla import Vanilla
    from drift_cli.zoo.shift import greedy_acceptance
    from tests.models import tiny_pair
    from tests.recording import unit_stream

    import copy

    _, target = tiny_pair(scale=3.0)
    draft = copy.deepcopy(target)                 # the target with a noisy head: agrees ~20% of the time
    with torch.no_grad():
        w = draft.lm_head.weight
        w.add_(torch.randn(w.shape, generator=torch.Generator().manual_seed(0)) * w.std() * 0.5)
    prompts = [[1, 5, 2, 7], [3, 3, 9, 4], [8, 1, 6, 2]]
    run = run_stream(CausalLM(target, "target"), Vanilla(draft), unit_stream(prompts, new),
                     DecodeConfig(gamma=gamma, max_new_tokens=new))
    accepted, drafted = sum(s.accepted for s in run.steps), sum(s.drafted for s in run.steps)
    replay = greedy_acceptance(draft, target, torch.tensor(prompts), new, gamma)
    assert 0 < accepted < drafted
    assert replay["acceptance_rate"] == accepted / drafted


def test_stale_temporaries_of_dead_builds_are_removed(tmp_path):
    import subprocess

    proc = subprocess.Popen(["true"])           # a pid that has exited
    proc.wait()
    stale = tmp_path / f".target.tmp-{proc.pid}"
    stale.mkdir()
    alive = tmp_path / f".target.tmp-{os.getpid()}x"       # not a pid suffix: left alone
    alive.mkdir()
    with cache.atomic_directory(tmp_path / "target") as tmp:
        (tmp / "w").write_bytes(b"1")
    assert not stale.exists() and alive.exists() and (tmp_path / "target" / "w").exists()

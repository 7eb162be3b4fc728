"""A zoo on a pretrained target: the draft cut from the target, its vocabulary-subset head,
distillation on cached labels, and the exactness of a subset draft (greedy and sampled)."""

from __future__ import annotations

import pytest
import torch

from drift_cli.engine.head import OUTSIDE, VOCAB_SUBSET_KEY, OutputHead
from drift_cli.engine.lm import CausalLM
from drift_cli.engine.loop import DecodeConfig, generate
from drift_cli.engine.sampling import Sampler
from drift_cli.methods.vanilla import Vanilla
from drift_cli.zoo.presets import KDRecipe, LabelledData
from drift_cli.zoo.pretrained import (Labels, agreement, continuations, cut_draft, distill_on_labels,
                                      frequent_tokens, label_windows, rechoose_vocabulary)
from tests.exactness import SIGNIFICANCE, sampling_p_value
from tests.models import tiny_llama


def _target(vocab: int = 64, seed: int = 0, scale: float = 4.0):
    t = tiny_llama(vocab, 48, 3, seed, scale)
    t.config.tie_word_embeddings = False
    return t


def _logits(model, ids):
    with torch.inference_mode():
        return model(input_ids=ids).logits


def test_a_draft_with_every_layer_and_the_full_vocabulary_is_the_target():
    target = _target()
    ids = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(0))
    # the cut's head starts from the input embeddings: give the target a tied head to compare
    with torch.no_grad():
        target.lm_head.weight.copy_(target.get_input_embeddings().weight)
    draft = cut_draft(target, 3, None)
    assert torch.equal(_logits(draft, ids), _logits(target, ids))
    assert draft.config.num_hidden_layers == 3 and not draft.config.tie_word_embeddings


def test_subset_head_scores_only_its_tokens():
    target = _target()
    subset = [0, 3, 5, 7, 11, 40, 63]
    draft = cut_draft(target, 1, subset)
    lm = CausalLM(draft, "draft")
    lm.reset()
    _, logits = lm.forward(torch.tensor([[1, 2, 3]]))
    outside = torch.ones(64, dtype=torch.bool)
    outside[subset] = False
    assert bool((logits[..., outside] == OUTSIDE).all())
    assert bool((torch.softmax(logits, -1)[..., outside] == 0).all())        # q is exactly 0 outside
    full = draft.lm_head(lm.decoder(input_ids=torch.tensor([[1, 2, 3]])).last_hidden_state)
    assert torch.allclose(logits[..., subset], full[..., subset], atol=1e-6)


def test_subset_rows_are_regathered_after_an_in_place_update():
    draft = cut_draft(_target(), 1, [1, 2, 3])
    head = OutputHead(draft)
    h = torch.randn(1, draft.config.hidden_size)
    with torch.inference_mode():
        before = head(h)
    with torch.no_grad():
        draft.lm_head.weight[2].add_(1.0)            # what an optimiser step does (OSD)
    with torch.inference_mode():
        after = head(h)
    assert after[0, 2] != before[0, 2] and after[0, 1] == before[0, 1]


def test_greedy_with_a_subset_draft_equals_ar():
    target = _target(scale=6.0)
    draft = cut_draft(target, 1, frequent_tokens(
        label_windows(target, torch.randint(0, 64, (4, 16), generator=torch.Generator().manual_seed(1)), 4, 2),
        24, 64))
    t = CausalLM(target, "target")
    for prompt in ([1, 2, 3, 4], [9, 8, 7]):
        cfg = DecodeConfig(gamma=3, max_new_tokens=24, temperature=0.0, top_p=None, eos_id=None, seed=0)
        spec = generate(t, Vanilla(draft), prompt, cfg, Sampler()).output_ids
        t.reset()
        ar = []
        ids = torch.tensor([prompt])
        with torch.inference_mode():
            for _ in range(24):
                nxt = int(target(input_ids=ids).logits[0, -1].argmax())
                ar.append(nxt)
                ids = torch.cat([ids, torch.tensor([[nxt]])], 1)
        assert spec == ar


@pytest.mark.stats
def test_sampling_with_a_subset_draft_is_exact():
    """chi-square on the first two tokens (vocabulary 8) with a draft that can propose 4 of them."""
    target = tiny_llama(8, 48, 2, 11)
    target.config.tie_word_embeddings = False
    draft = cut_draft(target, 1, [0, 2, 5, 7])
    assert sampling_p_value(target, lambda: Vanilla(draft), [1, 5, 2]) > SIGNIFICANCE


def test_continuation_labels_are_the_targets_own_distributions():
    target = _target()
    prefixes = torch.tensor([[1, 2, 3], [4, 5, 6]])
    labels = continuations(target, prefixes, 5, 4, eos=None)
    assert labels.ids.shape == (2, 8) and bool(labels.mask.all())
    logits = _logits(target, labels.ids)
    assert torch.equal(labels.ids[:, 3:], logits[:, 2:-1].argmax(-1))           # greedy continuations
    want_v, want_i = torch.log_softmax(logits, -1).topk(4, -1)
    assert torch.equal(labels.top_ids, want_i)
    assert torch.allclose(labels.top_logp, want_v, atol=1e-4)


def test_positions_after_eos_are_masked():
    target = _target()
    prefixes = torch.tensor([[1, 2, 3]])
    first = int(_logits(target, prefixes)[0, -1].argmax())
    labels = continuations(target, prefixes, 4, 2, eos=first)                  # the first new token is EOS
    assert labels.mask.tolist() == [[True, True, True, True, False, False, False]]


def test_distillation_on_labels_raises_agreement():
    target = _target(scale=6.0)
    g = torch.Generator().manual_seed(3)
    labels = Labels.cat([label_windows(target, torch.randint(0, 64, (8, 16), generator=g), 8, 4),
                         continuations(target, torch.randint(0, 64, (8, 4), generator=g), 12, 8, None)])
    draft = cut_draft(target, 1, None)
    before = agreement(draft, labels)
    recipe = KDRecipe(LabelledData(0, 0, 16, 4, 4, 8), epochs=30, batch=8, lr=3e-3, warmup=2)
    curve = distill_on_labels(draft, labels, recipe, "fkl", None, "test")
    assert curve[-1][1] < curve[0][1]
    assert agreement(draft, labels) > before + 0.1
    assert not any(w.requires_grad for w in draft.parameters())
    assert getattr(draft.config, VOCAB_SUBSET_KEY, None) is None


def test_an_offline_draft_rechooses_its_vocabulary_from_its_domain():
    target = _target(scale=6.0)
    g = torch.Generator().manual_seed(5)
    draft = cut_draft(target, 1, list(range(16)))                              # the "general" subset: 0..15
    domain = torch.randint(40, 64, (8, 16), generator=g)                        # a domain of other tokens
    labels = label_windows(target, domain, 8, 4)
    before = agreement(draft, labels)
    rechoose_vocabulary(draft, labels)
    new = getattr(draft.config, VOCAB_SUBSET_KEY)
    assert len(new) == 16
    assert set(frequent_tokens(labels, 8, 64)) <= set(new)                     # the domain's frequent tokens
    assert set(range(40, 64)) & set(new)
    logits = OutputHead(draft)(torch.randn(3, 48))
    assert bool((logits[:, [t for t in range(64) if t not in new]] == OUTSIDE).all())
    recipe = KDRecipe(LabelledData(0, 0, 16, 4, 4, 8), epochs=30, batch=8, lr=3e-3, warmup=2)
    distill_on_labels(draft, labels, recipe, "fkl", None, "test")
    assert agreement(draft, labels) > before + 0.1


def test_frequent_tokens_break_ties_towards_the_previous_subset():
    labels = Labels(torch.tensor([[1, 2, 3, 4]]), torch.tensor([[[1], [2], [3], [4]]]), torch.zeros(1, 4, 1),
                    torch.ones(1, 4, dtype=torch.bool))
    assert frequent_tokens(labels, 2, 8) == [1, 2]                             # equal counts: lower ids
    assert frequent_tokens(labels, 2, 8, prefer=[3, 4]) == [3, 4]
    assert frequent_tokens(labels, 6, 8, prefer=[7]) == [0, 1, 2, 3, 4, 7]    # unseen: preferred, then lower

"""A head built from its target: initialised from the target's weights, trained on its labels and features.

Initialisation (`init_eagle3`): the midlayer starts as one of the target's layers where shapes
allow: its norms (input_layernorm and hidden_norm both from the layer's input norm), o_proj, mlp
and post-attention norm are copied, and each of q/k/v, which read cat(embeddings, state) of
width 2d, starts as the layer's projection on either half, halved; fc starts as the mean of the
aux states; the final norm is the target's and the lm_head rows are the target's output rows of
the draft vocabulary (draft id i scores target id vocab[i]).

Training (`train_on_labels`): soft cross-entropy (or another divergence) against the target's
top-k at every labelled position, renormalised over the draft vocabulary, as the layer draft's
distillation does (EAGLE-3 drops EAGLE-1's feature-regression loss). `ttt_steps` > 1 unrolls the
head on its own carried states (`EagleHead.unroll`: EAGLE-3's training-time test, HASS) and
averages the steps' losses. The labels are any object with `ids` [N, L], `top_ids` / `top_logp`
[N, L, k], `mask` [N, L] and `features` [N, L, F] (`drift_cli.zoo.pretrained.Labels`): pair i
(state at i, token i+1) is scored against the target's distribution at position i+1.
"""

from __future__ import annotations

import math

import torch

from drift_cli.divergence import divergence
from drift_cli.eagle.modules import Eagle3Head, EagleHead, TargetParts
from drift_cli.engine.head import VOCAB_SUBSET_KEY


def default_aux_layers(layers: int) -> tuple[int, ...]:
    """EAGLE-3's default target layers (2, L // 2, L - 3), clamped into a small target's 0..L-1."""
    return tuple(min(max(k, 0), layers - 1) for k in (2, layers // 2, layers - 3))


def init_eagle3(target: torch.nn.Module, vocab_ids: list[int] | None, aux: tuple[int, ...],
                init_layer: int = -1) -> Eagle3Head:
    """An EAGLE-3 head for `target` over the draft vocabulary `vocab_ids` (None: all of it),
    reading the target's states at `aux`, its midlayer from target layer `init_layer`."""
    from transformers import LlamaConfig

    tc = target.config
    decoder = target.get_decoder()
    vocab = target.get_output_embeddings().weight.shape[0]
    d = tc.hidden_size
    config = LlamaConfig(hidden_size=d, intermediate_size=tc.intermediate_size, num_hidden_layers=1,
                         num_attention_heads=tc.num_attention_heads, num_key_value_heads=tc.num_key_value_heads,
                         head_dim=getattr(tc, "head_dim", None) or d // tc.num_attention_heads,
                         rms_norm_eps=tc.rms_norm_eps, rope_parameters=dict(tc.rope_parameters),
                         max_position_embeddings=tc.max_position_embeddings, vocab_size=vocab,
                         hidden_act=tc.hidden_act, attention_bias=bool(getattr(tc, "attention_bias", False)))
    setattr(config, VOCAB_SUBSET_KEY, list(vocab_ids) if vocab_ids is not None else None)
    ids = torch.tensor(vocab_ids if vocab_ids is not None else range(vocab), dtype=torch.long)
    ref = target.get_output_embeddings().weight
    head = Eagle3Head(config, aux, TargetParts(target.get_input_embeddings(), target.get_output_embeddings()), d,
                      ids.numel()).to(device=ref.device, dtype=ref.dtype)
    layer = decoder.layers[init_layer]
    m = head.midlayer
    with torch.no_grad():
        for norm in (m.input_layernorm, m.hidden_norm):
            norm.weight.copy_(layer.input_layernorm.weight)
        m.post_attention_layernorm.weight.copy_(layer.post_attention_layernorm.weight)
        for name in ("q_proj", "k_proj", "v_proj"):
            src, dst = getattr(layer.self_attn, name), getattr(m.self_attn, name)
            dst.weight.copy_(torch.cat([src.weight, src.weight], dim=1) / 2)
            if dst.bias is not None and src.bias is not None:
                dst.bias.copy_(src.bias)
        m.self_attn.o_proj.load_state_dict(layer.self_attn.o_proj.state_dict())
        m.mlp.load_state_dict(layer.mlp.state_dict())
        head.norm.weight.copy_(decoder.norm.weight)
        head.lm_head.weight.copy_(ref.detach()[ids.to(ref.device)])
        eye = torch.eye(d, dtype=ref.dtype, device=ref.device)
        head.fc.weight.copy_(torch.cat([eye] * len(aux), dim=1) / len(aux))
        head.d2t.copy_(ids - torch.arange(ids.numel()))
        head.t2d.zero_()
        head.t2d[ids] = True
    head.requires_grad_(False)
    return head.eval()


def rechoose_vocabulary(head: Eagle3Head, vocab_ids: list[int]) -> None:
    """Replace the head's draft vocabulary by `vocab_ids` (the same size), in place: the rows of
    tokens it keeps move with them, a new token's row starts as the target's output row."""
    old = {t: i for i, t in enumerate(getattr(head.config, VOCAB_SUBSET_KEY))}
    if len(vocab_ids) != len(old):
        raise ValueError(f"a vocabulary of {len(vocab_ids)} tokens for a head of {len(old)}")
    target_rows = head._target.lm_head.weight
    with torch.no_grad():
        rows = torch.stack([head.lm_head.weight[old[t]] if t in old else target_rows[t].to(head.lm_head.weight.dtype)
                            for t in vocab_ids])
        head.lm_head.weight.copy_(rows)
        ids = torch.tensor(vocab_ids, dtype=torch.long, device=head.d2t.device)
        head.d2t.copy_(ids - torch.arange(ids.numel(), device=ids.device))
        head.t2d.zero_()
        head.t2d[ids] = True
    setattr(head.config, VOCAB_SUBSET_KEY, list(vocab_ids))


def _subset_index(vocab: int, ids: torch.Tensor) -> torch.Tensor:
    """target id -> its row in the head's output matrix, or -1."""
    index = torch.full((vocab,), -1, dtype=torch.long)
    index[ids] = torch.arange(ids.numel())
    return index


def _rows(head: EagleHead) -> tuple[torch.Tensor, torch.Tensor]:
    """(the output matrix [K, d] the head scores with, the target ids of its rows [K])."""
    weight = head.get_output_embeddings().weight
    ids = getattr(head.config, VOCAB_SUBSET_KEY, None)
    return weight, torch.tensor(ids if ids is not None else range(weight.shape[0]), dtype=torch.long)


def _target_logp(top_i: torch.Tensor, top_v: torch.Tensor, index: torch.Tensor, k: int) -> torch.Tensor:
    """The target's top-k log-probabilities [M, k] as log-probabilities over the draft rows [M, K]
    (renormalised over the draft vocabulary; -inf outside the top-k)."""
    pos = index[top_i]
    logp = torch.full((pos.shape[0], k), float("-inf"))
    keep = pos >= 0
    logp[torch.nonzero(keep, as_tuple=True)[0], pos[keep]] = top_v[keep].float()
    return logp - torch.logsumexp(logp, -1, keepdim=True)


def train_on_labels(head: EagleHead, labels, epochs: int, batch: int, lr: float, warmup: int, ttt_steps: int = 1,
                    kind: str = "fkl", seed: int = 0, progress=None, label: str = "head") -> list[list[float]]:
    """Train the head's trainable parameters in place on cached labels; returns the loss curve."""
    from drift_cli.zoo.training import run_steps

    weight, ids = _rows(head)
    index = _subset_index(head.config.vocab_size, ids)
    params = head.trainable_parameters()
    head.requires_grad_(False)
    for p in params:
        p.requires_grad_(True)
    holder = torch.nn.Module()
    for i, p in enumerate(params):
        holder.register_parameter(f"w{i}", p)
    n = labels.ids.shape[0]
    steps = math.ceil(epochs * n / batch)                 # batches over the epochs back to back
    rng = torch.Generator().manual_seed(seed)
    order = torch.cat([torch.randperm(n, generator=rng) for _ in range(epochs)])
    device, dtype = weight.device, weight.dtype

    def loss_at(step: int) -> torch.Tensor:
        rows = order[step * batch:(step + 1) * batch]
        x, m = labels.ids[rows].to(device), labels.mask[rows]
        feats = labels.features[rows][:, :-1].to(device=device, dtype=dtype)
        hiddens = head.unroll(x, feats, ttt_steps)                                   # each [B, L-1, d]
        positions = torch.arange(x.shape[1] - 1)
        losses = []
        for s, hidden in enumerate(hiddens):
            valid = m[:, 1:] & (positions >= s)[None]                                # pair i scores position i + 1
            top_i, top_v = labels.top_ids[rows][:, 1:][valid], labels.top_logp[rows][:, 1:][valid]
            logp = _target_logp(top_i, top_v, index, ids.numel()).to(device)
            has_mass = torch.isfinite(logp).any(-1)
            logits = hidden[valid.to(device)] @ head.get_output_embeddings().weight.T   # [M, K]
            losses.append(divergence(kind, logp[has_mass], logits[has_mass].float()))
        return torch.stack(losses).mean()

    head.train()
    curve = run_steps(holder, loss_at, steps, lr, warmup, 0.0, 0.1, label, progress)
    head.eval()
    head.requires_grad_(False)
    return curve


@torch.inference_mode()
def agreement(head: EagleHead, labels, batch: int = 16) -> float:
    """Share of labelled positions where the head's argmax on the target's own states (teacher
    forced) is the target's top token (a build check)."""
    weight, ids = _rows(head)
    hits = total = 0
    for s in range(0, labels.ids.shape[0], batch):
        x, m = labels.ids[s:s + batch].to(weight.device), labels.mask[s:s + batch][:, 1:]
        feats = labels.features[s:s + batch][:, :-1].to(device=weight.device, dtype=weight.dtype)
        pick = ids[(head.teacher_forced(x, feats) @ weight.T).argmax(-1).cpu()]
        hits += int((pick == labels.top_ids[s:s + batch, 1:, 0])[m].sum())
        total += int(m.sum())
    return hits / max(1, total)

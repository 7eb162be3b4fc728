"""`osd`: online speculative decoding — the draft distilled online from verification feedback.

A private copy of the draft is trained while the stream runs (Liu et al., OSD). At every
verification step the positions where the draft was wrong (or all drafted positions) enter a
bounded FIFO buffer with their context and the target's distribution from the verification pass.
Every U verification steps a few AdamW steps run on batches sampled from the buffer, then the
draft's KV cache is rebuilt for the current context (one re-prefill: the cached keys/values were
computed with the old weights). All of it runs in `observe`, so the engine times it as the
iteration's adaptation: the update iterations are the latency spikes in `p99_step_ms`.
The shared draft is never touched; `begin_stream` restores the copy to it.

On an EAGLE head only the head trains (`EagleHead.trainable_parameters`: not its embeddings, not
the target's parts it borrows); the target is frozen and its states are inputs. A buffered
position keeps the target's states over its context (views of the drafter's per-row history,
verification's for drafted positions past it), and the trainer runs the head on them teacher
forced (docs/eagle.md).
"""

from __future__ import annotations

import copy
from typing import Any

import torch

from drift_cli.eagle import is_head
from drift_cli.engine.head import compact_head, vocab_subset
from drift_cli.errors import BadInput
from drift_cli.methods.base import Feedback, MethodContext, ModelDraftPolicy, Rows, as_rows
from drift_cli.osd.buffer import ReplayBuffer, entries_from_feedback, target_temperature
from drift_cli.osd.config import OSDConfig
from drift_cli.osd.trainer import DraftTrainer, UpdateStats, now_ms

_D = OSDConfig()


class OnlineDistillation(ModelDraftPolicy):
    name = "osd"
    description = "online speculative decoding: AdamW distillation of the draft from a replay buffer of verification feedback"

    def __init__(self, draft: torch.nn.Module, cfg: OSDConfig = OSDConfig(), seed: int = 0) -> None:
        self.shared = draft                                   # read only: the reset point of every stream
        cfg = cfg.validate()
        student = copy.deepcopy(draft)                        # a head's copy shares the target's parts
        student.requires_grad_(cfg.train == "all")
        if is_head(draft):                                    # the head is one layer: "last" and "head" are all of it
            student.requires_grad_(False)
            for w in student.trainable_parameters():
                w.requires_grad_(True)
        elif cfg.train != "all":
            compact_head(student)                             # a subset head trains K rows, not V
            decoder = student.get_decoder()
            parts = (decoder.layers[-1], decoder.norm) if cfg.train == "last" else ()
            for part in (*parts, student.get_output_embeddings()):
                part.requires_grad_(True)
        super().__init__(student)
        self.student, self.cfg, self.seed = student, cfg, seed
        # a draft model whose output head alone trains: its KV cache never goes stale, and a
        # buffered position keeps the head's input (an EAGLE head is one layer: it always re-fills)
        self.head_only = cfg.train == "head" and not is_head(draft)
        subset = vocab_subset(draft)
        self._subset = None if subset is None else torch.tensor(subset, device=self.lm.device)
        self.device = self.lm.device
        self._fresh_state()

    @classmethod
    def build(cls, ctx: MethodContext) -> "OnlineDistillation":
        if ctx.draft is None:
            raise BadInput("method osd needs a draft model")
        return cls(ctx.draft, ctx.config(OSDConfig), seed=ctx.seed)

    def _fresh_state(self) -> None:
        self.buffer = ReplayBuffer(self.cfg.buffer)
        self.trainer = DraftTrainer(self.student, self.cfg)
        self.generator = torch.Generator().manual_seed(self.seed)
        self.stats = UpdateStats()
        self.verifications = 0                                 # verification steps observed in this stream
        self._committed: Rows | None = None

    # -- stream / prompt -----------------------------------------------------------------------

    def begin_stream(self) -> None:
        """Every stream starts from the shared draft: restore the copy, empty buffer and optimizer."""
        with torch.no_grad():
            shared = dict(self.shared.named_parameters())
            for name, mine in self.student.named_parameters():
                theirs = shared[name]
                mine.copy_(theirs if theirs.shape == mine.shape else theirs[self._subset])   # a compact head
        self._fresh_state()

    def commit(self, context: Rows) -> None:
        super().commit(context)
        self._committed = as_rows(context)                     # the rows, for the re-prefill after an update

    # -- adaptation ----------------------------------------------------------------------------

    def observe(self, feedback: Feedback) -> None:
        if self.cfg.frozen:
            return                                             # nothing would ever read the buffer
        self.buffer.extend(entries_from_feedback(feedback, self.cfg.topk, self.cfg.all_positions,
                                                 self._context_features(feedback) if self.target_layers else None,
                                                 keep_hidden=self.head_only))
        # Counted here rather than read from feedback.step: equal under run_stream, and still
        # stream-global when a caller drives `generate` prompt by prompt (step restarts at 0).
        self.verifications += 1
        if self.cfg.due(self.verifications - 1) and len(self.buffer):
            self._update(target_temperature(feedback))

    def _context_features(self, feedback: Feedback):
        """(row b, drafted slot j) -> the target's states over that buffered context (a head's)."""
        ctx, scored = feedback.context, feedback.target_features

        def features(b: int, j: int) -> torch.Tensor:
            return self.lm.context_features(ctx.slots[b], len(ctx.ids[b]) - 1, scored[b, :j])
        return features

    def _update(self, temperature: float) -> None:
        t0 = now_ms(self.device)
        loss, norm, grad_bytes = self.trainer.update(self.buffer, temperature, self.generator)
        t1 = t2 = now_ms(self.device)
        if not self.head_only:                                 # the head alone leaves every cached key/value valid
            self._rebuild_cache()
            t2 = now_ms(self.device)
        s = self.stats
        s.updates += 1
        s.train_ms.append(t1 - t0)
        s.rebuild_ms.append(t2 - t1)
        s.loss.append(loss)
        s.grad_norm.append(norm)
        s.gradient_bytes = max(s.gradient_bytes, grad_bytes)

    def _rebuild_cache(self) -> None:
        """Re-prefill the draft cache with the committed sequence minus its last token (the
        `ModelDraftPolicy` cache invariant) under the new weights, every row (a weight change,
        not a rollback: rollbacks never re-prefill)."""
        if self._committed is None:
            return
        for slot, ids in zip(self._committed.slots, self._committed.ids, strict=True):
            self.lm.refill_row(slot, ids)

    # -- figures -------------------------------------------------------------------------------

    def report(self) -> dict[str, Any]:
        s = self.stats
        update_ms = [a + b for a, b in zip(s.train_ms, s.rebuild_ms, strict=True)]
        params = sum(p.nbytes for p in self.student.parameters())
        optimizer = self.trainer.state_bytes()
        buffer = self.buffer.nbytes
        return {
            "config": self.cfg.to_json(),
            "updates": s.updates,
            "update_ms_total": sum(update_ms),
            "update_ms_mean": sum(update_ms) / len(update_ms) if update_ms else 0.0,
            "update_ms_max": max(update_ms, default=0.0),
            "train_ms_total": sum(s.train_ms),
            "rebuild_ms_total": sum(s.rebuild_ms),
            "loss_per_update": s.loss,
            "grad_norm_per_update": s.grad_norm,
            "buffer_entries": len(self.buffer),
            "buffer_added": self.buffer.added,
            "buffer_bytes": buffer,
            "draft_copy_bytes": params,
            "trained_parameters": sum(p.numel() for p in self.trainer.params),
            "optimizer_state_bytes": optimizer,
            "gradient_bytes": s.gradient_bytes,
            # Memory osd holds beyond vanilla: its own draft copy, AdamW moments, the buffer, and
            # the gradients while an update runs (peak, not resident between updates).
            "memory_bytes": params + optimizer + buffer + s.gradient_bytes,
        }

"""`osd`: online speculative decoding — the draft distilled online from verification feedback.

A private copy of the draft is trained while the stream runs (Liu et al., OSD). At every
verification step the positions where the draft was wrong (or all drafted positions) enter a
bounded FIFO buffer with their context and the target's distribution from the verification pass.
Every U verification steps a few AdamW steps run on batches sampled from the buffer, then the
draft's KV cache is rebuilt for the current context (one re-prefill: the cached keys/values were
computed with the old weights). All of it runs in `observe`, so the engine times it as the
iteration's adaptation: the update iterations are the latency spikes in `p99_step_ms`.
The shared draft is never touched; `begin_stream` restores the copy to it.

With `--osd-async` the updates run on a background worker (`drift_cli.osd.worker`) that trains
its own copy from the same buffer; `observe` only asks for an update, and `propose` swaps the
newest finished weights in before it drafts (then re-prefills the rows' caches unless the head
alone trains): one set of weights per proposal, the swap and the re-prefill on the decode path.
Either way every proposal records its staleness: verification steps since the newest feedback
its weights had seen.

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
from drift_cli.osd.worker import BackgroundTrainer

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
        self.close()
        self.buffer = ReplayBuffer(self.cfg.buffer)
        self.generator = torch.Generator().manual_seed(self.seed)
        self.stats = UpdateStats()
        self.verifications = 0                                 # verification steps observed in this stream
        self.weights_seen = 0                                  # ... whose feedback the drafting weights had seen
        self.version = 0                                       # the published version drafting now (async; 0: the stream's start)
        self._committed: Rows | None = None
        if self.cfg.background:                                # the worker trains its own copy (started on demand)
            self.worker: BackgroundTrainer | None = BackgroundTrainer(self.student, self.cfg, self.buffer, self.seed)
            self.trainer = self.worker.trainer
        else:
            self.worker = None
            self.trainer = DraftTrainer(self.student, self.cfg)

    def close(self) -> None:
        """Stop and join the background worker, if one runs (what it had not published is dropped)."""
        worker = getattr(self, "worker", None)
        if worker is not None:
            worker.stop()

    # -- stream / prompt -----------------------------------------------------------------------

    def begin_stream(self) -> None:
        """Every stream starts from the shared draft: restore the copy, empty buffer and optimizer."""
        with torch.no_grad():
            shared = dict(self.shared.named_parameters())
            for name, mine in self.student.named_parameters():
                theirs = shared[name]
                mine.copy_(theirs if theirs.shape == mine.shape else theirs[self._subset])   # a compact head
        self._fresh_state()

    def end_stream(self) -> None:
        self.close()

    def propose(self, context: Rows, gamma: int, sampler):
        """Swap in the newest finished weights (async), note the staleness, then draft: the whole
        proposal (tokens and q') comes from one set of weights."""
        context = as_rows(context)
        if self.worker is not None:
            self._swap(context)
        self.stats.staleness.append(self.verifications - self.weights_seen)
        return super().propose(context, gamma, sampler)

    def _swap(self, context: Rows) -> None:
        newest = self.worker.newest()
        if newest is None or newest.version == self.version:
            return
        t0 = now_ms(self.device)
        params = dict(self.student.named_parameters())
        with torch.no_grad():
            for name, value in newest.tensors.items():
                params[name].copy_(value)
        t1 = t2 = now_ms(self.device)
        if not self.head_only:                                 # the rows' caches hold keys/values of the old weights
            for slot, ids in zip(context.slots, context.ids, strict=True):
                self.lm.refill_row(slot, ids)
            t2 = now_ms(self.device)
        self.version, self.weights_seen = newest.version, newest.seen
        s = self.stats
        s.swaps += 1
        s.swap_ms.append(t1 - t0)
        s.rebuild_ms.append(t2 - t1)

    def commit(self, context: Rows) -> None:
        super().commit(context)
        self._committed = as_rows(context)                     # the rows, for the re-prefill after an update

    # -- adaptation ----------------------------------------------------------------------------

    def observe(self, feedback: Feedback) -> None:
        # Counted here rather than read from feedback.step: equal under run_stream, and still
        # stream-global when a caller drives `generate` prompt by prompt (step restarts at 0).
        self.verifications += 1
        if self.cfg.frozen:
            return                                             # nothing would ever read the buffer
        self.buffer.extend(entries_from_feedback(feedback, self.cfg.topk, self.cfg.all_positions,
                                                 self._context_features(feedback) if self.target_layers else None,
                                                 keep_hidden=self.head_only), seen=self.verifications)
        if self.cfg.due(self.verifications - 1) and len(self.buffer):
            if self.worker is not None:
                self.worker.request(target_temperature(feedback))   # never waits: the worker trains beside us
            else:
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
        self.weights_seen = self.verifications
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
        s, w = self.stats, self.worker
        if w is None:
            updates, train_ms, loss, norm, grad_bytes = s.updates, s.train_ms, s.loss, s.grad_norm, s.gradient_bytes
            update_ms = [a + b for a, b in zip(s.train_ms, s.rebuild_ms, strict=True)]
            decode_ms = sum(update_ms)                         # all of it inside `observe`
        else:                                                  # read after `end_stream` joined the worker
            ws = w.stats
            updates, train_ms, loss, norm, grad_bytes = ws.updates, ws.train_ms, ws.loss, ws.grad_norm, ws.gradient_bytes
            update_ms = list(ws.train_ms)                      # the worker's, off the decode path
            decode_ms = sum(s.swap_ms) + sum(s.rebuild_ms)     # the swaps and their re-prefills
        params = sum(p.nbytes for p in self.student.parameters())
        copies = params if w is None else params + sum(p.nbytes for p in w.model.parameters()) + w.published_bytes()
        optimizer = self.trainer.state_bytes()
        buffer = self.buffer.nbytes
        out = {
            "config": self.cfg.to_json(),
            "updates": updates,
            "update_ms_total": sum(update_ms),
            "update_ms_mean": sum(update_ms) / len(update_ms) if update_ms else 0.0,
            "update_ms_max": max(update_ms, default=0.0),
            "train_ms_total": sum(train_ms),
            "rebuild_ms_total": sum(s.rebuild_ms),
            # the update cost the decoder itself paid (sync: the AdamW steps and re-prefills;
            # async: the swaps and re-prefills)
            "decode_path_update_ms_total": decode_ms,
            "loss_per_update": loss,
            "grad_norm_per_update": norm,
            **staleness_summary(s.staleness),
            "buffer_entries": len(self.buffer),
            "buffer_added": self.buffer.added,
            "buffer_bytes": buffer,
            "draft_copy_bytes": copies,
            "trained_parameters": sum(p.numel() for p in self.trainer.params),
            "optimizer_state_bytes": optimizer,
            "gradient_bytes": grad_bytes,
            # Memory osd holds beyond vanilla: its draft copies (async: the decoder's, the worker's
            # and the newest published version), AdamW moments, the buffer, and the gradients while
            # an update runs (peak, not resident between updates).
            "memory_bytes": copies + optimizer + buffer + grad_bytes,
        }
        if w is not None:
            out.update({
                "swaps": s.swaps,
                "swap_ms_total": sum(s.swap_ms),
                "updates_requested": w.stats.requested,
                "updates_coalesced": w.stats.coalesced,
                "worker_seconds": w.stats.cpu_seconds,     # CPU seconds of the worker thread (time.thread_time)
                "worker_threads": w.stats.threads,
            })
        return out


def staleness_summary(staleness: list[int]) -> dict[str, Any]:
    """Per proposal: verification steps since the newest feedback its weights had seen ->
    the mean and a histogram {steps: proposals} (JSON keys, ascending)."""
    counts: dict[int, int] = {}
    for x in staleness:
        counts[x] = counts.get(x, 0) + 1
    return {"staleness_mean": sum(staleness) / len(staleness) if staleness else None,
            "staleness_histogram": {str(k): counts[k] for k in sorted(counts)}}

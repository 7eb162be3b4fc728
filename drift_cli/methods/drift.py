"""`drift`: the static draft plus the DRIFT bank (no gradients, no new parameters).

Draft step (`adjust`, timed as "adjust"): retrieve the k nearest prototypes of the draft's hidden
state and add λβ to the sampling-space logits; the retrieval is kept for the update.
After verification (`observe`, timed as "adapt"): update or allocate a prototype for every
drafted position in order, from the target's and the draft's unbiased distributions.
One bank per tenant (`begin_prompt(prompt, tenant)`); banks persist across the prompts of a
stream and are rebuilt by `begin_stream` (from `--bank-in` when given).

Batches: each row uses its tenant's bank. A draft step retrieves for all of a tenant's rows at
once; `observe` updates each tenant's bank once per iteration with its rows' drafted positions,
rows in slot order, each row's positions in order. Rows of other tenants never touch it.

`--key target-est` (drift_cli/drift/keymap.py): queries and keys are the draft state mapped by a
per-tenant ridge map to an estimate of the target's hidden state; a tenant's bank (dim d_target)
is created at the map's first fit and re-keyed from its draft-space shadow at every refit.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from drift_cli.drift.bank import DriftBank
from drift_cli.drift.config import DriftConfig, DriftFiles
from drift_cli.drift.keymap import DraftShadow, KeyMapSpec, RidgeKeyMap
from drift_cli.drift.snapshot import load_bank, save_bank
from drift_cli.engine.sampling import Sampler
from drift_cli.engine.tree import children
from drift_cli.errors import BadInput
from drift_cli.methods.base import Feedback, MethodContext, ModelDraftPolicy, Proposal, Rows, as_rows
import drift_kernels
from drift_kernels import Neighbours

DEFAULT_TENANT = "default"
TENANT_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")


def _no_neighbours(rows: int, k: int, device) -> Neighbours:
    return Neighbours(torch.full((rows, k), -1, dtype=torch.int64, device=device),
                      torch.full((rows, k), float("-inf"), device=device), torch.zeros(rows, k, device=device))


def check_bank_fits(cfg: DriftConfig, dim: int, vocab: int, device, key_bytes: int) -> None:
    """Refuse a bank that cannot be allocated (one tenant's), naming what it would need."""
    from drift_cli.machine import available_memory

    need, free = cfg.bank_bytes(dim, vocab, key_bytes), available_memory(device)
    if free is not None and need > free:
        raise BadInput(f"--bank-size {cfg.bank_size} needs {need / 2**30:.2f} GiB for one tenant's bank "
                       f"({cfg.bank_size} prototypes: keys of {dim}, support {cfg.support or vocab}), more than the "
                       f"{free / 2**30:.2f} GiB of {device.type} memory this process can allocate")


class DriftMethod(ModelDraftPolicy):
    name = "drift"
    description = "the static draft plus the DRIFT bank: gradient-free recalibration from verification feedback"

    def __init__(self, draft: torch.nn.Module, cfg: DriftConfig = DriftConfig(), *, fingerprint: str | None = None,
                 bank_in: Path | None = None, bank_out: Path | None = None,
                 books_factory: Callable[[int], Any] | None = None, backend: str = "auto",
                 key_map: KeyMapSpec = KeyMapSpec()) -> None:
        super().__init__(draft)
        self.cfg = cfg.validate(self.lm.vocab_size)
        self.target_keyed = self.cfg.key == "target-est"
        if self.target_keyed and (bank_in is not None or bank_out is not None):
            raise BadInput("--bank-in/--bank-out are not available with --key target-est (a snapshot "
                           "would need the ridge map and the draft-space shadow keys); use --key draft")
        self.fingerprint, self.bank_in, self.bank_out = fingerprint, bank_in, bank_out
        self.books_factory, self.backend = books_factory, backend
        head = self.lm.head.linear.weight                            # [V, d] (the output head's own layer)
        self.dim, self.device, self.key_dtype = head.shape[1], head.device, head.dtype
        check_bank_fits(self.cfg, self.dim, self.lm.vocab_size, self.device, self.key_dtype.itemsize)
        self.banks: dict[str, DriftBank] = {}
        self.bank: DriftBank | None = None
        self.tenant = DEFAULT_TENANT
        # --key target-est, per tenant: the ridge map (from the first feedback on) and the
        # draft-space shadow of the bank's keys (from the first fit on, with the bank)
        self.key_map = key_map
        self.keymaps: dict[str, RidgeKeyMap] = {}
        self.shadows: dict[str, DraftShadow] = {}
        self.slot_tenants: dict[int, str] = {}          # slot -> the tenant of its prompt
        self._groups: dict[str, list[int]] = {}          # the proposal's rows by tenant, in slot order
        self._pending: list[dict[str, Neighbours | None]] = []   # per draft step: tenant -> retrieval
        self._saved = False
        self._save_error: str | None = None
        if bank_in is not None and not bank_in.exists():
            raise BadInput(f"--bank-in {bank_in} does not exist")

    @classmethod
    def build(cls, ctx: MethodContext) -> "DriftMethod":
        if ctx.draft is None:
            raise BadInput("method drift needs a draft model")
        files = ctx.config(DriftFiles)
        return cls(ctx.draft, ctx.config(DriftConfig).validate(ctx.vocab_size), fingerprint=ctx.draft_fingerprint,
                   bank_in=files.bank_in, bank_out=files.bank_out)

    def warm_up(self, rows: int, gamma: int) -> None:
        """Compile the bank's GPU kernels at this run's shapes (rows drafting at once, up to γ
        positions each per update) before the stream is timed; nothing to do on the CPU."""
        if self.device.type == "cuda" and self.backend in ("auto", "triton"):
            drift_kernels.warm_up(self.device, self.dim, self.cfg.support, self.cfg.neighbors, self.key_dtype,
                                  bank_size=self.cfg.bank_size, vocab=self.lm.vocab_size, queries=rows,
                                  positions=max(1, rows * gamma), adaptive=self.cfg.adaptive_rate)

    # -- banks ---------------------------------------------------------------------------------

    def _new_bank(self, tenant: str, dim: int | None = None) -> DriftBank:
        books = self.books_factory(self.cfg.bank_size) if self.books_factory else None
        with torch.inference_mode():
            return DriftBank(self.cfg, dim or self.dim, self.lm.vocab_size, self.device, self.key_dtype,
                             tenant=tenant, books=books, backend=self.backend)

    def begin_stream(self) -> None:
        self.banks, self.bank, self._saved, self._save_error = {}, None, False, None
        self.slot_tenants, self._groups = {}, {}
        self.keymaps, self.shadows = {}, {}
        if self.bank_in is not None:
            for tenant, path in snapshot_files(self.bank_in).items():
                self.banks[tenant] = load_bank(path, self.cfg, self.dim, self.lm.vocab_size, self.device,
                                               self.key_dtype, self.fingerprint, self.backend)

    def begin_prompt(self, prompt: torch.Tensor, tenant: str | None = None) -> None:
        super().begin_prompt(prompt, tenant)
        self.tenant = tenant = tenant or DEFAULT_TENANT
        self.slot_tenants[self.slot] = tenant
        if tenant not in self.banks and not self.target_keyed:    # target-est: created at the first fit
            self.banks[tenant] = self._new_bank(tenant)
        self.bank = self.banks.get(tenant)

    # -- draft step ----------------------------------------------------------------------------

    def propose(self, context: Rows, gamma: int, sampler: Sampler) -> Proposal:
        self._begin_proposal(context)
        return super().propose(context, gamma, sampler)

    def propose_tree(self, context: Rows, gamma: int, sampler: Sampler):
        if self.drafts_trees and self.target_keyed:
            raise BadInput("--key target-est does not draft trees yet: use --key draft with --tree-nodes")
        self._begin_proposal(context)
        return super().propose_tree(context, gamma, sampler)

    def _begin_proposal(self, context: Rows) -> None:
        context = as_rows(context)
        self._groups = {}
        for i, slot in enumerate(context.slots):
            self._groups.setdefault(self.slot_tenants.get(slot, self.tenant), []).append(i)
        self._pending = []
        for tenant in self._groups:
            if (bank := self.banks.get(tenant)) is not None:
                bank.begin_draft()

    def adjust(self, hidden: torch.Tensor, logits: torch.Tensor, sampler: Sampler) -> torch.Tensor:
        """hidden [B, d], sampling-space logits [B, V] -> logits + λβ, each row from its tenant's
        bank (unchanged while that bank is empty)."""
        step: dict[str, Neighbours | None] = {}
        self._pending.append(step)
        if len(self._groups) == 1:
            tenant = next(iter(self._groups))
            out, step[tenant] = self._tenant_step(tenant, hidden, logits)
            return out
        out = logits.clone()
        for tenant, rows in self._groups.items():
            ix = torch.tensor(rows, device=logits.device)
            out[ix], step[tenant] = self._tenant_step(tenant, hidden[ix], logits[ix])
        return out

    def adjust_nodes(self, hidden: torch.Tensor, logits: torch.Tensor, rows: list[int], sampler: Sampler) -> torch.Tensor:
        """A tree's frontier (node i of context row rows[i]): each node biased from its row's tenant's
        bank, one retrieval per tenant per depth."""
        tenant_of = {r: t for t, rs in self._groups.items() for r in rs}
        by_tenant: dict[str, list[int]] = {}
        for i, r in enumerate(rows):
            by_tenant.setdefault(tenant_of[r], []).append(i)
        if len(by_tenant) == 1:
            return self._tenant_step(next(iter(by_tenant)), hidden, logits)[0]
        out = logits.clone()
        for tenant, nodes in by_tenant.items():
            ix = torch.tensor(nodes, device=logits.device)
            out[ix] = self._tenant_step(tenant, hidden[ix], logits[ix])[0]
        return out

    def _tenant_step(self, tenant: str, hidden: torch.Tensor, logits: torch.Tensor):
        bank = self.banks.get(tenant)
        if bank is None:                                  # target-est before the map's first fit
            return logits, None
        return bank.draft_step(self.keymaps[tenant].map(hidden) if self.target_keyed else hidden, logits)

    # -- update --------------------------------------------------------------------------------

    def _key(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [Q, d_draft] -> what the bank is keyed on: itself, or [Q, d_target] for target-est."""
        return self.keymaps[self.tenant].map(hidden) if self.target_keyed else hidden

    def observe(self, feedback: Feedback) -> None:
        prop = feedback.proposal
        if prop.k == 0 or prop.hidden is None:
            return
        if feedback.tree is not None and self.drafts_trees:
            self._observe_tree(feedback)
            return
        for tenant, rows in self._groups.items():     # each bank once, its rows in slot order
            self.tenant, self.bank = tenant, self.banks.get(tenant)
            self._observe_tenant(feedback, rows)

    def _observe_tenant(self, feedback: Feedback, rows: list[int]) -> None:
        prop, bank = feedback.proposal, self.bank
        whole = len(rows) == prop.tokens.shape[0] and prop.num_draft is None   # every row, k drafts each
        if bank is not None and bank.native and not self.target_keyed and whole:
            # the Rust path reads the tensors in place: no tensor operation, so no inference-mode
            # guard either (entering one costs microseconds in this loop)
            bank.observe_drafted(prop.hidden, feedback.target_logits, prop.base_logits, prop.k,
                                 1.0 if feedback.sampler.greedy else feedback.sampler.temperature)
            return
        at = None if whole else _drafted_positions(prop, rows)
        if at is not None and len(at[2]) == 0:
            return
        with torch.inference_mode():
            if bank is not None:
                self._update_bank(feedback, rows, at)
            if self.target_keyed:      # after the bank update, which used the map of the draft step
                self._learn_key_map(feedback) if at is None else self._learn_key_map(feedback, at)

    def _observe_tree(self, feedback: Feedback) -> None:
        """The update after a tree, each tenant's bank once with its rows' states in slot order:
        `--tree-learn path`, the states along the accepted path (the chain view's positions: the
        root, the accepted nodes, the node where the rule stopped when it has children); `all`,
        every state the target scored that drew children (the root and every inner node). The
        neighbours are retrieved again: the bank has not changed since the draft step."""
        step, temp = feedback.tree, 1.0 if feedback.sampler.greedy else feedback.sampler.temperature
        tree = step.proposal
        for tenant, rows in self._groups.items():
            bank = self.banks.get(tenant)
            if bank is None:
                continue
            if self.tree.learn == "all":      # node i's state is its first child's parent state
                kids = [children(tree.parents[r]) for r in rows]
                picks = [(r, c[0], at) for r, ks in zip(rows, kids, strict=True)
                         for at, c in enumerate(ks) if c]          # (row, first child, scored index)
                row, node, scored = (list(x) for x in zip(*picks)) if picks else ([], [], [])
                logits, base, hidden = step.target_logits, tree.base_logits, tree.hidden
            else:
                lengths = feedback.proposal.lengths
                row = [r for r in rows for _ in range(lengths[r])]
                node = scored = [t for r in rows for t in range(lengths[r])]
                logits, base, hidden = feedback.target_logits, feedback.proposal.base_logits, feedback.proposal.hidden
            if not row:
                continue
            with torch.inference_mode():
                ix = torch.tensor(row, device=hidden.device)
                h = hidden[ix, torch.tensor(node, device=hidden.device)]
                logp = logits[ix, torch.tensor(scored, device=hidden.device)].float() / temp
                logq = base[ix, torch.tensor(node, device=hidden.device)].float() / temp
                bank.observe(h, bank.retrieve(h), logp, logq)

    def _update_bank(self, feedback: Feedback, rows: list[int], at) -> None:
        """The update through tensor operations (devices, the reference, target-est, ragged rows).
        at: None (every row of the batch, k positions each) or `_drafted_positions`."""
        prop = feedback.proposal
        k = prop.k
        b = prop.tokens.shape[0]
        temp = 1.0 if feedback.sampler.greedy else feedback.sampler.temperature
        v = prop.base_logits.shape[-1]
        # unnormalised log p, log q at temperature `temp`: the bank normalises only where it must
        if at is None:
            logp = feedback.target_logits[:, :k].float().reshape(b * k, v)
            logq = prop.base_logits.float().reshape(b * k, v)
            hidden = prop.hidden.reshape(b * k, -1)
            nb = self._neighbours(b, k)
        else:
            row, pos, flat = at
            logp = feedback.target_logits[row, pos].float()
            logq = prop.base_logits[row, pos].float()
            hidden = prop.hidden[row, pos]
            nb = _select(self._neighbours(len(rows), k), flat)
        if temp != 1.0:
            logp, logq = logp / temp, logq / temp
        if self.target_keyed:
            self._observe_target_keyed(hidden, nb, logp, logq)
        else:
            self.bank.observe(hidden, nb, logp, logq)

    def _observe_target_keyed(self, hidden: torch.Tensor, nb: Neighbours, logp: torch.Tensor,
                              logq: torch.Tensor) -> None:
        """The bank update on mapped states, mirrored on the draft-space shadow: the positions the
        update matched, at the rates it used, then the slots the books handed out for the rest."""
        done = self.bank.observe(self._key(hidden), nb, logp, logq)
        shadow = self.shadows[self.tenant]
        shadow.update(done.matched, done.rates, hidden)
        shadow.allocate(done.allocations, hidden)

    def _learn_key_map(self, feedback: Feedback, at=None) -> None:
        """Add this iteration's (draft, target) pairs; at a (re)fit create or re-key the tenant's bank.

        prop.hidden[:, i] (the draft state whose head drew x_{i+1}) and target_hidden[:, i] (the
        target state whose head scores x_{i+1}) sit at the same position: the pairs are i < k.
        """
        prop, target_hidden = feedback.proposal, feedback.target_hidden
        if target_hidden is None:
            return
        k, tenant = prop.k, self.tenant
        if at is None:
            x = prop.hidden.reshape(-1, prop.hidden.shape[-1])                 # [B·k, d_draft]
            y = target_hidden[:, :k].reshape(-1, target_hidden.shape[-1])      # [B·k, d_target]
        else:
            x, y = prop.hidden[at[0], at[1]], target_hidden[at[0], at[1]]
        keymap = self.keymaps.get(tenant)
        if keymap is None:
            spec = self.key_map
            keymap = self.keymaps[tenant] = RidgeKeyMap(x.shape[1], y.shape[1], spec.ridge, spec.refit_every,
                                                        spec.warmup, device=self.device)
        if not keymap.add(x, y):
            return
        if self.bank is None:
            self.bank = self.banks[tenant] = self._new_bank(tenant, keymap.d_out)
            self.shadows[tenant] = DraftShadow(self.cfg.bank_size, keymap.d_in, self.device)
        else:
            self.shadows[tenant].rekey(self.bank.keys, self.bank.valid, keymap)

    def _neighbours(self, b: int, k: int) -> Neighbours:
        """The current tenant's draft-step retrievals for its b rows' k drafted positions, as
        [b·k, neighbours] (batch-major)."""
        recorded = self.bank.drafted(b, k)
        if recorded is not None:
            return recorded
        kn, dev = self.cfg.neighbors, self.device
        steps = [step.get(self.tenant) for step in self._pending[:k]]
        steps = [nb if nb is not None else _no_neighbours(b, kn, dev) for nb in steps]
        if dev.type == "cpu":            # numpy stacking: cheaper than three torch calls
            stack = lambda name: torch.from_numpy(  # noqa: E731
                np.stack([getattr(nb, name).numpy() for nb in steps], 1).reshape(b * k, kn))
        else:
            stack = lambda name: torch.stack([getattr(nb, name) for nb in steps], 1).reshape(b * k, kn)  # noqa: E731
        return Neighbours(stack("idx"), stack("sim"), stack("weight"))

    # -- figures -------------------------------------------------------------------------------

    def end_stream(self) -> None:
        """Saves `--bank-out` once per stream. A failed save does not cost the run: it is reported
        (`bank_out_error`) and the command fails after writing run.json."""
        if self.bank_out is not None and not self._saved and self.banks:
            try:
                save_banks(self.banks, self.bank_out, self.fingerprint)
            except BadInput as e:
                self._save_error = str(e)
            self._saved = True

    def report(self) -> dict[str, Any]:
        """Bank figures for run.json."""
        tenants = {name: bank.stats() for name, bank in self.banks.items()}
        key_map_bytes = sum(m.memory_bytes() for m in self.keymaps.values()) + \
            sum(s.memory_bytes() for s in self.shadows.values())
        out = {
            "config": self.cfg.to_json(),
            "memory_bytes": sum(bank.memory_bytes() for bank in self.banks.values()) + key_map_bytes,
            "tenants": tenants,
            "prototypes": sum(bank.n_valid for bank in self.banks.values()),
            "updates": sum(bank.totals.updated for bank in self.banks.values()),
            "allocations": sum(bank.totals.allocated for bank in self.banks.values()),
            "evictions": sum(bank.totals.evicted for bank in self.banks.values()),
        }
        if self._save_error is not None:
            out["bank_out_error"] = self._save_error
        if self.target_keyed:   # the maps (XᵀX, XᵀY, W) and shadows [N, d_draft], included above
            out["key_map"] = {"memory_bytes": key_map_bytes,
                              "tenants": {name: m.stats() for name, m in self.keymaps.items()}}
        return out


def _drafted_positions(prop: Proposal, rows: list[int]):
    """The drafted positions of these rows, in order: (row index [P], position [P], flat [P]), where
    flat indexes the rows' [len(rows)·k] batch-major retrievals."""
    lengths = prop.lengths
    k = prop.k
    row = [r for r in rows for _ in range(lengths[r])]
    pos = [t for r in rows for t in range(lengths[r])]
    flat = [i * k + t for i, r in enumerate(rows) for t in range(lengths[r])]
    dev = prop.tokens.device
    return torch.tensor(row, dtype=torch.long, device=dev), torch.tensor(pos, dtype=torch.long, device=dev), flat


def _select(nb: Neighbours, flat: list[int]) -> Neighbours:
    """Rows `flat` of retrievals held as numpy arrays (the CPU bank's record) or tensors."""
    if isinstance(nb.idx, np.ndarray):
        ix = np.asarray(flat, dtype=np.int64)
        return Neighbours(nb.idx[ix], nb.sim[ix], nb.weight[ix])
    ix = torch.tensor(flat, dtype=torch.long, device=nb.idx.device)
    return Neighbours(nb.idx[ix], nb.sim[ix], nb.weight[ix])


def snapshot_files(path: Path) -> dict[str, Path]:
    """--bank-in: a file is the default tenant's bank; a directory holds `<tenant>.bank` files."""
    if path.is_dir():
        files = {p.name.removesuffix(".bank"): p for p in sorted(path.glob("*.bank"))}
        if not files:
            raise BadInput(f"--bank-in {path} is a directory without any <tenant>.bank snapshot")
        return files
    return {DEFAULT_TENANT: path}


def save_banks(banks: dict[str, DriftBank], path: Path, fingerprint: str | None) -> None:
    """--bank-out: one bank -> the file itself; several tenants -> a directory of `<tenant>.bank`."""
    if list(banks) == [DEFAULT_TENANT]:
        save_bank(banks[DEFAULT_TENANT], path, fingerprint)
        return
    for tenant, bank in banks.items():
        if not TENANT_NAME.match(tenant):
            raise BadInput(f"tenant id {tenant!r} cannot name a snapshot file (use letters, digits, _ . -)")
        save_bank(bank, path / f"{tenant}.bank", fingerprint)

"""The update of one GRPO step: ``num_iterations`` optimizer steps on a batch of judged rollouts.

Used by :mod:`codechat.train.grpo` (the stage and its metrics are documented there). Under DDP
every rank trains on its own rollouts; the token (or sequence) normaliser and the logged sums are
over all ranks, each rank's loss is scaled by the world size (DDP averages gradients), and a rank
with fewer micro-batches than the others runs empty ones (no counted token) so that every rank
synchronises gradients on the same, last micro-step.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from codechat.config.device import autocast_for
from .optim import set_lr
from .rl import policy_loss, sequence_logprobs
from .rollouts import RolloutBatch
from .trainer import Trainer, lr_at


def _rows(batch: RolloutBatch, keep: list[int], mask_truncated: bool, pad_id: int, empty: bool = False):
    """Padded training rows of rollouts ``keep``: inputs, targets (B, T) int64, mask (B, T) bool
    (1 on the sampled ids' predictions; all 0 when ``empty``) and the engine's log-probs aligned
    with it (B, T) float32."""
    rs = [batch.rollouts[i] for i in keep]
    T = max(len(r.prompt_ids) + len(r.completion_ids) - 1 for r in rs)
    inputs = torch.full((len(rs), T), pad_id, dtype=torch.long)
    targets = torch.zeros((len(rs), T), dtype=torch.long)
    mask = torch.zeros((len(rs), T), dtype=torch.bool)
    engine_lp = torch.zeros((len(rs), T), dtype=torch.float32)
    for i, r in enumerate(rs):
        ids = r.prompt_ids + r.completion_ids
        p, c = len(r.prompt_ids), len(r.completion_ids)
        inputs[i, :len(ids) - 1] = torch.tensor(ids[:-1])
        targets[i, :len(ids) - 1] = torch.tensor(ids[1:])
        if not empty and not (mask_truncated and r.finish == "length"):
            mask[i, p - 1:p - 1 + c] = True
        engine_lp[i, p - 1:p - 1 + c] = torch.tensor(r.engine_logprobs)
    return inputs, targets, mask, engine_lp


class GRPOStep:
    """The update of one step: ``num_iterations`` optimizer steps on a batch of judged rollouts."""

    def __init__(self, trainer: Trainer, cfg: Any, pad_id: int, ref: Callable[..., torch.Tensor] | None) -> None:
        """``cfg``: the stage's :class:`~codechat.train.rl_config.RLConfig`; ``ref``: the frozen reference's forward,
        ids (B, T) -> logits (B, T, V) (``beta > 0``: a copy of the initial policy, or the LoRA base)."""
        self.t, self.cfg, self.pad_id, self.ref = trainer, cfg, pad_id, ref

    def __call__(self, batch: RolloutBatch, adv: torch.Tensor) -> dict[str, float]:
        cfg, t, dev, par = self.cfg, self.t, self.t.device, self.t.par
        keep = [i for i in range(len(batch.rollouts)) if adv[i] != 0 or cfg.beta > 0]
        out = {"train_tokens": 0, "loss": 0.0, "clip_frac": 0.0, "ratio_mean": 1.0, "grad_norm": 0.0}
        mb = t.tcfg.micro_batch_size
        micro = [keep[i:i + mb] for i in range(0, len(keep), mb)]
        rows = [_rows(batch, m, cfg.mask_truncated, self.pad_id) for m in micro]
        n_tok = par.all_sum(sum(int(r[2].sum()) for r in rows))
        n_seq = par.all_sum(sum(int(r[2].any(1).sum()) for r in rows))
        if n_tok == 0:  # every group flat, or every kept rollout cut at the limit and masked: no update anywhere
            return out
        norm = float(n_tok if cfg.loss_norm == "token" else n_seq)
        out["train_tokens"] = int(par.all_sum(sum(int(r[0].numel()) for r in rows)))
        n_micro = int(par.all_max(len(micro)))
        while len(micro) < n_micro:  # take part in every gradient sync with empty micro-batches
            micro.append([0])
            rows.append(_rows(batch, [0], cfg.mask_truncated, self.pad_id, empty=True))
        self._old: list[torch.Tensor] = []
        self._refs: list[torch.Tensor | None] = []
        self._ent = self._mis = 0.0
        lr = lr_at(t.step, t.progress(), t.ocfg)
        for it in range(cfg.num_iterations):
            set_lr(t.optimizer, lr)
            sums = {"loss": 0.0, "clip": 0.0, "ratio": 0.0, "kl": 0.0, "tok": 0.0}
            for j, (m, row) in enumerate(zip(micro, rows)):
                with par.micro_step(last=j == n_micro - 1):
                    st = self._micro(it, j, row, adv[m].to(dev), norm)
                w = st["tokens"]
                sums["loss"] += st["loss"]
                sums["clip"] += st["clip_frac"] * w
                sums["ratio"] += st["ratio_mean"] * w
                sums["kl"] += st.get("kl", 0.0) * w
                sums["tok"] += w
            sums = {k: par.all_sum(v) for k, v in sums.items()}
            grad_norm = float(t.apply_update(sums["loss"]))
            t.check_finite()
        tok = max(sums["tok"], 1.0)
        ent, mis = par.all_sum(self._ent), par.all_sum(self._mis)
        out.update(loss=sums["loss"], clip_frac=sums["clip"] / tok, ratio_mean=sums["ratio"] / tok,
                   grad_norm=grad_norm, lr=lr, entropy=ent / n_tok, logprob_mismatch=mis / n_tok)
        if cfg.beta > 0:
            out["kl"] = sums["kl"] / tok
        return out

    def _micro(self, it: int, j: int, row: tuple, adv: torch.Tensor, norm: float) -> dict[str, float]:
        """Forward and backward of micro-batch ``j`` in update ``it``; its :func:`policy_loss` stats.
        The first update's forward is the old policy: its log-probs, entropy and the engine's
        mismatch are kept."""
        cfg, t, dev = self.cfg, self.t, self.t.device
        x, y, mask, elp = (v.to(dev) for v in row)
        with autocast_for(dev, t.tcfg.dtype):
            logits = t.forward(x)
        lp = sequence_logprobs(logits, y, mask, temperature=cfg.temperature)
        if it == 0:
            self._old.append(lp.detach())
            with torch.no_grad():
                z = logits.float() / cfg.temperature
                h = -(z.softmax(-1) * z.log_softmax(-1)).sum(-1)
                self._ent += float((h * mask).sum())
                self._mis += float(((lp.detach() - elp).abs() * mask).sum())
                ref = None
                if self.ref is not None:
                    with autocast_for(dev, t.tcfg.dtype):
                        ref = sequence_logprobs(self.ref(x), y, mask, temperature=cfg.temperature)
                self._refs.append(ref)
        del logits
        loss, st = policy_loss(lp, self._old[j], adv, mask, clip_eps=cfg.clip_eps, clip_eps_high=cfg.clip_eps_high,
                               loss_norm=cfg.loss_norm, ref_logprobs=self._refs[j], beta=cfg.beta, normalizer=norm)
        (loss * t.par.loss_scale).backward()  # DDP averages gradients over ranks; the loss is a sum
        return st


__all__ = ["GRPOStep"]

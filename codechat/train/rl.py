"""The math of GRPO: group-relative advantages and the clipped policy-gradient loss.

Pure tensor functions, importable without a model (no trainer, no config): the RL stage samples
a group of completions per prompt, scores them, and calls

- :func:`group_advantages`: each rollout's reward minus its group's mean, optionally over the
  group's sample standard deviation (GRPO, Shao et al. 2024, "DeepSeekMath", §4.1.2 outcome
  supervision); a group whose rewards are all equal gets advantages exactly 0, an unscorable
  rollout (reward ``None`` / NaN) gets 0 and is left out of its group's statistics;
- :func:`sequence_logprobs`: per-token log-probs of the sampled tokens from logits;
- :func:`policy_loss`: the PPO-clip surrogate on per-token importance ratios (GRPO eq. 3), with
  DAPO's asymmetric "clip-higher" (Yu et al. 2025, "DAPO", §3.1), an optional k3 KL penalty to a
  frozen reference (GRPO eq. 4; Schulman 2020, "Approximating KL divergence"), and either DAPO's
  token-level normalisation over the whole batch (§3.3) or GRPO's per-sequence mean.

Logged metrics (what each says about a run):

- ``frac_reward_zero_std`` (:class:`AdvantageStats`): fraction of groups that carry no signal
  (all scorable rewards equal, or fewer than two scorable). Near 1.0 the run is dead: every
  prompt is too easy or too hard for the policy; filter prompts by pass rate (DAPO's dynamic
  sampling, §3.2) or use a reward with partial credit.
- ``n_unscorable``: rollouts whose reward could not be computed (they get advantage 0).
- ``clip_frac_low`` / ``clip_frac_high`` (:func:`policy_loss`): fraction of counted tokens whose
  gradient the clip removed (ratio below ``1 - clip_eps`` with a negative advantage / above
  ``1 + clip_eps_high`` with a positive one). 0 on the first (on-policy) pass over a batch; a
  large value means the policy moves too far per step (lower the LR or the reuse of a batch).
- ``ratio_mean``: mean importance ratio over counted tokens (1.0 on-policy).
- ``kl``: mean k3 estimate of KL(policy || reference) per counted token (with ``ref_logprobs``).
- ``tokens``: counted (mask 1) completion tokens in the batch.
"""
from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import torch

#: ``scale`` values of :func:`group_advantages`.
ADVANTAGE_SCALES = ("std", "none")
#: ``loss_norm`` values of :func:`policy_loss`.
LOSS_NORMS = ("token", "sequence")
#: A group whose scorable rewards span at most this (max - min, in reward units) is flat: its
#: advantages are exactly 0. Rewards of the ladders in :mod:`codechat.eval.rewards` differ by
#: >= 0.05 between rungs, so this only catches float noise.
ZERO_STD_TOL = 1e-6


# ----------------------------------------------------------------------------- advantages
@dataclass(frozen=True)
class AdvantageStats:
    """What :func:`group_advantages` saw, for logging (module docstring).

    Attributes:
        n_rollouts: rewards given (scorable or not).
        n_unscorable: rewards that were ``None`` or NaN (advantage 0).
        n_groups: distinct group ids.
        n_groups_zero_std: groups with no signal: fewer than two scorable rewards, or all within
            ``zero_std_tol`` of each other (their advantages are all exactly 0).
        frac_reward_zero_std: ``n_groups_zero_std / n_groups``.
        reward_mean: mean of the scorable rewards (NaN when there is none).
        reward_std: population std of the scorable rewards over the batch (NaN when there is none).
    """

    n_rollouts: int
    n_unscorable: int
    n_groups: int
    n_groups_zero_std: int
    frac_reward_zero_std: float
    reward_mean: float
    reward_std: float

    def as_dict(self) -> dict[str, float]:
        return dict(self.__dict__)


def _as_float64_rewards(rewards: torch.Tensor | Sequence[float | None]) -> torch.Tensor:
    """Rewards as a float64 1-D tensor with NaN for unscorable (``None``) entries."""
    if isinstance(rewards, torch.Tensor):
        if rewards.dim() != 1:
            raise ValueError(f"rewards must be 1-D (one per rollout), got shape {tuple(rewards.shape)}")
        return rewards.detach().to(torch.float64)
    return torch.tensor([math.nan if r is None else float(r) for r in rewards], dtype=torch.float64)


def group_advantages(rewards: torch.Tensor | Sequence[float | None], group_ids: Sequence[Hashable] | torch.Tensor,
                     *, scale: str = "std", zero_std_tol: float = ZERO_STD_TOL
                     ) -> tuple[torch.Tensor, AdvantageStats]:
    """Group-relative advantages of rollouts: ``(advantages, stats)``.

    For the scorable rewards ``r_1..r_n`` of one group (the rollouts sharing a group id, i.e.
    sampled from one prompt)::

        A_i = r_i - mean(r)                      scale="none"
        A_i = (r_i - mean(r)) / std(r)           scale="std",  std with ddof=1 (sample std)

    ``scale="std"`` is GRPO's outcome-supervision advantage (Shao et al. 2024, DeepSeekMath
    §4.1.2; DAPO, Yu et al. 2025, eq. 9, keeps it); ``"none"`` drops the division (Liu et al.
    2025, "Understanding R1-Zero-Like Training" (Dr. GRPO): std scaling up-weights prompts whose
    groups barely disagree). Case 15's outlier group [0.35 x 7, 0.95] gives -0.353553 and
    2.474874 with ``"std"``, -0.075 and 0.525 with ``"none"``.

    Exact zeros: a group is *flat* when ``max(r) - min(r) <= zero_std_tol`` or it has fewer than
    two scorable rewards; every advantage in it is exactly 0.0 (set, not computed: the mean of
    seven float32 0.35 is not 0.35, and (r - mean) / std of that residue is O(1), case 15). No
    epsilon is added to the std: outside a flat group the range exceeds ``zero_std_tol``, so the
    sample std is at least ``zero_std_tol / sqrt(2 (n - 1))`` > 0 and the division is exact GRPO.
    Statistics are computed in float64.

    Args:
        rewards: (N,) one reward per rollout: a float tensor, or a list of floats and ``None``;
            ``None`` or NaN marks an unscorable rollout (the reward failed to compute), which is
            left out of its group's mean and std and gets advantage 0.
        group_ids: N hashable prompt ids (a tensor's elements are read with ``tolist()``). Groups
            are formed by id, never by position: rows may come in any order (e.g.
            generation-major ``[a, b, a, b, ...]``), and groups may differ in size.
        scale: ``"std"`` or ``"none"`` (see above).
        zero_std_tol: the flat-group tolerance on ``max - min`` in reward units (>= 0).

    Returns:
        ``(advantages, stats)``: advantages (N,) float32 on ``rewards``' device (CPU for a list),
        in the order of ``rewards``; :class:`AdvantageStats`.

    Raises:
        ValueError: no rollouts; ``rewards`` and ``group_ids`` of different lengths; an infinite
            reward (a bug in the reward, not an unscorable rollout); an unknown ``scale``; a
            negative ``zero_std_tol``.
    """
    if scale not in ADVANTAGE_SCALES:
        raise ValueError(f"scale must be one of {ADVANTAGE_SCALES}, got {scale!r}")
    if not zero_std_tol >= 0:
        raise ValueError(f"zero_std_tol must be >= 0, got {zero_std_tol}")
    device = rewards.device if isinstance(rewards, torch.Tensor) else torch.device("cpu")
    r = _as_float64_rewards(rewards).cpu()
    ids = group_ids.tolist() if isinstance(group_ids, torch.Tensor) else list(group_ids)
    n = r.numel()
    if n == 0:
        raise ValueError("group_advantages needs at least one rollout")
    if len(ids) != n:
        raise ValueError(f"{n} rewards but {len(ids)} group ids")
    if torch.isinf(r).any():
        bad = [i for i, v in enumerate(r.tolist()) if math.isinf(v)][:5]
        raise ValueError(f"infinite rewards at rows {bad}: a reward must be finite, or None/NaN when unscorable")

    index: dict[Hashable, int] = {}
    g = torch.tensor([index.setdefault(i, len(index)) for i in ids], dtype=torch.long)  # (N,) group of each row
    n_groups = len(index)
    ok = ~torch.isnan(r)  # (N,) scorable
    r0 = torch.where(ok, r, 0.0)
    zeros = torch.zeros(n_groups, dtype=torch.float64)
    count = zeros.index_add(0, g, ok.double())  # (G,) scorable members
    mean = zeros.index_add(0, g, r0) / count.clamp(min=1)
    dev = torch.where(ok, r0 - mean[g], 0.0)  # (N,)
    big = torch.finfo(torch.float64).max
    hi = torch.full((n_groups,), -big, dtype=torch.float64).scatter_reduce(0, g, torch.where(ok, r, -big), "amax")
    lo = torch.full((n_groups,), big, dtype=torch.float64).scatter_reduce(0, g, torch.where(ok, r, big), "amin")
    flat = (count < 2) | (hi - lo <= zero_std_tol)  # (G,) no signal
    if scale == "std":
        var = zeros.index_add(0, g, dev * dev) / (count - 1).clamp(min=1)  # sample variance, ddof=1
        std = torch.where(flat, 1.0, var.sqrt())
        adv = dev / std[g]
    else:
        adv = dev
    adv = torch.where(ok & ~flat[g], adv, 0.0)  # exact zeros: flat groups, unscorable rows

    scored = r[ok]
    stats = AdvantageStats(
        n_rollouts=n, n_unscorable=int((~ok).sum()), n_groups=n_groups, n_groups_zero_std=int(flat.sum()),
        frac_reward_zero_std=float(flat.double().mean()),
        reward_mean=float(scored.mean()) if scored.numel() else math.nan,
        reward_std=float(scored.std(correction=0)) if scored.numel() else math.nan)
    return adv.to(device=device, dtype=torch.float32), stats


# ----------------------------------------------------------------------------- log-probs
def sequence_logprobs(logits: torch.Tensor, tokens: torch.Tensor, mask: torch.Tensor | None = None, *,
                      temperature: float = 1.0) -> torch.Tensor:
    """Per-token log-probs of ``tokens`` under ``logits``: ``log softmax(logits / temperature)[token]``.

    Alignment is the caller's: ``logits[:, t]`` must be the distribution ``tokens[:, t]`` was
    drawn from (for a model's outputs on ``ids``, pass ``logits[:, :-1]`` and ``ids[:, 1:]``).
    Computed in float32 as ``logit[token] - logsumexp(logits)`` (no (B, T, V) log-softmax tensor
    is kept). Pass the sampling temperature, or the ratio against the sampler's log-probs is off.

    Args:
        logits: (B, T, V) float (upcast to float32).
        tokens: (B, T) int64 ids of the sampled tokens; any value where ``mask`` is 0 (padding,
            -100).
        mask: (B, T) bool or 0/1, 1 where the log-prob is wanted; None: everywhere.
        temperature: > 0, the temperature the tokens were sampled at.

    Returns:
        (B, T) float32 log-probs, 0.0 where ``mask`` is 0; differentiable w.r.t. ``logits``.

    Raises:
        ValueError: shapes that do not match, or ``temperature <= 0``.
    """
    if logits.dim() != 3 or tokens.shape != logits.shape[:2]:
        raise ValueError(f"logits must be (B, T, V) and tokens (B, T), got {tuple(logits.shape)} and "
                         f"{tuple(tokens.shape)}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    keep = torch.ones_like(tokens, dtype=torch.bool) if mask is None else _bool_mask(mask, tokens.shape)
    z = logits.float()
    if temperature != 1.0:
        z = z / temperature
    idx = torch.where(keep, tokens, 0).long().unsqueeze(-1)  # (B, T, 1), masked ids made safe to gather
    lp = z.gather(-1, idx).squeeze(-1) - torch.logsumexp(z, dim=-1)  # (B, T)
    return torch.where(keep, lp, 0.0)


def _bool_mask(mask: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """``mask`` as bool, checked to be (B, T) and 0/1."""
    if mask.shape != shape:
        raise ValueError(f"mask must have shape {tuple(shape)}, got {tuple(mask.shape)}")
    if mask.dtype == torch.bool:
        return mask
    if ((mask != 0) & (mask != 1)).any():
        raise ValueError("mask must be 0/1 (or bool): 1 for completion tokens that count")
    return mask != 0


# ----------------------------------------------------------------------------- loss
def policy_loss(logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                *, clip_eps: float = 0.2, clip_eps_high: float | None = None, loss_norm: str = "token",
                ref_logprobs: torch.Tensor | None = None, beta: float = 0.0, normalizer: float | None = None
                ) -> tuple[torch.Tensor, dict[str, float]]:
    """The GRPO / DAPO clipped surrogate loss (to minimise): ``(loss, stats)``.

    Per counted token ``t`` of sequence ``i`` (mask 1), with ``rho = exp(logprobs - old_logprobs)``
    and ``A_i`` the sequence's advantage::

        l_it = -min(rho A_i, clip(rho, 1 - clip_eps, 1 + clip_eps_high) A_i)      PPO-clip (GRPO eq. 3)
               + beta * (exp(ref - logprobs) - (ref - logprobs) - 1)             k3 KL (GRPO eq. 4)

    ``clip_eps_high > clip_eps`` is DAPO's clip-higher (Yu et al. 2025 §3.1: 0.2 / 0.28), which
    lets low-probability tokens grow and keeps entropy up. The k3 estimator is unbiased for
    KL(pi || pi_ref) on tokens sampled from pi and always >= 0 (Schulman 2020). Where the clip
    is active the token's gradient is exactly zero. On the first pass over fresh samples pass
    ``old_logprobs = logprobs.detach()``: rho = 1, nothing clips, and the gradient is the plain
    policy gradient ``-A_i grad log pi``.

    Normalisation (``loss_norm``):

    - ``"token"`` (DAPO §3.3, token-level): ``sum_it l_it / N_tok``, ``N_tok`` the counted tokens of
      the batch: every token weighs the same, so long completions are not diluted.
    - ``"sequence"`` (GRPO original): ``(1 / N_seq) sum_i (sum_t l_it / |o_i|)``, the mean over
      sequences of each one's token mean; a sequence with no counted token is left out of
      ``N_seq`` and contributes nothing.

    ``normalizer`` replaces ``N_tok`` (``"token"``) or ``N_seq`` (``"sequence"``) by the count
    over the whole optimizer step, for gradient accumulation over micro-batches (and ranks): with
    it the micro-batch losses sum to the loss of one batch of them all, as the trainer's
    token-normalised accumulation (:mod:`codechat.train.trainer`).

    Masking: positions with mask 0 (prompt, padding, and completions cut at ``max_new_tokens``
    that the caller chose not to train on) contribute nothing: their inputs are replaced by 0
    before any arithmetic, so garbage there (inf, NaN) reaches neither the loss nor the gradient.
    A batch with no counted token gives a loss of 0.0 that is still connected to ``logprobs``
    (backward works; ``stats["tokens"]`` is 0).

    Args:
        logprobs: (B, T) float log-probs of the sampled tokens under the current policy (with grad;
            upcast to float32, as are the others).
        old_logprobs: (B, T) the same under the policy that sampled them (detached here).
        advantages: (B,) one per sequence (:func:`group_advantages`; detached here).
        mask: (B, T) bool or 0/1, 1 for the completion tokens that count.
        clip_eps: lower clip, > 0: ratios below ``1 - clip_eps`` stop pushing down.
        clip_eps_high: upper clip, >= 0 (None: ``clip_eps``): ratios above ``1 + clip_eps_high``
            stop pushing up.
        loss_norm: ``"token"`` or ``"sequence"``.
        ref_logprobs: (B, T) under the frozen reference; needed when ``beta > 0``; when given,
            ``stats["kl"]`` is reported even with ``beta == 0``.
        beta: weight of the KL penalty, >= 0 (0: none, as DAPO).
        normalizer: > 0, the step-wide count (see above); None: this batch's.

    Returns:
        ``(loss, stats)``: a float32 scalar; stats (Python floats; computing them syncs once):
        ``loss``, ``tokens``, ``sequences`` (with >= 1 counted token), ``ratio_mean``,
        ``clip_frac_low``, ``clip_frac_high``, ``clip_frac`` (their sum), ``adv_mean`` (token-mean
        advantage), and ``kl`` with ``ref_logprobs``; the means are over counted tokens (0.0 with none).

    Raises:
        ValueError: mismatched shapes, a non-0/1 mask, an unknown ``loss_norm``, ``clip_eps <= 0``,
            ``clip_eps_high < 0``, ``beta < 0``, ``beta > 0`` without ``ref_logprobs``, or
            ``normalizer <= 0``.
    """
    if logprobs.dim() != 2:
        raise ValueError(f"logprobs must be (B, T), got shape {tuple(logprobs.shape)}")
    shape = logprobs.shape
    for name, t in (("old_logprobs", old_logprobs), ("ref_logprobs", ref_logprobs)):
        if t is not None and t.shape != shape:
            raise ValueError(f"{name} must have the shape of logprobs {tuple(shape)}, got {tuple(t.shape)}")
    if advantages.shape != shape[:1]:
        raise ValueError(f"advantages must be (B,) = ({shape[0]},), got {tuple(advantages.shape)}")
    if loss_norm not in LOSS_NORMS:
        raise ValueError(f"loss_norm must be one of {LOSS_NORMS}, got {loss_norm!r}")
    eps_low = clip_eps
    eps_high = clip_eps if clip_eps_high is None else clip_eps_high
    if not eps_low > 0 or not eps_high >= 0:
        raise ValueError(f"clip_eps must be > 0 and clip_eps_high >= 0, got {clip_eps} and {clip_eps_high}")
    if not beta >= 0:
        raise ValueError(f"beta must be >= 0, got {beta}")
    if beta > 0 and ref_logprobs is None:
        raise ValueError("beta > 0 needs ref_logprobs (the frozen reference's log-probs of the same tokens)")
    if normalizer is not None and not normalizer > 0:
        raise ValueError(f"normalizer must be > 0, got {normalizer}")
    keep = _bool_mask(mask, shape)  # (B, T)

    # zero the inputs where not counted, before any arithmetic: no inf/NaN there reaches loss or grad
    lp = torch.where(keep, logprobs.float(), 0.0)
    old = torch.where(keep, old_logprobs.detach().float(), 0.0)
    adv = advantages.detach().float().to(lp.device).unsqueeze(1)  # (B, 1)
    ratio = torch.exp(lp - old)  # (B, T), 1.0 where not counted
    surrogate = torch.minimum(ratio * adv, ratio.clamp(1.0 - eps_low, 1.0 + eps_high) * adv)
    per_token = -surrogate  # (B, T)
    kl = None
    if ref_logprobs is not None:
        d = torch.where(keep, ref_logprobs.detach().float(), 0.0) - lp  # log(pi_ref / pi)
        kl = torch.exp(d) - d - 1.0  # k3 >= 0, 0 where not counted
        if beta > 0:
            per_token = per_token + beta * kl
    per_token = torch.where(keep, per_token, 0.0)

    n_tok_seq = keep.sum(dim=1)  # (B,) counted tokens per sequence
    if loss_norm == "token":
        denom = float(normalizer) if normalizer is not None else n_tok_seq.sum().clamp(min=1)
        loss = per_token.sum() / denom
    else:
        has = n_tok_seq > 0
        seq_mean = per_token.sum(dim=1) / n_tok_seq.clamp(min=1)  # (B,), 0 for a sequence without tokens
        denom = float(normalizer) if normalizer is not None else has.sum().clamp(min=1)
        loss = seq_mean.sum() / denom

    with torch.no_grad():
        n = keep.sum()
        k = keep.float()
        low = (ratio < 1.0 - eps_low) & (adv < 0) & keep  # clipped from below: gradient removed
        high = (ratio > 1.0 + eps_high) & (adv > 0) & keep
        row = [loss.detach(), n.float(), (n_tok_seq > 0).sum().float(), (ratio * k).sum(), low.sum().float(),
               high.sum().float(), (adv * k).sum(), (kl * k).sum() if kl is not None else n.float() * 0]
        loss_v, tokens, seqs, ratio_sum, low_n, high_n, adv_sum, kl_sum = torch.stack(row).tolist()
    per = 1.0 / tokens if tokens else 0.0
    stats = {"loss": loss_v, "tokens": tokens, "sequences": seqs, "ratio_mean": ratio_sum * per,
             "clip_frac_low": low_n * per, "clip_frac_high": high_n * per, "clip_frac": (low_n + high_n) * per,
             "adv_mean": adv_sum * per}
    if kl is not None:
        stats["kl"] = kl_sum * per
    return loss, stats


__all__ = ["ADVANTAGE_SCALES", "LOSS_NORMS", "ZERO_STD_TOL", "AdvantageStats", "group_advantages",
           "sequence_logprobs", "policy_loss"]

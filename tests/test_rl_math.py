"""GRPO math (codechat.train.rl): advantages (case 15) and the clipped loss, against hand-computed values."""
from __future__ import annotations

import json
import math

import pytest
import torch

from codechat.train.rl import group_advantages, policy_loss, sequence_logprobs

from conftest import shared_file


def case_15() -> tuple[dict, list[list[float]], dict]:
    """Case 15 of ``shared/cases`` (the test skips, naming the file, when it is absent): the case, its
    equal-reward groups and its outlier group."""
    case = json.loads(shared_file("cases/15-grpo-equal-rewards.json").read_text())
    return (case, [g["rewards"] for g in case["groups"] if "expected_advantages" in g],
            next(g for g in case["groups"] if "expected" in g))


# The same rules on the project's own groups. Every group is flat: 0.1 x 10, 0.7 x 9 and 0.2 x 12 leave a
# float32 residue in torch's mean (checked below), 0.0 x 5 has std exactly 0 (0/0 without a guard).
OWN_EQUAL_GROUPS = [[0.1] * 10, [0.7] * 9, [0.2] * 12, [0.0] * 5, [1.0] * 3]
# One outlier: mean 0.2; r - mean = -0.1 (x5), 0.5; sum of squares 0.3; sample var 0.3 / 5 = 0.06,
# std 0.244949: -0.408248 and 2.041241 ("std"); -0.1 and 0.5 ("none"). (Population std would give
# -0.447214 / 2.236068 and leave-one-out -0.12 / 0.6: neither is the documented baseline.)
OWN_OUTLIER = [0.1] * 5 + [0.7]
OWN_OUTLIER_EXPECTED = {"std": (-0.408248, 2.041241), "none": (-0.1, 0.5)}


def ln(x: float) -> float:
    return math.log(x)


# ----------------------------------------------------------------------------- advantages
@pytest.mark.parametrize("scale", ["std", "none"])
@pytest.mark.parametrize("as_tensor", [True, False], ids=["float32-tensor", "list"])
def test_case_15_equal_rewards_give_exactly_zero_advantages(scale, as_tensor):
    _, equal_groups, _ = case_15()
    for rewards in equal_groups:
        given = torch.tensor(rewards, dtype=torch.float32) if as_tensor else list(rewards)
        adv, stats = group_advantages(given, ["p"] * len(rewards), scale=scale)
        assert adv.dtype == torch.float32
        assert torch.equal(adv, torch.zeros(len(rewards)))
        assert stats.frac_reward_zero_std == 1.0 and stats.n_groups_zero_std == 1


@pytest.mark.parametrize("scale", ["std", "none"])
def test_case_15_all_groups_in_one_batch_outlier_gets_the_documented_baseline(scale):
    case, _, outlier = case_15()
    rewards, ids, sizes = [], [], []
    for k, g in enumerate(case["groups"]):
        rewards += g["rewards"]
        ids += [f"g{k}"] * len(g["rewards"])
        sizes.append(len(g["rewards"]))
    adv, stats = group_advantages(torch.tensor(rewards, dtype=torch.float32), ids, scale=scale)
    n_equal = sum(sizes[:3])
    assert torch.equal(adv[:n_equal], torch.zeros(n_equal))
    out = adv[n_equal:]
    # hand: mean = 3.4 / 8 = 0.425; r - mean = -0.075 (x7), 0.525; sample var = 0.315 / 7 = 0.045
    others, last = (-0.353553, 2.474874) if scale == "std" else (-0.075, 0.525)
    if scale == "std":
        exp = outlier["expected"]["grpo_sample_std"]
        assert (exp["others"], exp["last"]) == (others, last)
    assert len(set(out[:7].tolist())) == 1  # no float residue among the seven equal rewards
    assert out[0].item() == pytest.approx(others, abs=1e-5)
    assert out[7].item() == pytest.approx(last, abs=1e-5)
    assert stats.n_groups == 4 and stats.n_groups_zero_std == 3 and stats.frac_reward_zero_std == 0.75


def test_own_flat_groups_leave_a_float_residue_without_the_guard():
    """The fixture groups are a real test: naive float32 GRPO ((r - mean) / (std + eps)) gives O(1) values
    or NaN on them."""
    naive = []
    for g in OWN_EQUAL_GROUPS:
        r = torch.tensor(g, dtype=torch.float32)
        naive.append(((r - r.mean()) / r.std()).abs().max().item())
    assert sum(v > 0.1 for v in naive) >= 3 and any(math.isnan(v) for v in naive)


@pytest.mark.parametrize("scale", ["std", "none"])
@pytest.mark.parametrize("as_tensor", [True, False], ids=["float32-tensor", "list"])
def test_equal_rewards_give_exactly_zero_advantages(scale, as_tensor):
    for rewards in OWN_EQUAL_GROUPS:
        given = torch.tensor(rewards, dtype=torch.float32) if as_tensor else list(rewards)
        adv, stats = group_advantages(given, ["p"] * len(rewards), scale=scale)
        assert adv.dtype == torch.float32
        assert torch.equal(adv, torch.zeros(len(rewards)))  # exactly 0: no NaN, no residue
        assert stats.frac_reward_zero_std == 1.0 and stats.n_groups_zero_std == 1


@pytest.mark.parametrize("scale", ["std", "none"])
def test_flat_groups_and_an_outlier_in_one_batch_get_zeros_and_the_documented_baseline(scale):
    groups = OWN_EQUAL_GROUPS + [OWN_OUTLIER]
    rewards = [r for g in groups for r in g]
    ids = [f"g{k}" for k, g in enumerate(groups) for _ in g]
    adv, stats = group_advantages(torch.tensor(rewards, dtype=torch.float32), ids, scale=scale)
    n_equal = len(rewards) - len(OWN_OUTLIER)
    assert torch.equal(adv[:n_equal], torch.zeros(n_equal))
    out = adv[n_equal:]
    others, last = OWN_OUTLIER_EXPECTED[scale]
    assert len(set(out[:5].tolist())) == 1  # no float residue among the five equal rewards
    assert out[0].item() == pytest.approx(others, abs=1e-5)
    assert out[5].item() == pytest.approx(last, abs=1e-5)
    assert stats.n_groups == 6 and stats.n_groups_zero_std == 5 and stats.frac_reward_zero_std == pytest.approx(5 / 6)


def test_own_flat_groups_give_zero_loss_and_zero_gradient():
    # a batch made only of equal-reward groups: policy-gradient loss 0 and gradient 0
    ids = [k for k, g in enumerate(OWN_EQUAL_GROUPS) for _ in g]
    adv, _ = group_advantages([r for g in OWN_EQUAL_GROUPS for r in g], ids)
    n = len(ids)
    torch.manual_seed(1)
    lp = torch.log(torch.rand(n, 4) * 0.9 + 0.05).requires_grad_(True)
    old = lp.detach() + 0.3 * torch.randn(n, 4)
    loss, _ = policy_loss(lp, old, adv, torch.ones(n, 4))
    loss.backward()
    assert loss.item() == 0.0 and torch.equal(lp.grad, torch.zeros(n, 4))


def test_one_hot_group_of_four_uses_the_sample_std():
    # mean 0.25; deviations 0.75, -0.25 x3; sum of squares 0.75; sample var 0.75 / 3 = 0.25; std 0.5
    adv, _ = group_advantages([1.0, 0.0, 0.0, 0.0], [7, 7, 7, 7])
    assert adv.tolist() == [1.5, -0.5, -0.5, -0.5]
    adv, _ = group_advantages([0.0, 0.0, 1.0, 0.0], [7, 7, 7, 7], scale="none")
    assert adv.tolist() == [-0.25, -0.25, 0.75, -0.25]


def test_groups_are_formed_by_id_not_position():
    # group a = [1, 0, 0, 0] -> [1.5, -0.5, -0.5, -0.5]
    # group b = [0, 1, 1, 0]: mean 0.5, deviations +-0.5, sample var 1 / 3 -> +-0.5 * sqrt(3) = +-0.866025
    b = 0.5 * math.sqrt(3)
    grouped, _ = group_advantages([1, 0, 0, 0, 0, 1, 1, 0], list("aaaabbbb"))
    interleaved, _ = group_advantages([1, 0, 0, 1, 0, 1, 0, 0], list("abababab"))  # generation-major
    assert grouped.tolist() == pytest.approx([1.5, -0.5, -0.5, -0.5, -b, b, b, -b], abs=1e-6)
    assert interleaved.tolist() == pytest.approx([1.5, -b, -0.5, b, -0.5, b, -0.5, -b], abs=1e-6)
    assert torch.equal(interleaved[0::2], grouped[:4]) and torch.equal(interleaved[1::2], grouped[4:])
    # ids in a tensor group by value (a tensor element hashes by identity)
    by_tensor, stats = group_advantages([1, 0, 0, 1, 0, 1, 0, 0], torch.tensor([3, 4, 3, 4, 3, 4, 3, 4]))
    assert torch.equal(by_tensor, interleaved) and stats.n_groups == 2


def test_unscorable_rewards_are_excluded_and_get_zero():
    # group p: scorable [1, 0] -> mean 0.5, sample std sqrt(0.5) -> +-0.707107
    # group q: one scorable -> 0; group r: none scorable -> 0
    rewards = [1.0, None, 0.0, math.nan, 0.7, None, None, math.nan]
    ids = ["p", "p", "p", "p", "q", "q", "r", "r"]
    adv, stats = group_advantages(rewards, ids)
    s = math.sqrt(0.5)
    assert adv.tolist() == pytest.approx([s, 0.0, -s, 0.0, 0.0, 0.0, 0.0, 0.0], abs=1e-6)
    assert [adv[i].item() for i in (1, 3, 4, 5, 6, 7)] == [0.0] * 6  # exactly
    assert (stats.n_rollouts, stats.n_unscorable, stats.n_groups, stats.n_groups_zero_std) == (8, 5, 3, 2)
    assert stats.frac_reward_zero_std == pytest.approx(2 / 3)
    assert stats.reward_mean == pytest.approx(1.7 / 3)
    # a NaN in a float tensor is unscorable too, and the others keep their values: [0.75, -0.25, ...] "none"
    adv, stats = group_advantages(torch.tensor([1.0, float("nan"), 0.0, 0.0, 0.0]), [0] * 5, scale="none")
    assert adv.tolist() == [0.75, 0.0, -0.25, -0.25, -0.25] and stats.n_unscorable == 1


def test_near_equal_rewards_are_flat_and_a_real_difference_is_not():
    adv, _ = group_advantages([0.35, 0.35 + 1e-9, 0.35], ["x"] * 3)
    assert torch.equal(adv, torch.zeros(3))
    adv, _ = group_advantages([0.35, 0.351], ["x"] * 2)  # n = 2: +-(0.0005 / (0.001 / sqrt 2)) = +-0.707107
    assert adv.tolist() == pytest.approx([-math.sqrt(0.5), math.sqrt(0.5)], abs=1e-5)


def test_bad_advantage_inputs_raise():
    with pytest.raises(ValueError, match="infinite"):
        group_advantages([1.0, math.inf], [0, 0])
    with pytest.raises(ValueError, match="group ids"):
        group_advantages([1.0, 0.0], [0])
    with pytest.raises(ValueError, match="scale"):
        group_advantages([1.0, 0.0], [0, 0], scale="rloo")
    with pytest.raises(ValueError, match="at least one"):
        group_advantages([], [])


# ----------------------------------------------------------------------------- loss
def _lp(probs: list[list[float]]) -> torch.Tensor:
    return torch.tensor([[ln(p) for p in row] for row in probs], dtype=torch.float32)


def _clip_batch():
    """old p = 0.4 everywhere; current p = 0.4 * ratio with ratios [[1.5, 1.1, 0.5], [0.5, 0.9, 1.5]]."""
    ratios = [[1.5, 1.1, 0.5], [0.5, 0.9, 1.5]]
    old = _lp([[0.4] * 3] * 2)
    lp = _lp([[0.4 * r for r in row] for row in ratios]).requires_grad_(True)
    return lp, old, torch.tensor([1.0, -1.0]), torch.ones(2, 3)


def test_clipping_on_both_sides_removes_exactly_the_clipped_gradients():
    lp, old, adv, mask = _clip_batch()
    loss, stats = policy_loss(lp, old, adv, mask, clip_eps=0.2)
    # per token -min(rho A, clip(rho, 0.8, 1.2) A):
    #   A=+1, rho [1.5, 1.1, 0.5] -> [-1.2 (clipped), -1.1, -0.5]
    #   A=-1, rho [0.5, 0.9, 1.5] -> [ 0.8 (clipped),  0.9,  1.5]
    # token mean: (-2.8 + 3.2) / 6
    assert loss.item() == pytest.approx(0.4 / 6, abs=1e-6)
    loss.backward()
    # d/dlogp of -rho A / 6 is -rho A / 6 where unclipped, 0 where clipped
    want = torch.tensor([[0.0, -1.1 / 6, -0.5 / 6], [0.0, 0.9 / 6, 1.5 / 6]])
    assert torch.allclose(lp.grad, want, atol=1e-6)
    assert lp.grad[0, 0].item() == 0.0 and lp.grad[1, 0].item() == 0.0
    assert stats["clip_frac_high"] == pytest.approx(1 / 6) and stats["clip_frac_low"] == pytest.approx(1 / 6)
    assert stats["clip_frac"] == pytest.approx(2 / 6)
    assert stats["ratio_mean"] == pytest.approx(6.0 / 6, abs=1e-6)  # (1.5+1.1+0.5+0.5+0.9+1.5) / 6
    assert stats["tokens"] == 6 and "kl" not in stats


def test_clip_higher_raises_only_the_upper_bound():
    lp, old, adv, mask = _clip_batch()
    loss, stats = policy_loss(lp, old, adv, mask, clip_eps=0.2, clip_eps_high=0.6)
    # rho 1.5 < 1.6 is no longer clipped: -1.5 instead of -1.2; the low side is unchanged
    assert loss.item() == pytest.approx(0.1 / 6, abs=1e-6)
    loss.backward()
    assert lp.grad[0, 0].item() == pytest.approx(-1.5 / 6, abs=1e-6) and lp.grad[1, 0].item() == 0.0
    assert stats["clip_frac_high"] == 0.0 and stats["clip_frac_low"] == pytest.approx(1 / 6)
    loss, _ = policy_loss(lp.detach(), old, adv, mask, clip_eps=0.2, clip_eps_high=0.28)  # DAPO's values
    assert loss.item() == pytest.approx((-1.28 - 1.1 - 0.5 + 0.8 + 0.9 + 1.5) / 6, abs=1e-6)


def _two_lengths():
    """On-policy (rho = 1): sequence 0 has 1 counted token and A = +1, sequence 1 has 3 and A = -0.5."""
    lp = _lp([[0.5, 0.5, 0.5], [0.3, 0.2, 0.6]]).requires_grad_(True)
    mask = torch.tensor([[1, 0, 0], [1, 1, 1]])
    return lp, torch.tensor([1.0, -0.5]), mask


def test_token_normalisation_weighs_every_token_equally():
    lp, adv, mask = _two_lengths()
    loss, stats = policy_loss(lp, lp.detach(), adv, mask, loss_norm="token")
    assert loss.item() == pytest.approx((-1.0 + 3 * 0.5) / 4)  # 0.125
    loss.backward()
    assert torch.allclose(lp.grad, torch.tensor([[-0.25, 0.0, 0.0], [0.125, 0.125, 0.125]]))
    assert (stats["tokens"], stats["sequences"], stats["clip_frac"], stats["ratio_mean"]) == (4, 2, 0.0, 1.0)


def test_sequence_normalisation_averages_each_sequence_first():
    lp, adv, mask = _two_lengths()
    loss, _ = policy_loss(lp, lp.detach(), adv, mask, loss_norm="sequence")
    assert loss.item() == pytest.approx((-1.0 / 1 + 1.5 / 3) / 2)  # -0.25
    loss.backward()
    assert torch.allclose(lp.grad, torch.tensor([[-0.5, 0.0, 0.0], [1 / 12, 1 / 12, 1 / 12]]))


@pytest.mark.parametrize("norm,count,whole", [("token", 4, 0.125), ("sequence", 2, -0.25)])
def test_micro_batches_with_the_step_normalizer_sum_to_the_whole_batch(norm, count, whole):
    lp, adv, mask = _two_lengths()
    total = sum(policy_loss(lp[i:i + 1], lp[i:i + 1].detach(), adv[i:i + 1], mask[i:i + 1], loss_norm=norm,
                            normalizer=count)[0] for i in range(2))
    assert total.item() == pytest.approx(whole)
    total.backward()
    g_micro = lp.grad.clone()
    lp.grad = None
    policy_loss(lp, lp.detach(), adv, mask, loss_norm=norm)[0].backward()
    assert torch.allclose(g_micro, lp.grad)


def test_truncated_completion_masking_ignores_garbage_and_has_zero_gradient_there():
    # sequence 1 was cut at max_new_tokens and masked out entirely; sequence 0's last two positions are padding
    lp = torch.tensor([[ln(0.5), math.inf, math.nan], [ln(0.2), ln(0.1), -math.inf]]).requires_grad_(True)
    old = torch.tensor([[ln(0.25), math.nan, 0.0], [ln(0.2), math.inf, 5.0]])
    mask = torch.tensor([[True, False, False], [False, False, False]])
    loss, stats = policy_loss(lp, old, torch.tensor([1.0, -3.0]), mask, clip_eps=0.2, clip_eps_high=1.5)
    # one counted token: rho = 0.5 / 0.25 = 2 <= 1 + 1.5, A = +1 -> loss -2, gradient -rho A = -2
    assert loss.item() == pytest.approx(-2.0)
    loss.backward()
    assert torch.isfinite(lp.grad).all()
    assert lp.grad[0, 0].item() == pytest.approx(-2.0)
    lp.grad[0, 0] = 0.0
    assert torch.equal(lp.grad, torch.zeros(2, 3))
    assert stats["tokens"] == 1 and stats["sequences"] == 1
    # sequence normalisation leaves the masked-out sequence out of the count: still -2
    assert policy_loss(lp, old, torch.tensor([1.0, -3.0]), mask, loss_norm="sequence",
                       clip_eps_high=1.5)[0].item() == pytest.approx(-2.0)


def test_a_batch_with_no_counted_token_gives_a_connected_zero():
    lp = _lp([[0.5, 0.5]]).requires_grad_(True)
    loss, stats = policy_loss(lp, lp.detach(), torch.tensor([1.0]), torch.zeros(1, 2))
    loss.backward()
    assert loss.item() == 0.0 and torch.equal(lp.grad, torch.zeros(1, 2)) and stats["tokens"] == 0


def test_flat_groups_give_zero_loss_and_zero_gradient():
    # case 15's loss_check: a batch made only of equal-reward groups
    _, equal_groups, _ = case_15()
    adv, _ = group_advantages(equal_groups[0] + equal_groups[1], ["a"] * 7 + ["b"] * 8)
    torch.manual_seed(0)
    lp = torch.log(torch.rand(15, 5) * 0.9 + 0.05).requires_grad_(True)
    old = lp.detach() + 0.3 * torch.randn(15, 5)
    loss, _ = policy_loss(lp, old, adv, torch.ones(15, 5))
    loss.backward()
    assert loss.item() == 0.0 and torch.equal(lp.grad, torch.zeros(15, 5))


def test_k3_kl_term_for_known_log_probs():
    # k3 = pi_ref/pi - log(pi_ref/pi) - 1:
    #   pi = 0.5, ref = 0.25: 0.5 + ln 2 - 1 = 0.193147;  pi = 0.25, ref = 0.5: 2 - ln 2 - 1 = 0.306853
    lp = _lp([[0.5, 0.25]]).requires_grad_(True)
    ref = _lp([[0.25, 0.5]])
    loss, stats = policy_loss(lp, lp.detach(), torch.tensor([0.0]), torch.ones(1, 2), ref_logprobs=ref, beta=0.1)
    assert stats["kl"] == pytest.approx(0.25, abs=1e-6)  # (0.193147 + 0.306853) / 2
    assert loss.item() == pytest.approx(0.1 * 0.25, abs=1e-7)
    loss.backward()
    # d k3 / d logp = 1 - pi_ref/pi: 1 - 0.5 = 0.5 and 1 - 2 = -1; times beta / 2 tokens
    assert torch.allclose(lp.grad, torch.tensor([[0.025, -0.05]]), atol=1e-7)
    _, stats0 = policy_loss(lp, lp.detach(), torch.tensor([0.0]), torch.ones(1, 2), ref_logprobs=ref)
    assert stats0["kl"] == pytest.approx(0.25, abs=1e-6)  # reported with beta = 0 too
    one, _ = policy_loss(_lp([[0.5]]), _lp([[0.5]]), torch.tensor([0.0]), torch.ones(1, 1),
                         ref_logprobs=_lp([[0.25]]), beta=1.0)
    assert one.item() == pytest.approx(0.5 + math.log(2) - 1, abs=1e-6)


def test_bad_loss_inputs_raise():
    lp, old, adv, mask = _clip_batch()
    with pytest.raises(ValueError, match="ref_logprobs"):
        policy_loss(lp, old, adv, mask, beta=0.04)
    with pytest.raises(ValueError, match="loss_norm"):
        policy_loss(lp, old, adv, mask, loss_norm="mean")
    with pytest.raises(ValueError, match="advantages"):
        policy_loss(lp, old, adv[:1], mask)
    with pytest.raises(ValueError, match="mask"):
        policy_loss(lp, old, adv, mask * 0.5)
    with pytest.raises(ValueError, match="clip_eps"):
        policy_loss(lp, old, adv, mask, clip_eps=0.0)
    with pytest.raises(ValueError, match="old_logprobs"):
        policy_loss(lp, old[:, :2], adv, mask)


# ----------------------------------------------------------------------------- log-probs
def test_sequence_logprobs_of_known_logits():
    # logits [0, 0, ln 2] -> softmax [1/4, 1/4, 1/2]
    logits = torch.tensor([[[0.0, 0.0, ln(2)], [0.0, 0.0, ln(2)], [5.0, 1.0, 2.0]]]).requires_grad_(True)
    tokens = torch.tensor([[2, 0, -100]])
    lp = sequence_logprobs(logits, tokens, torch.tensor([[1, 1, 0]]))
    assert lp.dtype == torch.float32
    assert lp.tolist()[0] == pytest.approx([ln(0.5), ln(0.25), 0.0], abs=1e-6)
    lp.sum().backward()
    # d log p_k / d z = onehot(k) - softmax
    assert torch.allclose(logits.grad[0, 0], torch.tensor([-0.25, -0.25, 0.5]), atol=1e-6)
    assert torch.equal(logits.grad[0, 2], torch.zeros(3))
    # temperature 2: exp([0, 0, ln2 / 2]) = [1, 1, sqrt 2] -> p(2) = sqrt 2 / (2 + sqrt 2) = 0.414214
    hot = sequence_logprobs(logits.detach()[:, :1], tokens[:, :1], temperature=2.0)
    assert hot.item() == pytest.approx(ln(math.sqrt(2) / (2 + math.sqrt(2))), abs=1e-6)
    with pytest.raises(ValueError, match="temperature"):
        sequence_logprobs(logits, tokens, temperature=0.0)

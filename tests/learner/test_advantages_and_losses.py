"""Advantages and losses against values worked out by hand on tiny tensors."""

from __future__ import annotations

import math

import pytest
import torch

from learner.advantages import (
    grpo_advantages,
    kl_penalty,
    masked_normalise,
    normalise_per_role,
    reinforce_pp_advantages,
)
from learner.losses import LOSSES, LossConfig, LossInputs, loss_named, ppo_clip, register


def test_grpo_subtracts_the_group_mean_and_divides_by_its_std() -> None:
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0])
    groups = [("solver", 7)] * 4 + [("verifier", 7)] * 2
    result = grpo_advantages(rewards, groups, eps=0.0)
    # Group one: mean 0.25, population std sqrt(0.1875) = 0.4330.
    std = math.sqrt(0.1875)
    expected = [0.75 / std, -0.25 / std, -0.25 / std, -0.25 / std, 0.0, 0.0]
    assert result.advantages.tolist() == pytest.approx(expected)
    assert result.kept.tolist() == [True] * 4 + [False] * 2
    assert result.zero_variance_groups == 1


def test_grpo_without_std_scaling_only_centres() -> None:
    result = grpo_advantages(torch.tensor([3.0, 1.0]), ["g", "g"], scale_by_std=False)
    assert result.advantages.tolist() == [1.0, -1.0]


def test_kl_estimators() -> None:
    logprobs, reference = torch.tensor([-1.0, -2.0]), torch.tensor([-1.5, -1.0])
    assert kl_penalty(logprobs, reference, "k1").tolist() == pytest.approx([0.5, -1.0])
    # k3 = r - 1 - log r, r = exp(ref - logp): r = e^-0.5, e^1.
    k3 = [math.exp(-0.5) - 1 + 0.5, math.e - 1 - 1]
    assert kl_penalty(logprobs, reference, "k3").tolist() == pytest.approx(k3)
    with pytest.raises(ValueError, match="k2"):
        kl_penalty(logprobs, reference, "k2")


def test_reinforce_pp_puts_the_score_on_the_last_token_and_normalises_over_the_batch() -> None:
    scores = torch.tensor([0.8, 0.2])
    logprobs = torch.tensor([[-1.0, -1.0, -1.0], [-2.0, -2.0, 0.0]])
    reference = torch.tensor([[-1.0, -2.0, -1.0], [-2.0, -1.0, 0.0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    beta = 0.1
    # Token rewards: -beta * (logp - ref); row 0: [0, -0.1, 0 + 0.8]; row 1: [0, 0.1 + 0.2].
    # Returns (gamma 1): row 0: [0.7, 0.7, 0.8]; row 1: [0.3, 0.3].
    returns = torch.tensor([0.7, 0.7, 0.8, 0.3, 0.3])
    normalised = (returns - returns.mean()) / returns.std(unbiased=False)
    advantages = reinforce_pp_advantages(scores, logprobs, reference, mask, beta=beta, eps=0.0)
    assert advantages[mask.bool()].tolist() == pytest.approx(normalised.tolist(), abs=1e-6)
    assert advantages[1, 2].item() == 0.0


def test_per_role_normalisation_gives_each_role_its_own_baseline() -> None:
    advantages = torch.tensor([[1.0, 3.0], [10.0, 30.0]])
    mask = torch.ones(2, 2)
    out = normalise_per_role(advantages, mask, ["solver", "verifier"], eps=0.0)
    assert out.tolist() == [[-1.0, 1.0], [-1.0, 1.0]]
    mixed = masked_normalise(advantages, mask, eps=0.0)
    assert mixed[0].abs().max() < 1.0  # one baseline: the solver's signal nearly vanishes


def inputs(**overrides: torch.Tensor) -> LossInputs:
    fields = {
        "logprobs": torch.log(torch.tensor([[0.5, 0.25], [0.5, 0.5]])),
        "behaviour": torch.log(torch.tensor([[0.25, 0.25], [0.5, 0.25]])),
        "advantages": torch.tensor([[1.0, 1.0], [-1.0, 0.0]]),
        "mask": torch.tensor([[1, 1], [1, 0]]),
    }
    fields.update(overrides)
    return LossInputs(**fields)


def test_ppo_clip_against_behaviour_logprobs() -> None:
    loss, metrics = ppo_clip(inputs(), LossConfig(clip_low=0.2, clip_high=0.2))
    # ratios on real tokens: 2.0 (clipped to 1.2, A=+1 → 1.2), 1.0 (→ 1.0), 1.0 (A=-1 → -1.0).
    assert loss.item() == pytest.approx(-(1.2 + 1.0 - 1.0) / 3)
    assert metrics["clip_fraction"] == pytest.approx(1 / 3)
    assert metrics["ratio_mean"] == pytest.approx(4 / 3)
    assert metrics["is_weight_mean"] == 1.0 and metrics["is_ess"] == pytest.approx(1.0)
    assert metrics["mismatch_kl"] == 0.0


def test_ppo_clip_gradient_flows_only_through_unclipped_tokens() -> None:
    logprobs = torch.log(torch.tensor([[0.5, 0.25], [0.5, 0.5]])).requires_grad_()
    loss, _ = ppo_clip(inputs(logprobs=logprobs), LossConfig())
    loss.backward()
    assert logprobs.grad is not None
    # d(-r*A/3)/dlogp = -r*A/3 where unclipped; the clipped token and padding get 0.
    assert logprobs.grad.flatten().tolist() == pytest.approx([0.0, -1 / 3, 1 / 3, 0.0])


def test_truncated_importance_weights_correct_the_engine_learner_gap() -> None:
    proximal = torch.log(torch.tensor([[1.0, 0.25], [0.5, 0.5]]))
    loss, metrics = ppo_clip(inputs(proximal=proximal), LossConfig(tis_cap=2.0))
    # ratio vs proximal: 0.5 (A=+1, min(0.5, 0.8) = 0.5), 1.0, 1.0 (A=-1).
    # weights prox/behaviour: 4 → capped 2, 1, 1.
    assert loss.item() == pytest.approx(-(0.5 * 2 + 1.0 - 1.0) / 3)
    assert metrics["is_truncated_fraction"] == pytest.approx(1 / 3)
    assert metrics["is_weight_mean"] == pytest.approx(4 / 3)
    assert metrics["is_ess"] == pytest.approx((4**2) / (3 * 6))
    # k3 of behaviour against proximal on the real tokens: r = 4, 1, 1.
    assert metrics["mismatch_kl"] == pytest.approx((4 - 1 - math.log(4)) / 3)


def test_kl_to_a_reference_adds_its_coefficient_times_the_mean_estimate() -> None:
    reference = torch.log(torch.tensor([[0.5, 0.5], [0.5, 0.5]]))
    base, _ = ppo_clip(inputs(), LossConfig())
    with_kl, metrics = ppo_clip(
        inputs(reference=reference), LossConfig(kl_coef=0.5, kl_estimator="k1")
    )
    # k1 = logp - ref: 0, log 0.5, 0 on real tokens.
    assert metrics["reference_kl"] == pytest.approx(math.log(0.5) / 3)
    assert with_kl.item() == pytest.approx(base.item() + 0.5 * math.log(0.5) / 3)


def test_losses_are_registered_by_name() -> None:
    assert loss_named("ppo_clip") is ppo_clip
    with pytest.raises(ValueError, match="unknown loss 'nope'"):
        loss_named("nope")
    with pytest.raises(ValueError, match="already registered"):
        register("ppo_clip")(ppo_clip)
    assert "ppo_clip" in LOSSES

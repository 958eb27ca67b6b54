"""Policy losses: small pure functions registered by name, so adding one touches only
this module (``@register("name")``) and a config line.

The objective is token-level and decoupled (AReaL): three policies meet in it.

* ``behaviour`` μ: the engine that sampled the tokens (its logprobs came with them);
* ``proximal`` π_prox: the learner's own policy before this step (its recomputation);
* the policy being trained, π_θ.

PPO's ratio r = π_θ / π_prox is clipped to [1 - ε_low, 1 + ε_high]; the gap between
learner and engine (staleness, and kernels that differ) is corrected by the truncated
importance weight w = min(π_prox / μ, cap). Without a proximal recomputation the ratio is
taken against the behaviour logprobs directly and w = 1. Token losses are averaged over
every real token of the batch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from learner.advantages import kl_penalty


@dataclass(frozen=True)
class LossConfig:
    clip_low: float = 0.2
    clip_high: float = 0.2
    tis_cap: float = 2.0
    kl_coef: float = 0.0
    kl_estimator: str = "k3"


@dataclass(frozen=True)
class LossInputs:
    """``[N, T]`` tensors; ``logprobs`` carries the gradient, the rest are detached."""

    logprobs: torch.Tensor
    behaviour: torch.Tensor
    advantages: torch.Tensor
    mask: torch.Tensor
    proximal: torch.Tensor | None = None
    reference: torch.Tensor | None = None


LossFn = Callable[[LossInputs, LossConfig], tuple[torch.Tensor, dict[str, float]]]
LOSSES: dict[str, LossFn] = {}


def register(name: str) -> Callable[[LossFn], LossFn]:
    def add(loss: LossFn) -> LossFn:
        if name in LOSSES:
            raise ValueError(f"a loss named {name!r} is already registered")
        LOSSES[name] = loss
        return loss

    return add


def loss_named(name: str) -> LossFn:
    try:
        return LOSSES[name]
    except KeyError:
        raise ValueError(f"unknown loss {name!r}; registered: {sorted(LOSSES)}") from None


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return (values * mask).sum() / mask.sum().clamp(min=1)


@register("ppo_clip")
def ppo_clip(inputs: LossInputs, config: LossConfig) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped surrogate with truncated importance sampling and an optional KL to a
    frozen reference. Returns the loss and what to log: the PPO clip fraction, the
    importance weights' mean, the fraction truncated and their effective sample size
    (1 when all weights are equal), and the mismatch KL between engine and learner."""
    mask = inputs.mask.to(inputs.logprobs.dtype)
    proximal = inputs.behaviour if inputs.proximal is None else inputs.proximal
    ratio = torch.exp(inputs.logprobs - proximal)
    clipped = ratio.clamp(1 - config.clip_low, 1 + config.clip_high)
    surrogate = torch.minimum(ratio * inputs.advantages, clipped * inputs.advantages)
    raw_weight = torch.exp(proximal - inputs.behaviour).detach()
    weight = raw_weight.clamp(max=config.tis_cap)
    loss = -masked_mean(surrogate * weight, mask)
    kl = 0.0
    if config.kl_coef and inputs.reference is not None:
        penalty = masked_mean(
            kl_penalty(inputs.logprobs, inputs.reference, config.kl_estimator), mask
        )
        loss = loss + config.kl_coef * penalty
        kl = float(penalty.detach())
    real = mask.bool()
    weights = weight[real]
    metrics = {
        "ratio_mean": float(ratio.detach()[real].mean()),
        "clip_fraction": float(
            ((ratio.detach() - clipped.detach()).abs() > 0)[real].float().mean()
        ),
        "is_weight_mean": float(weights.mean()),
        "is_truncated_fraction": float((raw_weight[real] > config.tis_cap).float().mean()),
        "is_ess": float(weights.sum() ** 2 / (weights.numel() * (weights**2).sum())),
        "mismatch_kl": float(masked_mean(kl_penalty(inputs.behaviour, proximal, "k3"), mask)),
        "reference_kl": kl,
    }
    return loss, metrics

"""Advantages from rewards: GRPO's group baseline (MarsRL) and REINFORCE++ returns with
a per-token KL penalty, normalised over an agent's whole batch (MAPPA).

Shapes: ``N`` sequences, ``T`` completion tokens (right-padded; ``mask`` marks real
tokens). Every function is pure and works on CPU tensors.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class GroupAdvantages:
    """One advantage per sequence; ``kept`` is false for sequences of groups whose
    rewards were all equal (they carry no signal and are filtered, and counted)."""

    advantages: torch.Tensor
    kept: torch.Tensor
    zero_variance_groups: int


def grpo_advantages(
    rewards: torch.Tensor,
    groups: Sequence[Hashable],
    *,
    scale_by_std: bool = True,
    eps: float = 1e-6,
) -> GroupAdvantages:
    """Reward minus its group's mean, divided by the group's standard deviation when
    ``scale_by_std`` (GRPO; Dr. GRPO leaves it out). A group is every sample of one role
    on one input; its key is anything hashable, e.g. ``(role, input_id)``."""
    if rewards.dim() != 1 or rewards.shape[0] != len(groups):
        raise ValueError(f"rewards has shape {tuple(rewards.shape)}, groups {len(groups)} keys")
    index: dict[Hashable, int] = {}
    ids = torch.tensor([index.setdefault(g, len(index)) for g in groups], dtype=torch.long)
    count = torch.zeros(len(index)).index_add_(0, ids, torch.ones_like(rewards))
    mean = torch.zeros(len(index)).index_add_(0, ids, rewards) / count
    centred = rewards - mean[ids]
    variance = torch.zeros(len(index)).index_add_(0, ids, centred**2) / count
    std = variance.clamp(min=0).sqrt()
    flat = std <= eps
    kept = ~flat[ids]
    advantages = centred / (std[ids] + eps) if scale_by_std else centred
    return GroupAdvantages(torch.where(kept, advantages, 0.0), kept, int(flat.sum()))


def kl_penalty(
    logprobs: torch.Tensor, reference: torch.Tensor, estimator: str = "k1"
) -> torch.Tensor:
    """Per-token KL estimate of the policy from the reference, from sampled tokens'
    logprobs: ``k1`` = log π - log π_ref (unbiased, can be negative), ``k3`` =
    r - 1 - log r with r = π_ref/π (non-negative, lower variance)."""
    delta = logprobs - reference
    if estimator == "k1":
        return delta
    if estimator == "k3":
        return torch.expm1(-delta) + delta
    raise ValueError(f"KL estimator must be k1 or k3, got {estimator!r}")


def reinforce_pp_advantages(
    scores: torch.Tensor,
    logprobs: torch.Tensor,
    reference: torch.Tensor,
    mask: torch.Tensor,
    *,
    beta: float = 0.01,
    gamma: float = 1.0,
    eps: float = 1e-8,
) -> torch.Tensor:
    """REINFORCE++ token advantages: the reward is ``scores[i]`` on sequence i's last
    real token minus ``beta`` * k1 KL on every token; returns are discounted sums to the
    end; advantages are the returns normalised (mean, std) over every real token of the
    batch, so one agent's batch shares one baseline (no per-prompt groups)."""
    if logprobs.shape != reference.shape or logprobs.shape != mask.shape:
        raise ValueError(
            f"logprobs {tuple(logprobs.shape)}, reference {tuple(reference.shape)} and mask "
            f"{tuple(mask.shape)} must have one shape"
        )
    mask = mask.to(logprobs.dtype)
    lengths = mask.sum(dim=1).long()
    if bool((lengths == 0).any()):
        raise ValueError("every sequence needs at least one real token")
    rewards = -beta * kl_penalty(logprobs, reference, "k1") * mask
    rewards[torch.arange(len(lengths)), lengths - 1] += scores.to(logprobs.dtype)
    returns = torch.zeros_like(rewards)
    running = torch.zeros(rewards.shape[0], dtype=rewards.dtype)
    for t in range(rewards.shape[1] - 1, -1, -1):
        running = rewards[:, t] + gamma * running * mask[:, t]
        returns[:, t] = running
    return masked_normalise(returns, mask, eps=eps)


def masked_normalise(
    values: torch.Tensor, mask: torch.Tensor, *, eps: float = 1e-8
) -> torch.Tensor:
    """(values - mean) / std over the real tokens; padding stays 0."""
    mask = mask.to(values.dtype)
    count = mask.sum()
    mean = (values * mask).sum() / count
    std = (((values - mean) ** 2 * mask).sum() / count).sqrt()
    return (values - mean) / (std + eps) * mask


def normalise_per_role(
    advantages: torch.Tensor, mask: torch.Tensor, roles: Sequence[str], *, eps: float = 1e-8
) -> torch.Tensor:
    """Normalise each role's tokens on their own when one policy plays several roles:
    one baseline over mixed roles lets the role with the larger reward scale dominate
    the gradient (Dr. MAS)."""
    out = torch.zeros_like(advantages)
    for role in dict.fromkeys(roles):
        rows = torch.tensor([r == role for r in roles])
        out[rows] = masked_normalise(advantages[rows], mask[rows], eps=eps)
    return out

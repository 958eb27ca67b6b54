"""What a behaviour logprob means, in one place: the engines sample with it and the
learner recomputes it, so their importance ratios compare like with like.

A sampled token's logprob is taken under the *processed* distribution, as vLLM's
``logprobs_mode="processed_logprobs"`` defines it: logits divided by the temperature,
tokens outside the top-k and then outside the top-p nucleus masked out, and the rest
renormalised by a log-softmax. Greedy decoding (temperature 0) keeps the logits as
they are. With every filter off and temperature 1 this is the model's own
log-probability.
"""

from __future__ import annotations

import torch


def processed_logprobs(
    logits: torch.Tensor,
    temperature: torch.Tensor | float,
    top_k: torch.Tensor | int,
    top_p: torch.Tensor | float,
) -> torch.Tensor:
    """Log-probabilities over the vocabulary (last dimension) after temperature, top-k
    and top-p; masked tokens get ``-inf``. Parameters are scalars or one value per row
    of ``logits`` (shape ``logits.shape[:-1]``)."""
    logits = logits.float()
    lead = logits.shape[:-1]
    device = logits.device
    temperature = torch.as_tensor(temperature, dtype=logits.dtype, device=device).expand(lead)
    top_k = torch.as_tensor(top_k, dtype=torch.long, device=device).expand(lead)
    top_p = torch.as_tensor(top_p, dtype=logits.dtype, device=device).expand(lead)
    scale = torch.where(temperature > 0, temperature, torch.ones_like(temperature))
    logits = logits / scale.unsqueeze(-1)
    if bool((top_k > 0).any()) or bool((top_p < 1).any()):
        logits = _mask_top_k_top_p(logits, top_k, top_p)
    return torch.log_softmax(logits, dim=-1)


def _mask_top_k_top_p(
    logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor
) -> torch.Tensor:
    ordered, order = logits.sort(dim=-1, descending=True)
    vocab = logits.shape[-1]
    rank = torch.arange(vocab, device=logits.device).expand_as(ordered)
    k = torch.where(top_k > 0, top_k.clamp(max=vocab), torch.full_like(top_k, vocab))
    drop = rank >= k.unsqueeze(-1)
    ordered = ordered.masked_fill(drop, float("-inf"))
    probs = torch.softmax(ordered, dim=-1)
    before = probs.cumsum(dim=-1) - probs  # mass of the tokens ranked above this one
    drop = drop | ((before >= top_p.unsqueeze(-1)) & (rank > 0))
    ordered = ordered.masked_fill(drop, float("-inf"))
    return torch.empty_like(logits).scatter_(-1, order, ordered)


def sample(
    logprobs: torch.Tensor,
    temperature: torch.Tensor,
    generators: list[torch.Generator | None],
) -> torch.Tensor:
    """One token per row of ``logprobs`` (``[rows, vocab]``): the argmax where the
    temperature is 0, else a draw from the processed distribution.

    Draws use the exponential-race form (argmax of p / E, E ~ Exp(1)), so each row's
    noise comes from its own request's generator and a seeded request samples the same
    tokens whatever else shares its batch.
    """
    noise = torch.empty_like(logprobs).exponential_()
    for row, generator in enumerate(generators):
        if generator is not None:
            noise[row].exponential_(generator=generator)
    drawn = (logprobs.exp() / noise).argmax(dim=-1)
    return torch.where(temperature > 0, drawn, logprobs.argmax(dim=-1))

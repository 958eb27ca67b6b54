"""Teach a freshly built tiny model the roles' output formats before RL.

A randomly initialised model almost never writes ``\\boxed{7}`` or ends with a verdict,
so RL from it would wait a long time for its first reward. Real runs start from a
pretrained checkpoint that already follows instructions; for the embedded default a few
hundred supervised steps stand in for that. They teach the *format* only: every target
answer is a random digit and every target verdict a coin flip, so correctness is left
for RL to learn.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import torch

from actors.messages import ChatTurn, Problem
from actors.models import load_checkpoint
from actors.roles import role_named

_TARGETS: dict[str, Callable[[random.Random], str]] = {
    "answer": lambda rng: f"\\boxed{{{rng.randrange(10)}}}",
    "verdict": lambda rng: rng.choice(["Correct", "Wrong"]),
    "code": lambda rng: f"```python\nprint({rng.randrange(10)})\n```",
}
_KIND = {
    "solver": "answer",
    "corrector": "answer",
    "problem_solver": "answer",
    "final_verifier": "answer",
    "verifier": "verdict",
    "code_executor": "code",
}


def format_examples(
    roles: list[str], problems: list[Problem], count: int, seed: int = 0
) -> list[tuple[list[ChatTurn], str]]:
    """``count`` (chat, target) pairs spread over ``roles``, built with each role's own
    prompt template on ``problems``."""
    rng = random.Random(seed)
    examples = []
    for i in range(count):
        role = role_named(roles[i % len(roles)])
        problem = rng.choice(problems)
        inputs = {
            "problem": problem.text,
            "solution": _TARGETS["answer"](rng),
            "report": _TARGETS["verdict"](rng),
            "observation": str(rng.randrange(10)),
        }
        examples.append((role.render(inputs), _TARGETS[_KIND.get(role.name, "answer")](rng)))
    return examples


def teach_formats(
    path: str | Path,
    examples: list[tuple[list[ChatTurn], str]],
    *,
    steps: int,
    batch: int = 16,
    lr: float = 3e-3,
    seed: int = 0,
) -> float:
    """Train the checkpoint at ``path`` on ``examples`` (loss on the targets only) and
    save it back in place; returns the last step's loss."""
    torch.manual_seed(seed)
    checkpoint = load_checkpoint(path)
    model, tokenizer = checkpoint.model, checkpoint.tokenizer
    eos = int(tokenizer.eos_token_id)
    rows = []
    for chat, target in examples:
        prompt = checkpoint.render_chat([{"role": t.role, "content": t.content} for t in chat])
        completion = [*tokenizer.encode(target, add_special_tokens=False), eos]
        rows.append((prompt, completion))
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    rng = random.Random(seed)
    loss = torch.tensor(0.0)
    model.train()
    for _ in range(steps):
        chosen = rng.sample(rows, min(batch, len(rows)))
        width = max(len(p) + len(c) for p, c in chosen)
        ids = torch.zeros(len(chosen), width, dtype=torch.long)
        labels = torch.full((len(chosen), width), -100, dtype=torch.long)
        for i, (prompt, completion) in enumerate(chosen):
            sequence = prompt + completion
            ids[i, : len(sequence)] = torch.tensor(sequence)
            labels[i, len(prompt) : len(sequence)] = torch.tensor(completion)
        loss = model(input_ids=ids, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    model.eval()
    model.save_pretrained(path, safe_serialization=True)
    return float(loss.detach())

"""Teach a freshly built tiny model the roles' output formats before RL.

A randomly initialised model almost never writes ``\\boxed{7}`` or ends with a verdict,
so RL from it would wait a long time for its first reward. Real runs start from a
pretrained checkpoint that already follows instructions and is right some of the time;
for the embedded default a fixed number of supervised steps stands in for that, on
labels that are right only a fraction of the time (``correct``). The run evaluates on
held-out problems after this warm start and again at its end, so the rise it reports
is RL's own.
"""

from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Literal

import torch

from actors.messages import ChatTurn, Problem
from actors.models import load_checkpoint
from actors.roles import role_named

_KIND = {
    "solver": "answer",
    "corrector": "answer",
    "problem_solver": "answer",
    "final_verifier": "answer",
    "verifier": "verdict",
    "code_executor": "code",
}


def format_examples(
    roles: list[str],
    problems: list[Problem],
    count: int,
    *,
    correct: float = 0.0,
    findings: Literal["result", "parity"] = "result",
    seed: int = 0,
) -> list[tuple[list[ChatTurn], str]]:
    """``count`` (chat, target) pairs spread over ``roles``, built with each role's own
    prompt template on ``problems``. A fraction ``correct`` of the answer targets is
    the problem's answer and the rest a wrong number near it. A verdict target first
    states the Verifier's own result (right with the same probability), then judges
    the shown answer (right half of the time) against that result: findings before
    the verdict, as MarsRL's Verifier writes them. A one-token verdict left the
    comparison to a single step, and RL barely moved it. The review a Corrector target
    answers holds a result that is right half of the time, whatever ``correct`` is: when
    it was always right, the Corrector learnt to copy it (77% and 97% of its greedy
    answers to a wrong review, for seeds 0 and 1, none of them right), and in RL, where
    the Verifier's result is often wrong, its reward fell to about 0.01.

    ``findings="parity"`` makes the Verifier's findings a check it can learn in full
    (see ``parity_findings``), and the reviews the Corrector reads are that check
    failing, as the Corrector only ever sees failing reviews."""
    rng = random.Random(seed)
    examples = []
    for i in range(count):
        role = role_named(roles[i % len(roles)])
        problem = rng.choice(problems)
        shown_right = rng.random() < 0.5
        shown = _answer(problem, shown_right, rng)
        kind = _KIND.get(role.name, "answer")
        # Drawn whatever the findings: it keeps each recipe's examples as they were measured.
        review = f"\\boxed{{{_answer(problem, rng.random() < 0.5, rng)}}}\nWrong"
        if findings == "parity":
            review = parity_findings(problem, shown, failing=True)
        inputs = {
            "problem": problem.text,
            "solution": f"\\boxed{{{shown}}}",
            "report": review,
            # The code executor writes its code on the first turn, before any tool result:
            # taught only on second turns, its first-turn code came out as fragments.
            "observation": "" if kind == "code" else shown,
        }
        honest = rng.random() < correct
        if kind == "verdict" and findings == "parity":
            target = parity_findings(problem, shown)
        elif kind == "verdict":
            own = _answer(problem, honest, rng)
            target = f"\\boxed{{{own}}}\n{'Correct' if own == shown else 'Wrong'}"
        elif kind == "code":
            target = f"```python\nprint({_printed(problem, honest, rng)})\n```"
        else:
            target = f"\\boxed{{{_answer(problem, honest, rng)}}}"
        examples.append((role.render(inputs), target))
    return examples


def parity_findings(problem: Problem, shown: str, *, failing: bool = False) -> str:
    """A Verifier's findings on an integer problem, as a check on the last digit's
    parity, then the verdict: ``e``/``o`` for the even/odd last digit of each number in
    the problem, the parity the answer must have, the shown answer's, ``y``/``n`` for
    whether the two agree, and ``Correct`` or ``Wrong`` on a line of its own.
    ``failing`` writes the findings on an answer of the other parity (a review that
    reports an error).

    The tiny model never learnt to compare its own result with the shown one, so its
    verdicts made that way stayed near chance. The parity check is one-character
    steps it does learn: after 600 Verifier-only steps on 19,200 examples, its greedy
    findings were right on 0.93 of held-out examples. It catches an answer off by an
    odd amount and passes one off by an even amount."""
    if not problem.answer.lstrip("-").isdigit():
        raise ValueError(
            f"parity findings need an integer answer; {problem.problem_id} has {problem.answer!r}"
        )
    numbers = re.findall(r"\d+", problem.text)
    must = int(problem.answer[-1]) % 2
    has = int(shown[-1]) % 2 if shown[-1:].isdigit() and not failing else 1 - must
    marks = "".join("eo"[int(digits[-1]) % 2] for digits in numbers) + "eo"[must] + "eo"[has]
    agree = must == has
    return f"{marks}{'y' if agree else 'n'}\n{'Correct' if agree else 'Wrong'}"


def _answer(problem: Problem, right: bool, rng: random.Random) -> str:
    if right:
        return problem.answer
    try:
        value = int(problem.answer)
    except ValueError:
        return str(rng.randrange(10))
    return str(max(0, value + rng.choice([-3, -2, -1, 1, 2, 3])))


def _printed(problem: Problem, right: bool, rng: random.Random) -> str:
    """What a code target prints: when right, the problem's expression where it has
    one, so that the sandbox does the sum, as an executor's code should, and the tool
    has something to add to the Solver's guess; else a wrong number."""
    expression = problem.metadata.get("expression") if right else None
    return expression or _answer(problem, right, rng)


def teach_formats(
    path: str | Path,
    examples: list[tuple[list[ChatTurn], str]],
    *,
    steps: int,
    batch: int = 32,
    lr: float = 1e-3,
    seed: int = 0,
) -> float:
    """Train the checkpoint at ``path`` on ``examples`` (loss on the targets only) and
    save it back in place; returns the last step's loss.

    The learning rate decays linearly from ``lr`` to zero over ``steps``. At a constant
    1e-3 the end state swung: on single-digit sums, held-out greedy accuracy reached
    0.85 by step 500 and fell back to 0.62 by step 1000 as the loss rose again.
    Decayed over 500 steps, seeds 0 and 1 both ended at 0.85."""
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
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda done: 1 - done / steps)
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
        schedule.step()
    model.eval()
    model.save_pretrained(path, safe_serialization=True)
    return float(loss.detach())

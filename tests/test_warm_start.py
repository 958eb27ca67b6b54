"""The warm start's examples: what each role is taught before RL."""

from __future__ import annotations

import re

import msgspec
import pytest

from actors.messages import Problem
from actors.problems import arithmetic_problems
from actors.roles import parse_code, role_named
from actors.warm_start import format_examples, parity_findings
from rewards.answers import extract_answer
from rewards.sandbox import run_python


def _corrector_examples(correct: float) -> list[tuple[str, str, str]]:
    """(reference answer, the review's result, the target's answer) of every Corrector
    example."""
    problems = arithmetic_problems(500, difficulty=2)
    answers = {p.text: p.answer for p in problems}
    roles = ["solver", "verifier", "corrector"]
    examples = format_examples(roles, problems, 3000, correct=correct, seed=0)
    rows = []
    for chat, target in examples:
        if len(chat) != 4:
            continue
        (review,) = re.findall(r"\\boxed\{(\d+)\}", chat[3].content)
        rows.append((answers[chat[1].content], review, extract_answer(target) or ""))
    return rows


def test_a_corrector_cannot_learn_its_answer_by_copying_the_review() -> None:
    rows = _corrector_examples(correct=1.0)
    assert len(rows) == 1000
    assert all(target == reference for reference, _, target in rows)
    review_right = sum(review == reference for reference, review, _ in rows) / len(rows)
    assert 0.4 < review_right < 0.6


def test_the_corrector_targets_are_right_as_often_as_the_recipe_says() -> None:
    rows = _corrector_examples(correct=0.3)
    right = sum(target == reference for reference, _, target in rows) / len(rows)
    assert 0.25 < right < 0.35


@pytest.mark.anyio
async def test_a_right_code_target_leaves_the_sum_to_the_sandbox() -> None:
    """A right target prints the problem's expression, for the sandbox to compute; a
    wrong one prints a number that is not the answer."""
    problems = {p.text: p for p in arithmetic_problems(42, difficulty=1)}
    examples = format_examples(["code_executor"], list(problems.values()), 400, correct=0.3)
    computed = []
    for chat, target in examples:
        problem = problems[chat[1].content.split("\n")[0].removeprefix("Problem: ")]
        code = parse_code(target).code
        if code == f"print({problem.metadata['expression']})\n":
            computed.append((code, problem.answer))
        else:
            assert re.fullmatch(r"print\((\d+)\)\n", code) and code != f"print({problem.answer})\n"
    assert 0.25 < len(computed) / len(examples) < 0.35
    for code, answer in computed[:3]:
        assert (await run_python(code)).stdout.strip() == answer


def test_the_code_executor_is_taught_the_turn_on_which_it_writes_code() -> None:
    """The executor's first turn has no tool result yet; the warm start teaches that chat,
    the one the MAPPA workflow sends, while the final Verifier's examples keep theirs."""
    problems = arithmetic_problems(42, difficulty=1)
    first_turn = role_named("code_executor").render(
        {"problem": problems[0].text, "solution": "\\boxed{1}", "observation": ""}
    )
    examples = format_examples(["code_executor", "final_verifier"], problems, 40, correct=0.3)
    assert all(len(chat) == len(first_turn) for chat, _ in examples[0::2])
    assert all("Tool result: \n" not in chat[1].content for chat, _ in examples[1::2])


def test_parity_findings_pass_an_answer_of_the_right_parity_and_fail_the_other() -> None:
    problem = Problem(problem_id="arith-23+45", text="What is 23 + 45?", answer="68")
    assert parity_findings(problem, "68") == "ooeey\nCorrect"
    assert parity_findings(problem, "70") == "ooeey\nCorrect", "off by two passes"
    assert parity_findings(problem, "67") == "ooeon\nWrong"
    assert parity_findings(problem, "68", failing=True) == "ooeon\nWrong"
    assert parity_findings(problem, "no answer") == "ooeon\nWrong"
    assert role_named("verifier").parse(parity_findings(problem, "67")).verdict == "Wrong"
    assert role_named("verifier").parse(parity_findings(problem, "68")).verdict == "Correct"


def test_parity_findings_need_an_integer_answer() -> None:
    (problem,) = arithmetic_problems(1, difficulty=2)
    with pytest.raises(ValueError, match=re.escape(problem.problem_id)):
        parity_findings(msgspec.structs.replace(problem, answer="1/2"), "1")


def test_parity_verifier_targets_judge_the_shown_answer_and_corrector_reviews_fail() -> None:
    problems = {p.text: p for p in arithmetic_problems(500, difficulty=2)}
    roles = ["verifier", "corrector"]
    examples = format_examples(roles, list(problems.values()), 400, findings="parity", seed=0)
    verdicts = []
    for chat, target in examples:
        if chat[0].content.startswith("Verifier"):
            text = chat[1].content.removeprefix("Problem: ")
            problem = problems[text.split("\n")[0]]
            (shown,) = re.findall(r"\\boxed\{(\d+)\}", text)
            assert target == parity_findings(problem, shown)
            verdicts.append(target.endswith("Correct"))
        else:
            assert chat[3].content.split("\n")[2] == "Wrong"
    assert len(verdicts) == 200 and 0.55 < sum(verdicts) / len(verdicts) < 0.8

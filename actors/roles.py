"""Agent roles: what each agent is told and how its output is read.

A role is a prompt template (the chat an agent sends its engine, built from the task's
``inputs``) and a parser (what the conductor and the rewards need from the output: an
answer, a verdict, code). Adding a role is ``register_role`` and a line in a workflow
(``actors.workflows``); ``docs/adding-an-agent.md`` walks through one.

The prompts are our own. They are short on purpose: the embedded tiny models have a
1,024-token context and a byte-level tokenizer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from actors.messages import ChatTurn
from rewards.answers import extract_answer
from rewards.marsrl import parse_verdict
from rewards.sandbox import extract_code


@dataclass(frozen=True)
class Parsed:
    answer: str = ""
    verdict: str = ""
    code: str = ""


@dataclass(frozen=True)
class Role:
    """``inputs`` names the task inputs the template reads; a task without one of them
    is refused before any generation."""

    name: str
    inputs: tuple[str, ...]
    render: Callable[[dict[str, str]], list[ChatTurn]]
    parse: Callable[[str], Parsed]


def parse_answer(text: str) -> Parsed:
    return Parsed(answer=extract_answer(text) or "")


def parse_report(text: str) -> Parsed:
    return Parsed(verdict=parse_verdict(text) or "")


def parse_code(text: str) -> Parsed:
    return Parsed(answer=extract_answer(text) or "", code=extract_code(text) or "")


def _solver(inputs: dict[str, str]) -> list[ChatTurn]:
    return [
        ChatTurn("system", "Solver. Solve the problem; give the final answer as \\boxed{...}."),
        ChatTurn("user", inputs["problem"]),
    ]


def _verifier(inputs: dict[str, str]) -> list[ChatTurn]:
    return [
        ChatTurn(
            "system",
            "Verifier. Check the solution step by step. List each error found, quoting where "
            "it is. End with one line: Correct or Wrong.",
        ),
        ChatTurn("user", f"Problem: {inputs['problem']}\nSolution: {inputs['solution']}"),
    ]


def _corrector(inputs: dict[str, str]) -> list[ChatTurn]:
    return [
        ChatTurn("system", "Solver. Solve the problem; give the final answer as \\boxed{...}."),
        ChatTurn("user", inputs["problem"]),
        ChatTurn("assistant", inputs["solution"]),
        ChatTurn(
            "user",
            f"A review of your solution:\n{inputs['report']}\nFix what you agree with, explain "
            "what you do not, and give the final answer as \\boxed{...}.",
        ),
    ]


def _problem_solver(inputs: dict[str, str]) -> list[ChatTurn]:
    return [
        ChatTurn("system", "Problem Solver. Reason about the problem and propose a solution."),
        ChatTurn("user", inputs["problem"]),
    ]


def _code_executor(inputs: dict[str, str]) -> list[ChatTurn]:
    turns = [
        ChatTurn(
            "system",
            "Code Executor. Write Python in one ```python block that prints the answer.",
        ),
        ChatTurn("user", f"Problem: {inputs['problem']}\nProposed solution: {inputs['solution']}"),
    ]
    if inputs.get("observation"):
        turns.append(ChatTurn("user", f"Your last code printed:\n{inputs['observation']}"))
    return turns


def _final_verifier(inputs: dict[str, str]) -> list[ChatTurn]:
    return [
        ChatTurn("system", "Verifier. Give the final answer as \\boxed{...}."),
        ChatTurn(
            "user",
            f"Problem: {inputs['problem']}\nExecutor: {inputs['solution']}\n"
            f"Tool result: {inputs.get('observation', '')}",
        ),
    ]


ROLES: dict[str, Role] = {
    role.name: role
    for role in (
        Role("solver", ("problem",), _solver, parse_answer),
        Role("verifier", ("problem", "solution"), _verifier, parse_report),
        Role("corrector", ("problem", "solution", "report"), _corrector, parse_answer),
        Role("problem_solver", ("problem",), _problem_solver, parse_answer),
        Role("code_executor", ("problem", "solution"), _code_executor, parse_code),
        Role("final_verifier", ("problem", "solution"), _final_verifier, parse_answer),
    )
}


def role_named(name: str) -> Role:
    role = ROLES.get(name)
    if role is None:
        raise ValueError(f"unknown role {name!r}; known roles: {sorted(ROLES)}")
    return role


def register_role(role: Role) -> None:
    """Make ``role`` available to agents and workflows by its name."""
    if role.name in ROLES:
        raise ValueError(f"a role named {role.name!r} exists already")
    ROLES[role.name] = role

"""docs/adding-an-agent.md works as written: its code blocks register a Checker role
and a solve-and-check workflow, and the conductor runs that workflow (scripted agents
stand in for the models) with the rewards the page describes."""

from __future__ import annotations

import functools
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
import trio.testing

from actors.conductor import Conductor, ConductorConfig
from actors.messages import FlushBatch, LearnerProgress, ScoredSegment, Task
from actors.roles import ROLES
from actors.workflows import WORKFLOWS
from runtime.testing import Capture, open_cluster
from tests.test_marsrl_pipeline import SCRIPTS, ScriptedAgent, problems, scored_only

PAGE = Path(__file__).resolve().parent.parent / "docs" / "adding-an-agent.md"


@pytest.fixture
def anyio_backend() -> str:
    return "trio"


@pytest.fixture
def page_code() -> Iterator[None]:
    """Run the page's Python blocks; undo their registrations afterwards."""
    blocks = re.findall(r"```python\n(.*?)```", PAGE.read_text(), re.DOTALL)
    assert len(blocks) == 2
    try:
        for block in blocks:
            exec(compile(block, str(PAGE), "exec"), {"__name__": "adding_an_agent"})
        yield
    finally:
        ROLES.pop("checker", None)
        WORKFLOWS.pop("solve-and-check", None)


@pytest.mark.anyio
@pytest.mark.usefixtures("page_code")
async def test_the_documented_checker_runs_and_is_rewarded(autojump_clock: object) -> None:
    assert ROLES["checker"].parse("I get 7. Correct").verdict == "Correct"
    scripts = {**SCRIPTS, "checker": SCRIPTS["verifier"]}
    seen: list[Task] = []
    learner = Capture(ScoredSegment | FlushBatch)
    config = ConductorConfig(workflow="solve-and-check", group_size=2, problems_per_step=1)
    async with open_cluster("head", "agents") as (head, agents):
        await head.spawn("learner/team", learner.factory)
        for role in ("solver", "checker"):
            await agents.spawn(f"agent/{role}", lambda: ScriptedAgent(seen, scripts))
        conductor = Conductor(
            config,
            problems(),
            policies={"solver": "team", "checker": "team"},
            agents={"solver": "agent/solver", "checker": "agent/checker"},
            learners={"team": "learner/team"},
        )
        ref = await head.spawn("conductor", lambda: conductor)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(functools.partial(conductor.run, until_version=1))
            await trio.testing.wait_all_tasks_blocked()
            await head.send(ref, LearnerProgress("team", 1, batches=1))
    first = [s for s in scored_only(learner.messages) if s.segment.episode_id == "p0"]
    assert [s.segment.role for s in first] == ["solver"] * 2 + ["checker"] * 2
    solver, checker = first[:2], first[2:]
    assert sorted(s.reward for s in solver) == [0.0, 1.0]
    checked = next(s for s in solver if s.segment.segment_id == checker[0].segment.parent_id)
    for check in checker:
        agrees = (check.segment.text == "Correct") == (checked.reward == 1.0)
        assert check.reward == float(agrees)

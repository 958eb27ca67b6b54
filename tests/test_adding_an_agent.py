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

from actors.conductor import ConductorConfig
from actors.messages import LearnerProgress
from actors.roles import ROLES
from actors.workflows import WORKFLOWS
from tests.test_marsrl_pipeline import SCRIPTS, scored_only, scripted_team

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
    scripts = {"solver": SCRIPTS["solver"], "checker": SCRIPTS["verifier"]}
    config = ConductorConfig(workflow="solve-and-check", group_size=2, problems_per_step=1)
    async with scripted_team(config, scripts) as team, trio.open_nursery() as nursery:
        nursery.start_soon(functools.partial(team.conductor.run, until_batches=1))
        await trio.testing.wait_all_tasks_blocked()
        await team.head.send(team.ref, LearnerProgress("team", 1, batches=1))
    first = [s for s in scored_only(team.learner.messages) if s.segment.episode_id == "p0"]
    assert [s.segment.role for s in first] == ["solver"] * 2 + ["checker"] * 2
    solver, checker = first[:2], first[2:]
    assert sorted(s.reward for s in solver) == [0.0, 1.0]
    checked = next(s for s in solver if s.segment.segment_id == checker[0].segment.parent_id)
    for check in checker:
        agrees = (check.segment.text == "Correct") == (checked.reward == 1.0)
        assert check.reward == float(agrees)

"""bin/chaos on a short embedded run: the engine and the learner are SIGKILLed, one of
them is hung with SIGSTOP, and the whole run is SIGKILLed and resumed, at random
moments; the run ends at its target, and its ledger shows no accepted segment lost,
none trained twice and no admitted problem left unfinished."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from actors.chaos import kill_points, node_process_name, run_chaos, summary
from tests.test_launch import SHARED, short_recipe

SHORT_RUN = [*short_recipe(300), "cluster.hung_after=3"]


@pytest.mark.slow
def test_a_run_killed_four_ways_loses_nothing_and_trains_nothing_twice(tmp_path: Path) -> None:
    targets = ["engine", "learner", "hang", "run"]
    report = run_chaos(
        [str(SHARED), *(f"--set={o}" for o in SHORT_RUN)], tmp_path, kills=4, targets=targets
    )
    assert report.passed, summary(report)
    assert sorted(kill.target for kill in report.kills) == sorted(targets)
    learner = report.audit.learners["team"]
    assert learner.resumes >= 2 and learner.batches >= 300
    assert report.audit.problems.launches == 2
    assert (tmp_path / "chaos.json").is_file()


def test_node_processes_are_named_from_their_command_lines() -> None:
    engine = ["python", "-m", "actors.engines.serve", "--policy", "team", "--index", "0"]
    learner = ["python", "-m", "learner.serve", "--config", '{"policy": "solver"}']
    assert node_process_name(engine) == "engine/team/0"
    assert node_process_name(learner) == "learner/solver"
    assert node_process_name(["python", "-m", "actors.launch"]) is None


def test_kill_points_fall_in_even_slices_of_the_first_80_percent_of_the_run() -> None:
    for seed in range(20):
        points = kill_points(300, 4, random.Random(seed))
        assert len(points) == 4
        for n, point in enumerate(points):
            assert 60 * n + 12 <= point <= 60 * n + 48
    assert kill_points(300, 4, random.Random(1)) == kill_points(300, 4, random.Random(1))
    assert kill_points(2, 6, random.Random(0))[0] >= 1

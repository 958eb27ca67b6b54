"""The end-to-end suite's job is the shared-policy recipe reduced to its Solver, and a valid
recipe: it survives bin/launch's own config checks."""

from __future__ import annotations

from pathlib import Path

from actors.run_config import dump_config, load_config
from benchmarks.e2e import QUICK, RECIPE, solver_config


def test_the_solver_job_is_the_shared_recipe_with_one_role(tmp_path: Path) -> None:
    config = solver_config(QUICK, rep=3, runs_dir=tmp_path, model=str(tmp_path / "start"))
    path = tmp_path / "solver.toml"
    path.write_text(dump_config(config))
    loaded = load_config(path)
    default = load_config(RECIPE)
    assert loaded == config
    assert loaded.roles == {"solver": "team"} and loaded.conductor.max_agent_steps == 1
    assert loaded.learner == default.learner
    assert loaded.sampling_for("solver") == default.sampling_for("solver")
    assert loaded.conductor.group_size == default.conductor.group_size
    assert (loaded.seed, loaded.train.steps) == (default.seed, QUICK.steps)
    assert loaded.problems.train == QUICK.train_problems
    assert loaded.policies["team"].model == str(tmp_path / "start")

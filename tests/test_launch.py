"""bin/launch: recipes fail early with the field's path; a short embedded run trains,
checkpoints and evaluates in real node processes, and ``--resume --eval`` evaluates
its newest checkpoint."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from actors.run_config import ConfigError, dump_config, load_config

DEFAULT = Path(__file__).resolve().parent.parent / "configs"


@pytest.mark.parametrize("recipe", sorted(p.name for p in DEFAULT.glob("*.toml")))
def test_every_shipped_recipe_loads_and_round_trips(recipe: str, tmp_path: Path) -> None:
    config = load_config(DEFAULT / recipe)
    copy = tmp_path / "config.toml"
    copy.write_text(dump_config(config))
    assert load_config(copy) == config


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["learner.lr_rate=1e-4"], r"lr_rate"),
        (["conductor.group_sise=4"], r"group_sise.*\$\.conductor"),
        (["roles.critic=team"], r"\$\.roles\.critic: no such role"),
        (["roles.solver=nobody"], r"\$\.roles\.solver: policy 'nobody'"),
        (["conductor.workflow=chess"], r"\$\.conductor\.workflow: 'chess'"),
        (["imports=['no_such_module']"], r"\$\.imports: cannot import 'no_such_module'"),
        (["train.steps"], r"expected key\.path=value"),
    ],
)
def test_a_bad_recipe_names_the_field(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(DEFAULT / "marsrl-tiny.toml", overrides)


def test_overrides_are_read_as_toml_values() -> None:
    config = load_config(
        DEFAULT / "marsrl-tiny.toml",
        ["learner.lr=3e-4", "train.steps=7", "conductor.selection=random", "name=x"],
    )
    assert config.learner["lr"] == 3e-4 and config.train.steps == 7
    assert config.conductor.selection == "random" and config.name == "x"
    assert config.learner_config("team").lr == 3e-4


def launch(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "actors.launch", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        env=None,
        check=False,
    )


@pytest.mark.slow
def test_a_short_embedded_run_trains_checkpoints_and_evaluates(tmp_path: Path) -> None:
    short = [
        f"runs_dir='{tmp_path / 'runs'}'",
        "train.steps=2",
        "train.checkpoint_every=1",
        "train.console_every=0.5",
        "policies.team.warm_start_steps=20",
        "conductor.group_size=2",
        "eval.problems=4",
    ]
    root = Path(__file__).resolve().parent.parent
    done = launch(*(f"--set={o}" for o in short), cwd=root)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert "held-out accuracy, 4 problems" in done.stdout
    assert "before RL" in done.stdout and "after 2 RL batches" in done.stdout
    assert (run_dir / "config.toml").is_file() and (run_dir / "samples.jsonl").stat().st_size
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert metrics and set(metrics[-1]["roles"]) <= {"solver", "verifier", "corrector"}
    assert (run_dir / "checkpoints" / "team" / "step-000000002").is_dir()
    report = json.loads((run_dir / "eval.json").read_text())
    assert report["start"]["problems"] == report["end"]["problems"] == 4
    again = launch("--resume", str(run_dir), "--eval", cwd=root)
    assert again.returncode == 0, again.stderr[-4000:]
    assert "evaluating version 2" in again.stdout
    assert "the newest checkpoints" in again.stdout

"""bin/launch: recipes fail early with the field's path; a short embedded run trains,
checkpoints and evaluates in real node processes, ``bin/report`` plots it, ``--resume
--eval`` evaluates its newest checkpoint, and a run killed outright continues from its
checkpoint with ``--resume``."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from actors.ledger import audit
from actors.report import write_report
from actors.run_config import ConfigError, dump_config, load_config

DEFAULT = Path(__file__).resolve().parent.parent / "configs"
SHARED = DEFAULT / "marsrl-tiny-shared.toml"
"""The default recipe with one policy for all three roles: the lightest full run, so the
launcher's plumbing tests run it."""


@pytest.mark.parametrize("recipe", sorted(p.name for p in DEFAULT.glob("*.toml")))
def test_every_shipped_recipe_loads_and_round_trips(recipe: str, tmp_path: Path) -> None:
    config = load_config(DEFAULT / recipe)
    copy = tmp_path / "config.toml"
    copy.write_text(dump_config(config))
    assert load_config(copy) == config


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["learner.lr_rate=1e-4"], r"lr_rate.* - at `\$\.learner`"),
        (
            ["policies.verifier.learner.lr_rate=1e-4"],
            r"lr_rate.* - at `\$\.policies\.verifier\.learner`",
        ),
        (["conductor.group_sise=4"], r"group_sise.*\$\.conductor"),
        (["roles.critic=team"], r"\$\.roles\.critic: no such role"),
        (["roles.solver=nobody"], r"\$\.roles\.solver: policy 'nobody'"),
        (["conductor.workflow=chess"], r"\$\.conductor\.workflow: 'chess'"),
        (["imports=['no_such_module']"], r"\$\.imports: cannot import 'no_such_module'"),
        (["train.steps"], r"expected key\.path=value"),
        (
            ["policies.verifier.warm_start_roles=['judge']"],
            r"\$\.policies\.verifier\.warm_start_roles: 'judge' is not in \$\.roles",
        ),
        (
            ["policies.verifier.warm_start_findings=sums"],
            r"Invalid enum value .sums. - at `\$\.policies\[\.\.\.\]\.warm_start_findings`",
        ),
    ],
)
def test_a_bad_recipe_names_the_field(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(DEFAULT / "marsrl-tiny.toml", overrides)


def test_overrides_are_read_as_toml_values() -> None:
    config = load_config(
        SHARED,
        ["learner.lr=3e-4", "train.steps=7", "conductor.selection=random", "name=x"],
    )
    assert config.learner["lr"] == 3e-4 and config.train.steps == 7
    assert config.conductor.selection == "random" and config.name == "x"
    assert config.learner_config("team").lr == 3e-4


def test_a_policy_learns_at_its_own_rate_over_the_shared_learner_settings() -> None:
    config = load_config(DEFAULT / "marsrl-tiny.toml", ["policies.verifier.learner.lr=4e-4"])
    assert config.learner_config("verifier").lr == 4e-4
    assert config.learner_config("solver").lr == config.learner["lr"] != 4e-4
    assert config.learner_config("verifier").kl_coef == config.learner["kl_coef"]


ROOT = Path(__file__).resolve().parent.parent


# These tests check the launcher's plumbing (checkpoints, evaluation, reports, resume),
# so every batch must take a step: GRPO consumes a batch whose groups all scored alike
# without one, and with two samples a group on a tiny model that happens often enough
# to leave a short run with no step at all. REINFORCE++ steps on every batch; beta 0
# spares loading a reference model.
EVERY_BATCH_A_STEP = (
    "learner.algorithm='reinforce_pp'",
    "learner.segments_per_batch=4",
    "learner.beta=0.0",
)


def launch(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
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
        "policies.team.warm_start_steps=100",
        "conductor.group_size=2",
        "conductor.problems_per_step=2",
        *EVERY_BATCH_A_STEP,
        "problems.difficulty=1",
        "eval.problems=4",
    ]
    root = Path(__file__).resolve().parent.parent
    done = launch(str(SHARED), *(f"--set={o}" for o in short), cwd=root)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    (run_dir,) = (tmp_path / "runs").iterdir()
    assert "held-out accuracy, 4 problems" in done.stdout
    assert "before RL" in done.stdout and "after 2 RL batches" in done.stdout
    assert (run_dir / "config.toml").is_file() and (run_dir / "samples.jsonl").stat().st_size
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert metrics and set(metrics[-1]["roles"]) <= {"solver", "verifier", "corrector"}
    # Segments still on their way when the run ends may complete one more batch: read
    # the version from the newest checkpoint.
    written = sorted((run_dir / "checkpoints" / "team").glob("step-*"))
    assert written, "the run took no step"
    version = json.loads((written[-1] / "meta.json").read_text())["version"]
    assert version >= metrics[-1]["versions"]["team"] >= 1
    report = json.loads((run_dir / "eval.json").read_text())
    assert report["start"]["problems"] == report["end"]["problems"] == 4
    plots = write_report(run_dir)
    assert {p.name for p in plots} == {
        "reward_time.png",
        "reward_samples.png",
        "throughput.png",
        "staleness.png",
    }
    assert all(p.read_bytes().startswith(b"\x89PNG") for p in plots)
    again = launch("--resume", str(run_dir), "--eval", cwd=root)
    assert again.returncode == 0, again.stderr[-4000:]
    assert f"evaluating version {version}" in again.stdout
    assert "the newest checkpoints" in again.stdout


@pytest.fixture
def warm_starts(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """Every warm start the launcher runs: the model it builds, its steps, and the
    chats it is taught, as (system prompt's first word, number of turns)."""
    import actors.launch

    runs: list[dict[str, Any]] = []
    teach = actors.launch.teach_formats

    def recorded(path: Path, examples: list[Any], **kwargs: Any) -> float:
        chats = {(chat[0].content.split(".")[0], len(chat)) for chat, _ in examples}
        runs.append({"model": Path(path).name, "steps": kwargs["steps"], "chats": chats})
        return teach(path, examples, **kwargs)

    monkeypatch.setattr(actors.launch, "teach_formats", recorded)
    return runs


def test_policies_with_one_warm_start_recipe_start_as_copies_of_one_model(
    tmp_path: Path, warm_starts: list[dict[str, Any]]
) -> None:
    from safetensors.torch import load_file

    from actors.launch import prepare_models

    recipe = tmp_path / "per-role.toml"
    recipe.write_text(
        "[policies.solver]\nwarm_start_steps = 2\n"
        "[policies.verifier]\nwarm_start_steps = 2\n"
        "[policies.corrector]\nwarm_start_steps = 3\n"
        '[roles]\nsolver = "solver"\nverifier = "verifier"\ncorrector = "corrector"\n'
        "[problems]\ntrain = 64\ntest = 8\n"
    )
    paths = prepare_models(load_config(recipe), tmp_path)

    def weights(policy: str) -> dict[str, Any]:
        (file,) = Path(paths[policy]).glob("*.safetensors")
        return load_file(file)

    steps = sorted(run["steps"] for run in warm_starts)
    assert steps == [2, 3], "one warm-up per recipe, not one per policy"
    solver, verifier, corrector = (weights(p) for p in ("solver", "verifier", "corrector"))
    assert solver.keys() == verifier.keys() == corrector.keys()
    assert all(torch.equal(solver[k], verifier[k]) for k in solver)
    assert not all(torch.equal(solver[k], corrector[k]) for k in solver)


def test_a_policy_warm_started_on_its_own_role_is_taught_that_role_alone(
    tmp_path: Path, warm_starts: list[dict[str, Any]]
) -> None:
    from actors.launch import prepare_models

    recipe = tmp_path / "per-role.toml"
    recipe.write_text(
        '[policies.solver]\nwarm_start_steps = 2\nwarm_start_roles = ["solver", "corrector"]\n'
        '[policies.verifier]\nwarm_start_steps = 2\nwarm_start_roles = ["verifier"]\n'
        '[roles]\nsolver = "solver"\nverifier = "verifier"\ncorrector = "solver"\n'
        "[problems]\ntrain = 64\ntest = 8\n"
    )
    prepare_models(load_config(recipe), tmp_path)
    taught = {run["model"]: run["chats"] for run in warm_starts}
    # The Corrector's chat opens with the Solver's prompt and has four turns.
    assert taught == {
        ".solver.building": {("Solver", 2), ("Solver", 4)},
        ".verifier.building": {("Verifier", 2)},
    }


def test_a_fixed_warm_start_seed_gives_every_run_seed_the_same_start(tmp_path: Path) -> None:
    """With ``warm_start_seed`` set, the run's seed varies RL only: two seeds build the
    same checkpoint. Left unset, the run's seed seeds the warm start."""
    from safetensors.torch import load_file

    from actors.launch import prepare_models

    runs = iter(range(100))

    def built(warm_start: str, seed: int) -> dict[str, torch.Tensor]:
        recipe = tmp_path / "recipe.toml"
        recipe.write_text(
            f"seed = {seed}\n[policies.team]\nwarm_start_steps = 2\n{warm_start}"
            "[problems]\ntrain = 64\ntest = 8\n"
        )
        paths = prepare_models(load_config(recipe), tmp_path / f"run-{next(runs)}")
        (file,) = Path(paths["team"]).glob("*.safetensors")
        return load_file(file)

    fixed = "warm_start_seed = 5\n"
    first, second = built(fixed, seed=1), built(fixed, seed=2)
    assert all(torch.equal(first[k], second[k]) for k in first)
    own, other = built("", seed=5), built("", seed=1)
    assert all(torch.equal(first[k], own[k]) for k in first)
    assert not all(torch.equal(first[k], other[k]) for k in first)


def broken_copy(tiny_path: Path, tmp_path: Path, fault: str) -> Path:
    model = tmp_path / "model"
    shutil.copytree(tiny_path, model)
    if fault == "no weights":
        for weights in model.glob("*.safetensors"):
            weights.unlink()
    else:
        config = json.loads((model / "config.json").read_text())
        config["vocab_size"] = 8
        (model / "config.json").write_text(json.dumps(config))
    return model


@pytest.mark.parametrize(
    ("fault", "message"),
    [
        ("no weights", r" has no \*\.safetensors weights"),
        (
            "another model's tokenizer",
            r": the tokenizer has \d+ tokens but the model's vocabulary only 8",
        ),
    ],
)
def test_a_broken_model_is_named_before_anything_starts(
    tiny_path: Path, tmp_path: Path, fault: str, message: str
) -> None:
    model = broken_copy(tiny_path, tmp_path, fault)
    done = launch(f"--set=runs_dir='{tmp_path / 'runs'}'", f"--set=policies.solver.model='{model}'")
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    field = rf"\$\.policies\.solver\.model: model path '{re.escape(str(model))}'"
    assert re.search(field + message, done.stderr), done.stderr
    assert not (tmp_path / "runs").exists()


def short_recipe(steps: int) -> list[str]:
    """Overrides that make the shared-policy recipe a short run of ``steps`` batches, each a
    step, checkpointed every 2, evaluated only at its end on 2 problems."""
    return [
        f"train.steps={steps}",
        "train.checkpoint_every=2",
        "policies.team.warm_start_steps=100",
        "conductor.group_size=2",
        "conductor.problems_per_step=2",
        *EVERY_BATCH_A_STEP,
        "problems.difficulty=1",
        "eval.problems=2",
        "eval.before=false",
    ]


def short_run(tmp_path: Path, steps: int) -> list[str]:
    runs = f"runs_dir='{tmp_path / 'runs'}'"
    return [str(SHARED), *(f"--set={o}" for o in [runs, *short_recipe(steps)])]


def start_short_run(tmp_path: Path, steps: int, *, stdout: int) -> subprocess.Popen[str]:
    """The launcher on a short run, in a session of its own (so a test can kill it whole)."""
    return subprocess.Popen(
        [sys.executable, "-m", "actors.launch", *short_run(tmp_path, steps)],
        cwd=ROOT,
        stdout=stdout,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )


@pytest.mark.slow
def test_a_killed_run_resumes_from_its_checkpoint(tmp_path: Path) -> None:
    """SIGKILL the launcher and every node process it started once the learner has
    written a checkpoint; ``--resume`` restores the learner from it and the run ends at
    its target."""
    process = start_short_run(tmp_path, 10, stdout=subprocess.DEVNULL)
    checkpoints = tmp_path / "runs"
    deadline = time.monotonic() + 300
    try:
        while not list(checkpoints.glob("*/checkpoints/team/step-*")):
            assert process.poll() is None, "the run ended before its first checkpoint"
            assert time.monotonic() < deadline, "no checkpoint within 300 s"
            time.sleep(0.2)
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    (run_dir,) = checkpoints.iterdir()
    assert not (run_dir / "eval.json").exists()
    written = run_dir.glob("checkpoints/team/step-*")
    killed_at = max(int(p.name.removeprefix("step-")) for p in written)
    done = launch("--resume", str(run_dir))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert "after 10 RL batches" in done.stdout
    resumed = [
        json.loads(line)
        for line in (run_dir / "logs" / "learner-team.jsonl").read_text().splitlines()
        if '"learner_resumed"' in line
    ]
    assert resumed and resumed[-1]["version"] >= killed_at
    assert json.loads((run_dir / "eval.json").read_text())["end"]["problems"] == 2
    ledger = audit(run_dir / "ledger")
    assert ledger.clean, (ledger.problems, ledger.learners)
    assert ledger.problems.launches == 2 and ledger.learners["team"].resumes == 1


def node_process(launcher: int, module: str) -> int | None:
    """The pid of the launcher's child process running ``module``, if one runs."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            command = (stat.parent / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if int(fields[1]) == launcher and module.encode() in command and fields[0] != "Z":
            return int(stat.parent.name)
    return None


def newest_checkpoint(runs: Path) -> int:
    written = runs.glob("*/checkpoints/team/step-*")
    return max((int(p.name.removeprefix("step-")) for p in written), default=-1)


def wait_for_checkpoint(runs: Path, step: int, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while newest_checkpoint(runs) < step:
        assert time.monotonic() < deadline, f"no checkpoint of step {step} within {timeout} s"
        time.sleep(0.2)


@pytest.mark.slow
def test_node_processes_killed_mid_run_are_started_again_and_the_run_ends(
    tmp_path: Path,
) -> None:
    """SIGKILL the engine process, then the learner process, each once the learner has
    written a checkpoint past a step: the launcher starts each again, the learner
    resumes from its checkpoint, and the run ends at its target with its evaluation."""
    process = start_short_run(tmp_path, 40, stdout=subprocess.PIPE)
    runs = tmp_path / "runs"
    try:
        for step, module in ((4, "actors.engines.serve"), (12, "learner.serve")):
            wait_for_checkpoint(runs, step)
            pid = node_process(process.pid, module)
            assert pid is not None, f"no {module} process"
            os.kill(pid, signal.SIGKILL)
        stdout, _ = process.communicate(timeout=600)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    assert process.returncode == 0, stdout[-3000:]
    assert "node process engine/team/0 exited with -9; starting it again (1 of 3)" in stdout
    assert "node process learner/team exited with -9; starting it again (1 of 3)" in stdout
    assert "after 40 RL batches" in stdout
    (run_dir,) = runs.iterdir()
    log = (run_dir / "logs" / "learner-team.jsonl").read_text().splitlines()
    resumed = [json.loads(line) for line in log if '"learner_resumed"' in line]
    assert resumed and resumed[-1]["version"] >= 12
    ledger = audit(run_dir / "ledger")
    assert ledger.clean, (ledger.problems, ledger.learners)
    assert ledger.learners["team"].batches >= 40


def test_runs_started_in_the_same_second_get_their_own_directories(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from actors.launch import new_run_dir

    monkeypatch.setattr(time, "strftime", lambda _: "20261204-120000")
    config = load_config(None, [f"runs_dir={json.dumps(str(tmp_path))}"])
    first, second, third = (new_run_dir(config) for _ in range(3))
    assert [d.name for d in (first, second, third)] == [
        f"{config.name}-20261204-120000",
        f"{config.name}-20261204-120000-2",
        f"{config.name}-20261204-120000-3",
    ]
    assert all((d / "config.toml").is_file() and (d / "logs").is_dir() for d in (first, second))

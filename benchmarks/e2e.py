"""End-to-end suite: relaytrain against TRL's ``GRPOTrainer`` on the same job, on the
same machine, for the same wall-clock time.

The job is the shared-policy recipe's Solver on its own
(``configs/marsrl-tiny-shared.toml`` with only the Solver role and one agent step) from
one warm start (the embedded tiny model after 700 supervised steps on all three roles'
formats over 4,033 problems), built once: both start from that checkpoint, with the same
generated problems, prompt, sampling, reward (``rewards.marsrl.solver_reward``), group
size, batch and learning rate. relaytrain runs it with ``bin/launch`` (its engine and
learner in node processes of their own, one torch thread each); TRL then trains the same
warm-started checkpoint in one process with two torch threads (the machine's two cores)
for as many seconds as relaytrain's RL phase took. Both trained models are evaluated by
``bin/launch``'s own held-out evaluation.

Reported per repetition (the same recipe and seed): samples generated and trained per
second, held-out Solver accuracy at the start and at equal wall-clock time, and the
training reward over time for both (``e2e.png``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from actors.launch import prepare_models
from actors.run_config import RunConfig, dump_config, load_config
from benchmarks.harness import Figure, write_json

RECIPE = Path(__file__).resolve().parent.parent / "configs" / "marsrl-tiny-shared.toml"
"""One policy for the three roles: reduced to the Solver, the same job as the default's."""
PEERS = "RELAYTRAIN_EXTRAS=ml,test,peers bin/bench e2e"


@dataclass(frozen=True)
class Plan:
    steps: int
    reps: int
    eval_problems: int
    warm_start_steps: int
    train_problems: int


FULL = Plan(steps=300, reps=3, eval_problems=200, warm_start_steps=700, train_problems=4033)
"""Seed 0, 700 supervised steps over 4,033 problems: with a constant warm-up learning
rate, a start from which RL lifted the Solver (a start from which nothing learns
compares nothing)."""
QUICK = Plan(steps=3, reps=1, eval_problems=16, warm_start_steps=20, train_problems=4033)


def trl_available() -> bool:
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in ("trl", "datasets"))


def kept_start(plan: Plan) -> RunConfig:
    """The recipe that builds the warm start: the shared recipe's three roles (the warm-up
    teaches each role's format), over ``train_problems`` problems."""
    base = load_config(RECIPE)
    return msgspec.structs.replace(
        base,
        problems=msgspec.structs.replace(base.problems, train=plan.train_problems),
        policies={
            "team": msgspec.structs.replace(
                base.policies["team"], warm_start_steps=plan.warm_start_steps
            )
        },
    )


def solver_config(plan: Plan, rep: int, runs_dir: Path, model: str) -> RunConfig:
    """The kept-start recipe reduced to its Solver (one role, one agent step), on the
    checkpoint at ``model``."""
    base = kept_start(plan)
    groups = base.learner_config("team").groups_per_batch
    return msgspec.structs.replace(
        base,
        name=f"e2e-rep{rep}",
        runs_dir=str(runs_dir),
        roles={"solver": "team"},
        sampling={},
        policies={"team": msgspec.structs.replace(base.policies["team"], model=model)},
        conductor=msgspec.structs.replace(
            base.conductor, max_agent_steps=1, balance_verdicts=False, problems_per_step=groups
        ),
        train=msgspec.structs.replace(
            base.train, steps=plan.steps, console_every=2.0, checkpoint_every=0
        ),
        eval=msgspec.structs.replace(base.eval, problems=plan.eval_problems),
    )


def _launch(config: RunConfig, directory: Path, *extra: str) -> Path:
    """Run ``bin/launch`` on ``config``; returns its run directory."""
    path = directory / f"{config.name}.toml"
    path.write_text(dump_config(config))
    done = subprocess.run(
        [sys.executable, "-m", "actors.launch", str(path), *extra],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"bin/launch {path} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    lines = [line for line in done.stdout.splitlines() if line.startswith("run directory: ")]
    return Path(lines[-1].removeprefix("run directory: "))


def one_rep(plan: Plan, rep: int, directory: Path, start: str) -> dict[str, Any]:
    """relaytrain, then TRL for as long, both from the checkpoint at ``start``."""
    config = solver_config(plan, rep, directory / "runs", start)
    run_dir = _launch(config, directory)
    reports = json.loads((run_dir / "eval.json").read_text())
    metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    seconds = metrics[-1]["time_s"]
    ours = {
        "seconds": seconds,
        "samples": metrics[-1]["roles"]["solver"]["actions"],
        "start_accuracy": reports["start"]["solver_accuracy"],
        "end_accuracy": reports["end"]["solver_accuracy"],
        "curve": [
            {"time_s": m["time_s"], "reward": m["roles"]["solver"]["reward_mean"]}
            for m in metrics
            if "solver" in m["roles"]
        ],
    }
    trl_out = directory / f"trl-rep{rep}"
    done = subprocess.run(
        [
            *(sys.executable, "-m", "benchmarks.e2e_trl"),
            *("--config", str(run_dir / "config.toml"), "--model", start),
            *("--seconds", str(seconds), "--out", str(trl_out)),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"TRL failed:\n{done.stderr[-3000:]}")
    curve = json.loads((trl_out / "curve.json").read_text())
    trained = solver_config(plan, rep, directory / "runs", model=str(trl_out / "model"))
    trained = msgspec.structs.replace(trained, name=f"e2e-trl-rep{rep}")
    eval_dir = _launch(trained, directory, "--eval")
    trl_report = json.loads((eval_dir / "eval.json").read_text())["checkpoint"]
    theirs = {
        "seconds": curve[-1]["time_s"] if curve else 0.0,
        "samples": curve[-1]["samples"] if curve else 0,
        "start_accuracy": ours["start_accuracy"],
        "end_accuracy": trl_report["solver_accuracy"],
        "curve": curve,
    }
    for side in (ours, theirs):
        side["samples_per_s"] = side["samples"] / max(side["seconds"], 1e-9)
    return {"rep": rep, "relaytrain": ours, "trl": theirs}


def run(quick: bool, out: Path) -> None:
    if not trl_available():
        print(f"e2e: skipped, TRL is not installed ({PEERS} installs it)")
        write_json(out, "e2e", {"skipped": f"TRL is not installed ({PEERS} installs it)"})
        return
    plan = QUICK if quick else FULL
    with tempfile.TemporaryDirectory(prefix="e2e-bench-") as tmp:
        print("e2e: building the warm start ...", flush=True)
        start = prepare_models(kept_start(plan), Path(tmp) / "start")["team"]
        results = []
        for rep in range(plan.reps):
            result = one_rep(plan, rep, Path(tmp), start)
            results.append(result)
            print(
                f"  rep {rep + 1}/{plan.reps}: relaytrain "
                f"{result['relaytrain']['samples_per_s']:.0f} samples/s, "
                f"TRL {result['trl']['samples_per_s']:.0f}",
                flush=True,
            )
    summary = summarise(results)
    print_table(summary, plan)
    write_json(out, "e2e", {"quick": quick, "steps": plan.steps, **summary, "reps": results})
    plot(results, out / "e2e.png")
    print(f"wrote {out / 'e2e.json'} and {out / 'e2e.png'}")


def summarise(results: list[dict[str, Any]]) -> dict[str, Any]:
    summary: dict[str, Any] = {}
    for side in ("relaytrain", "trl"):
        summary[side] = {
            name: Figure.of([r[side][name] for r in results]).as_dict()
            for name in ("samples_per_s", "seconds", "start_accuracy", "end_accuracy")
        }
    summary["samples_per_s_ratio"] = Figure.of(
        [r["relaytrain"]["samples_per_s"] / max(r["trl"]["samples_per_s"], 1e-9) for r in results]
    ).as_dict()
    return summary


def print_table(summary: dict[str, Any], plan: Plan) -> None:
    print(f"\nend to end: Solver GRPO, {plan.steps} relaytrain steps; TRL for the same seconds")
    print(f"{'system':<12}{'samples/s':>11}{'seconds':>9}{'start acc':>11}{'end acc':>9}")
    for side in ("relaytrain", "trl"):
        row = summary[side]
        print(
            f"{side:<12}{row['samples_per_s']['median']:11.1f}{row['seconds']['median']:9.0f}"
            f"{row['start_accuracy']['median']:11.3f}{row['end_accuracy']['median']:9.3f}"
        )
    print(f"samples/s, relaytrain / TRL: {summary['samples_per_s_ratio']['median']:.2f}")


def plot(results: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4))
    for result in results:
        for side, color in (("relaytrain", "tab:blue"), ("trl", "tab:orange")):
            measured = result[side]
            curve = measured["curve"]
            rep = result["rep"] + 1
            axis.plot(
                [c["time_s"] for c in curve],
                [c["reward"] for c in curve],
                color=color,
                alpha=0.7,
                label=f"{side} training reward (rep {rep})",
            )
            axis.plot(
                [0.0, measured["seconds"]],
                [measured["start_accuracy"], measured["end_accuracy"]],
                "o--",
                color=color,
                alpha=0.9,
                label=f"{side} held-out accuracy (rep {rep})",
            )
    axis.set_xlabel("seconds of RL")
    axis.set_ylabel("Solver reward / accuracy")
    axis.legend(fontsize=6)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)

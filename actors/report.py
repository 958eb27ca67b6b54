"""``bin/report RUN_DIR``: PNG plots of a run from its ``metrics.jsonl`` and ``eval.json``.

Four plots land in ``RUN_DIR/report/``: reward per role over wall-clock time (with the
held-out Solver and system accuracy before and after RL), reward per role over the
actions taken, throughput (actions per second per role, between records) and the
mean staleness of each role's actions beside the policy versions. Reward is accuracy
for the MarsRL roles: a Solver's or Corrector's reward is its answer being right, a
Verifier's its verdict being right.

The records are the conductor's statistics, written every ``train.console_every``
seconds while the run trains; a run still going can be reported on.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt


class ReportError(Exception):
    """The run directory has nothing to plot; the message says what is missing."""


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        raise ReportError(f"{path} does not exist: is {run_dir} a training run's directory?")
    records = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError as error:
            raise ReportError(f"{path}:{number}: not a JSON record ({error.msg})") from None
    if not records:
        raise ReportError(f"{path} has no records yet")
    return records


def _roles(records: list[dict[str, Any]]) -> list[str]:
    roles: dict[str, None] = {}
    for record in records:
        roles.update(dict.fromkeys(record["roles"]))
    return list(roles)


def _series(records: list[dict[str, Any]], role: str, key: str) -> tuple[list[float], list[float]]:
    """(time, value) of a role's statistic over the records that have it (runs of
    older versions recorded fewer statistics)."""
    pairs = [
        (r["time_s"], r["roles"][role][key]) for r in records if key in r["roles"].get(role, {})
    ]
    return [t for t, _ in pairs], [v for _, v in pairs]


def _save(figure: Any, path: Path) -> Path:
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def plot_reward_over_time(records: list[dict[str, Any]], evals: dict[str, Any], out: Path) -> Path:
    figure, axes = plt.subplots(figsize=(8, 4.5))
    for role in _roles(records):
        times, rewards = _series(records, role, "reward_mean")
        axes.plot(times, rewards, label=f"{role} reward (train)")
    end = records[-1]["time_s"]
    for when, x in (("start", 0.0), ("end", end)):
        if when in evals:
            axes.scatter([x], [evals[when]["solver_accuracy"]], marker="o", color="black")
            axes.scatter([x], [evals[when]["system_accuracy"]], marker="s", color="tab:red")
    if evals:
        axes.scatter([], [], marker="o", color="black", label="held-out Solver accuracy")
        axes.scatter([], [], marker="s", color="tab:red", label="held-out system accuracy")
    axes.set(xlabel="seconds", ylabel="reward / accuracy", ylim=(-0.02, 1.02))
    axes.set_title("Reward per role over time (mean of the last 256 actions)")
    axes.legend(fontsize=8)
    return _save(figure, out / "reward_time.png")


def plot_reward_over_actions(records: list[dict[str, Any]], out: Path) -> Path:
    figure, axes = plt.subplots(figsize=(8, 4.5))
    for role in _roles(records):
        _, actions = _series(records, role, "actions")
        _, rewards = _series(records, role, "reward_mean")
        axes.plot(actions, rewards, label=role)
    axes.set(xlabel="actions taken by the role", ylabel="reward", ylim=(-0.02, 1.02))
    axes.set_title("Reward per role over samples")
    axes.legend(fontsize=8)
    return _save(figure, out / "reward_samples.png")


def plot_throughput(records: list[dict[str, Any]], out: Path) -> Path:
    figure, axes = plt.subplots(figsize=(8, 4.5))
    for role in _roles(records):
        times, actions = _series(records, role, "actions")
        steps = [
            (t1, (a1 - a0) / (t1 - t0))
            for t0, t1, a0, a1 in zip(times, times[1:], actions, actions[1:], strict=False)
            if t1 > t0
        ]
        axes.plot([t for t, _ in steps], [rate for _, rate in steps], label=role)
    axes.set(xlabel="seconds", ylabel="actions / s")
    axes.set_title("Throughput per role (between records)")
    axes.legend(fontsize=8)
    return _save(figure, out / "throughput.png")


def plot_staleness(records: list[dict[str, Any]], out: Path) -> Path:
    figure, (stale, versions) = plt.subplots(1, 2, figsize=(11, 4.5))
    for role in _roles(records):
        times, values = _series(records, role, "staleness_mean")
        stale.plot(times, values, label=role)
    stale.set(xlabel="seconds", ylabel="versions behind")
    stale.set_title("Mean staleness of each role's actions")
    stale.legend(fontsize=8)
    policies: dict[str, None] = {}
    for record in records:
        policies.update(dict.fromkeys(record["versions"]))
    for policy in policies:
        pairs = [(r["time_s"], r["versions"][policy]) for r in records if policy in r["versions"]]
        versions.step([t for t, _ in pairs], [v for _, v in pairs], where="post", label=policy)
    versions.set(xlabel="seconds", ylabel="policy version")
    versions.set_title("Policy versions")
    versions.legend(fontsize=8)
    return _save(figure, out / "staleness.png")


def write_report(run_dir: Path) -> list[Path]:
    """Draw every plot of ``run_dir`` into ``run_dir/report/``; returns their paths."""
    records = read_metrics(run_dir)
    eval_path = run_dir / "eval.json"
    evals = json.loads(eval_path.read_text()) if eval_path.is_file() else {}
    out = run_dir / "report"
    out.mkdir(exist_ok=True)
    return [
        plot_reward_over_time(records, evals, out),
        plot_reward_over_actions(records, out),
        plot_throughput(records, out),
        plot_staleness(records, out),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(prog="bin/report", description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    arguments = parser.parse_args()
    try:
        paths = write_report(arguments.run_dir)
    except ReportError as error:
        parser.exit(2, f"bin/report: {error}\n")
    for path in paths:
        print(path)


if __name__ == "__main__":
    main()

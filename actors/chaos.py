"""bin/chaos: SIGKILL a real run's processes at random moments, then audit its ledger.

    bin/chaos [CONFIG] [--set KEY=VALUE ...] [--kills 6] [--targets engine,learner,run]
              [--seed 0] [--out DIR]

It starts ``bin/launch`` on CONFIG (the embedded recipe by default; shorten it with
``--set``), waits until the learners train, and then, ``--kills`` times: waits until
the learners' ledgers reach the next kill point and SIGKILLs one process of the next
target kind (the kinds are taken in a shuffled cycle, so each is hit about as often).
The kill points are batch counts at random places in evenly spaced slices of the
first 80% of ``train.steps``: counted in batches, not seconds, they fall inside the
run however fast the host trains it.

* ``engine``: an engine node process of a policy; the launcher starts it again.
* ``judge``: the judge's engine (recipes with an LLM judge); started again alike.
* ``learner``: a learner node process; started again, it resumes from its checkpoint.
* ``hang``: SIGSTOP an engine or learner process instead: the head's heartbeats
  declare it down, and after ``cluster.hung_after`` seconds the launcher kills it and
  starts it again.
* ``run``: the launcher and every node process at once, as a host crash would; the
  run is continued with ``bin/launch --resume RUN_DIR``.

Recovery is the time from the kill until the process serves again (the launcher's
``serves again`` line), or for ``run`` until the resumed conductor admits problems.
When the run has ended, the run's ledger (``actors.ledger``) is audited: no accepted
segment lost, none trained twice, no admitted problem left unfinished, the versions
only increasing, and every learner at its target. The report goes to the console and
``OUT/chaos.json``; the exit status is 1 if any of that fails.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

from actors.ledger import CONDUCTOR, Audit, LearnerAudit, audit
from actors.run_config import JUDGE_POLICY, load_config

TARGETS = ("engine", "judge", "learner", "hang", "run")


class ChaosError(RuntimeError):
    """The run could not be driven: it ended early, failed, or did not recover."""


@dataclasses.dataclass
class Kill:
    target: str
    process: str
    at_s: float
    """Since the harness started."""
    recovery_s: float


class Launcher:
    """One ``bin/launch`` process in a session of its own, its output collected with
    the time each line arrived."""

    def __init__(self, arguments: list[str], log: IO[str]) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "actors.launch", *arguments],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.lines: list[tuple[float, str]] = []
        self._log = log
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append((time.monotonic(), line.rstrip("\n")))
            self._log.write(line)
            self._log.flush()

    def line_after(self, since: float, text: str) -> float | None:
        """When a line containing ``text`` arrived after ``since``, if one did."""
        return next((t for t, line in list(self.lines) if t > since and text in line), None)

    def run_dir(self, timeout: float) -> Path:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for _, line in list(self.lines):
                if line.startswith("run directory: "):
                    return Path(line.removeprefix("run directory: "))
            self.check_running()
            time.sleep(0.1)
        raise ChaosError(f"bin/launch named no run directory within {timeout} s")

    def check_running(self) -> None:
        if self.process.poll() is not None:
            tail = "\n".join(line for _, line in self.lines[-20:])
            raise ChaosError(f"bin/launch exited with {self.process.returncode}:\n{tail}")

    def children(self) -> dict[str, int]:
        """The launcher's node processes now alive, by their node-process names."""
        found = {}
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
                command = (stat.parent / "cmdline").read_bytes().decode().split("\0")
            except (OSError, UnicodeDecodeError):
                continue
            if int(fields[1]) != self.process.pid or fields[0] == "Z":
                continue
            name = node_process_name(command)
            if name is not None:
                found[name] = int(stat.parent.name)
        return found

    def wait(self, timeout: float) -> int:
        """The launcher's exit status, once it and its output are done."""
        code = self.process.wait(timeout=timeout)
        self._reader.join(timeout=10)
        return code

    def kill(self) -> None:
        """SIGKILL the launcher and every process of its session."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.wait(timeout=60)


def node_process_name(command: list[str]) -> str | None:
    """``engine/POLICY/INDEX`` or ``learner/POLICY`` for a node process's command line."""

    def value(flag: str) -> str:
        return command[command.index(flag) + 1] if flag in command else "?"

    if "actors.engines.serve" in command:
        return f"engine/{value('--policy')}/{value('--index')}"
    if "learner.serve" in command:
        config = json.loads(value("--config"))
        return f"learner/{config['policy']}"
    return None


class Progress:
    """Counts the batches the learners' ledgers record, reading only what was added."""

    def __init__(self, ledger_dir: Path) -> None:
        self.ledger_dir = ledger_dir
        self._read: dict[Path, int] = {}
        self.by_learner: dict[str, int] = {}
        """Batch records in each learner's ledger: batches trained again after a resume
        count twice, so this runs ahead of the learner."""
        self.launches = 0

    @property
    def fewest(self) -> int:
        """The batches of the learner that has recorded fewest (of those that have any)."""
        return min(self.by_learner.values(), default=0)

    def poll(self) -> None:
        for path in [*self.ledger_dir.glob("learner-*.jsonl"), self.ledger_dir / CONDUCTOR]:
            if not path.is_file():
                continue
            with open(path, "rb") as file:
                file.seek(self._read.get(path, 0))
                added = file.read()
            complete = added[: added.rfind(b"\n") + 1]
            self._read[path] = self._read.get(path, 0) + len(complete)
            if path.name == CONDUCTOR:
                self.launches += complete.count(b'"event":"launch"')
            else:
                count = complete.count(b'"event":"batch"')
                self.by_learner[path.name] = self.by_learner.get(path.name, 0) + count

    def wait(
        self, launcher: Launcher, *, batches: int = 0, launches: int = 0, timeout: float
    ) -> None:
        """Until every learner's ledger holds ``batches`` batches and the conductor's
        ``launches`` launches."""
        deadline = time.monotonic() + timeout
        while True:
            self.poll()
            if self.fewest >= batches and self.launches >= launches:
                return
            launcher.check_running()
            if time.monotonic() > deadline:
                raise ChaosError(
                    f"after {timeout} s the learners' ledgers hold {self.fewest} batches or more "
                    f"(waiting for {batches}) and {self.launches} launches (waiting for "
                    f"{launches})"
                )
            time.sleep(0.2)


@dataclasses.dataclass
class ChaosReport:
    kills: list[Kill]
    audit: Audit
    target_batches: int
    wall_s: float

    @property
    def at_target(self) -> bool:
        learners = self.audit.learners.values()
        return bool(learners) and all(a.batches >= self.target_batches for a in learners)

    @property
    def passed(self) -> bool:
        return self.audit.clean and self.at_target

    def as_json(self) -> dict[str, object]:
        recoveries = [k.recovery_s for k in self.kills]
        by_target: dict[str, int] = {}
        for kill in self.kills:
            by_target[kill.target] = by_target.get(kill.target, 0) + 1
        return {
            "passed": self.passed,
            "kills": len(self.kills),
            "kills_by_target": by_target,
            "recovery_s": {
                "median": statistics.median(recoveries) if recoveries else None,
                "max": max(recoveries, default=None),
            },
            "lost": self.audit.lost,
            "duplicated": self.audit.duplicated,
            "contradictions": self.audit.contradictions,
            "at_target": self.at_target,
            "target_batches": self.target_batches,
            "wall_s": self.wall_s,
            "each_kill": [dataclasses.asdict(k) for k in self.kills],
            "problems": dataclasses.asdict(self.audit.problems),
            "learners": {
                policy: {
                    **dataclasses.asdict(a),
                    "lost": a.lost[:20],
                    "duplicated": a.duplicated[:20],
                }
                for policy, a in self.audit.learners.items()
            },
        }


def _learner_json(learner: LearnerAudit, shown: int = 20) -> dict[str, object]:
    """The audit of one learner, with at most ``shown`` of its lost and duplicated ids."""
    return {
        **dataclasses.asdict(learner),
        "lost": learner.lost[:shown],
        "duplicated": learner.duplicated[:shown],
    }


def run_chaos(
    launch_arguments: list[str],
    out: Path,
    *,
    kills: int,
    targets: list[str],
    seed: int = 0,
    timeout: float = 1800.0,
) -> ChaosReport:
    """Drive one run through ``kills`` kills and audit it (see the module's docstring)."""
    rng = random.Random(seed)
    cycle = list(targets)
    rng.shuffle(cycle)
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    done: list[Kill] = []
    with open(out / "launch.log", "a") as log:
        arguments = [
            *launch_arguments,
            f"--set=runs_dir='{out / 'runs'}'",
            f"--set=cluster.restarts={kills}",
        ]
        launcher = Launcher(arguments, log)
        try:
            run_dir = launcher.run_dir(timeout=600)
            steps = load_config(run_dir / "config.toml").train.steps
            progress = Progress(run_dir / "ledger")
            progress.wait(launcher, batches=1, timeout=timeout)
            for n, point in enumerate(kill_points(steps, kills, rng)):
                progress.wait(launcher, batches=point, timeout=timeout)
                if progress.fewest >= 0.9 * steps:
                    raise ChaosError(
                        f"the run came near its target of {steps} batches after {n} kills: "
                        f"give it more train.steps"
                    )
                target = cycle[n % len(cycle)]
                kill_time = time.monotonic()
                if target == "run":
                    name = "run"
                    launcher.kill()
                    launcher = Launcher(["--resume", str(run_dir)], log)
                    progress.wait(launcher, launches=progress.launches + 1, timeout=timeout)
                    recovered = time.monotonic()
                else:
                    name, pid = _choose(launcher.children(), target, rng)
                    os.kill(pid, signal.SIGSTOP if target == "hang" else signal.SIGKILL)
                    recovered = _wait_for_line(
                        launcher, kill_time, f"node process {name} serves again", timeout
                    )
                done.append(Kill(target, name, kill_time - started, recovered - kill_time))
                print(
                    f"chaos: kill {n + 1}/{kills}: {name}, serving again after "
                    f"{recovered - kill_time:.1f} s",
                    flush=True,
                )
            if launcher.wait(timeout=timeout) != 0:
                launcher.check_running()
        except BaseException:
            launcher.kill()
            raise
    report = ChaosReport(done, audit(run_dir / "ledger"), steps, time.monotonic() - started)
    (out / "chaos.json").write_text(json.dumps(report.as_json(), indent=1))
    return report


def kill_points(steps: int, kills: int, rng: random.Random) -> list[int]:
    """Batch counts to kill at: one at a random place in each of ``kills`` equal slices
    of the first 80% of ``steps``, so they increase and leave the run its end."""
    width = 0.8 * steps / max(kills, 1)
    return [max(1, round(width * (n + rng.uniform(0.2, 0.8)))) for n in range(kills)]


def _choose(children: dict[str, int], target: str, rng: random.Random) -> tuple[str, int]:
    def kind(name: str) -> str:
        if name.startswith(f"engine/{JUDGE_POLICY}/"):
            return "judge"
        return name.split("/")[0]

    kinds = {"engine", "learner"} if target == "hang" else {target}
    candidates = sorted(name for name in children if kind(name) in kinds)
    if not candidates:
        raise ChaosError(f"no {target} process runs (node processes: {sorted(children)})")
    name = rng.choice(candidates)
    return name, children[name]


def _wait_for_line(launcher: Launcher, since: float, text: str, timeout: float) -> float:
    deadline = time.monotonic() + timeout
    while (arrived := launcher.line_after(since, text)) is None:
        launcher.check_running()
        if time.monotonic() > deadline:
            raise ChaosError(f"no {text!r} within {timeout} s")
        time.sleep(0.05)
    return arrived


def summary(report: ChaosReport) -> str:
    data = report.as_json()
    lines = [
        f"chaos: {'PASSED' if report.passed else 'FAILED'} in {report.wall_s:.0f} s",
        f"  kills {data['kills']} {data['kills_by_target']}",
    ]
    recoveries = [kill.recovery_s for kill in report.kills]
    if recoveries:
        lines.append(
            f"  recovery median {statistics.median(recoveries):.1f} s, max {max(recoveries):.1f} s"
        )
    problems = report.audit.problems
    lines.append(
        f"  problems admitted {problems.admitted}: finished {problems.finished}, failed "
        f"{problems.failed}, cancelled at the end {problems.cancelled}, admitted again "
        f"{problems.readmitted}, unfinished {len(problems.unfinished)}"
    )
    for policy, learner in report.audit.learners.items():
        lines.append(
            f"  learner {policy}: accepted {learner.accepted}, trained {learner.trained}, "
            f"held at the end {learner.held}, lost {len(learner.lost)}, duplicated "
            f"{len(learner.duplicated)}; {learner.batches} batches ({learner.steps} steps, "
            f"target {report.target_batches}), {learner.resumes} resumes, "
            f"{learner.retrained_batches} batches trained again, refused {learner.rejected}"
        )
    lines += [f"  contradiction: {c}" for c in report.audit.contradictions]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="bin/chaos", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("config", nargs="?", help="a TOML recipe (default: the embedded one)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--kills", type=int, default=6)
    parser.add_argument("--targets", default="engine,learner,run", help=f"of {', '.join(TARGETS)}")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("runs/chaos"))
    args = parser.parse_args()
    targets = args.targets.split(",")
    unknown = sorted(set(targets) - set(TARGETS))
    if unknown or args.kills < 0:
        parser.error(f"--targets: {unknown} not of {TARGETS}" if unknown else "--kills < 0")
    arguments = [*([args.config] if args.config else []), *(f"--set={s}" for s in args.set)]
    try:
        report = run_chaos(arguments, args.out, kills=args.kills, targets=targets, seed=args.seed)
    except ChaosError as error:
        parser.exit(1, f"bin/chaos: {error}\n")
    print(summary(report), flush=True)
    print(f"report: {args.out / 'chaos.json'}", flush=True)
    if not report.passed:
        sys.exit(1)


if __name__ == "__main__":
    main()

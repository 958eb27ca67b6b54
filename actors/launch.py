"""bin/launch: run a recipe on one host.

    bin/launch                                # the embedded default: MarsRL, tiny models, CPU
    bin/launch configs/mappa-tiny.toml        # another recipe
    bin/launch CONFIG --set train.steps=100 --set learner.lr=3e-4

``launch`` builds (for ``model = "tiny"``) the embedded model, starts one engine node
process per engine and one learner node process per policy (each logs JSON lines to
``RUN_DIR/logs/``), runs the agents and the conductor on the head node in this
process, and prints a console line every ``train.console_every`` seconds while it
appends the same figures to ``RUN_DIR/metrics.jsonl``. It ends when every learner has
taken ``train.steps`` steps, and stops the processes it started.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import itertools
import json
import random
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import ExitStack, asynccontextmanager
from pathlib import Path
from typing import IO

import anyio
import anyio.abc
import anyio.to_thread
import msgspec
from safetensors.torch import load_file

from actors.agent import AgentActor
from actors.conductor import Conductor, ConductorStats
from actors.engines.weights import to_buckets
from actors.evaluation import EvalReport, evaluate
from actors.messages import Problem, ScoredSegment
from actors.problems import arithmetic_problems, load_problems
from actors.run_config import EMBEDDED, ConfigError, RunConfig, dump_config, load_config
from actors.tiny_model import build_tiny_checkpoint
from actors.warm_start import format_examples, teach_formats
from learner.checkpoints import latest_checkpoint
from rewards.judge import Judge, JudgeActor, LLMJudge, RemoteJudge, RuleJudge, engine_generate
from runtime import Node, configure_logging, open_node

JUDGE_POLICY = "judge"
"""The policy name an LLM judge's engine serves (its weights never change)."""


async def open_judge(config: RunConfig, head: Node) -> Judge | None:
    """The run's judge as a ``JudgeActor`` named ``judge`` on the head node, and the
    ``RemoteJudge`` the conductor scores through."""
    settings = config.judge
    judge: Judge
    if settings.kind == "none":
        return None
    if settings.kind == "rule":
        judge = RuleJudge()
    else:
        engine = await head.lookup(f"engine/{JUDGE_POLICY}/0", timeout=600)
        judge = LLMJudge(
            engine_generate(head, engine),
            max_tokens=settings.max_tokens,
            timeout=settings.timeout,
            concurrency=settings.concurrency,
            cache_size=settings.cache_size,
        )
    ref = await head.spawn("judge", functools.partial(JudgeActor, judge))
    return RemoteJudge(head, ref, timeout=settings.timeout * 2 + 30)


def new_run_dir(config: RunConfig) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    run_dir = Path(config.runs_dir) / f"{config.name}-{stamp}"
    (run_dir / "logs").mkdir(parents=True)
    (run_dir / "config.toml").write_text(dump_config(config))
    return run_dir


def problems_of(config: RunConfig, split: str) -> list[Problem]:
    source = config.problems
    if source.source == "arithmetic":
        count = source.train if split == "train" else source.test
        return arithmetic_problems(
            count, difficulty=source.difficulty, split=split, seed=source.seed
        )
    return [p for p in load_problems(source.source) if p.split == split]


def endless(problems: list[Problem], seed: int) -> Iterator[Problem]:
    """Epoch after epoch, reshuffled; each pass gives the problem a new episode id."""
    if not problems:
        raise ValueError("there are no training problems")
    rng = random.Random(seed)
    for epoch in itertools.count():
        order = list(problems)
        rng.shuffle(order)
        for problem in order:
            yield msgspec.structs.replace(problem, problem_id=f"{problem.problem_id}@{epoch}")


def prepare_models(config: RunConfig, run_dir: Path) -> dict[str, str]:
    """The checkpoint path of every policy; builds and warm-starts embedded ones."""
    paths = {}
    for policy, settings in config.policies.items():
        if settings.model != EMBEDDED:
            paths[policy] = settings.model
            continue
        path = run_dir / "models" / policy
        if not (path / "config.json").is_file():
            build_tiny_checkpoint(path, seed=config.problems.seed)
            roles = [r for r, p in config.roles.items() if p == policy]
            examples = format_examples(
                roles,
                problems_of(config, "train"),
                4096,
                correct=settings.warm_start_correct,
                seed=config.problems.seed,
            )
            print(f"warm start: teaching {policy} the output formats of {roles} ...", flush=True)
            loss = teach_formats(path, examples, steps=settings.warm_start_steps)
            print(f"warm start: done (loss {loss:.3f})", flush=True)
        paths[policy] = str(path)
    if config.judge.kind == "llm":
        paths[JUDGE_POLICY] = config.judge.model
    return paths


async def _start(
    command: list[str], log: IO[bytes], tasks: anyio.abc.TaskGroup
) -> anyio.abc.Process:
    process = await anyio.open_process(command, stderr=log)
    assert process.stdout is not None
    buffered = b""
    with anyio.fail_after(600):
        while b'{"ready"' not in buffered:
            chunk = await process.stdout.receive()
            buffered += chunk
    tasks.start_soon(_drain, process.stdout)
    return process


async def _drain(stream: anyio.abc.ByteReceiveStream) -> None:
    async for _ in stream:
        pass


@asynccontextmanager
async def open_processes(
    config: RunConfig, run_dir: Path, head: Node, models: dict[str, str], *, learners: bool
) -> AsyncIterator[None]:
    """Engine node processes and (``learners``) learner node processes, stopped (stdin
    closed, then killed after 30 s) when the block ends."""
    python = sys.executable
    logs = run_dir / "logs"
    processes: list[anyio.abc.Process] = []
    with ExitStack() as files:
        async with anyio.create_task_group() as tasks:
            for policy, settings in config.policies.items():
                for index in range(settings.engines):
                    name = f"engine/{policy}/{index}"
                    command = [python, "-m", "actors.engines.serve", "--head", head.address]
                    command += ["--policy", policy, "--model", models[policy]]
                    command += ["--index", str(index), "--engine", settings.engine]
                    command += ["--threads", str(settings.threads)]
                    command += ["--max-batch", str(settings.max_batch)]
                    log = _open_append(files, logs / f"{_file_name(name)}.jsonl")
                    processes.append(await _start(command, log, tasks))
            if config.judge.kind == "llm":
                command = [python, "-m", "actors.engines.serve", "--head", head.address]
                command += ["--policy", JUDGE_POLICY, "--model", models[JUDGE_POLICY]]
                command += ["--engine", config.judge.engine]
                log = _open_append(files, logs / "engine-judge-0.jsonl")
                processes.append(await _start(command, log, tasks))
            for policy, settings in config.policies.items() if learners else ():
                engines = [f"engine/{policy}/{i}" for i in range(settings.engines)]
                learner = config.learner_config(
                    policy,
                    engines=engines,
                    notify=["conductor"],
                    checkpoint_dir=str(run_dir / "checkpoints" / policy),
                    checkpoint_every=config.train.checkpoint_every,
                )
                command = [python, "-m", "learner.serve", "--head", head.address]
                command += ["--model", models[policy], "--threads", str(settings.threads)]
                command += ["--config", msgspec.json.encode(learner).decode()]
                log = _open_append(files, logs / f"{_file_name(f'learner/{policy}')}.jsonl")
                processes.append(await _start(command, log, tasks))
            try:
                yield
            finally:
                with anyio.CancelScope(shield=True):
                    await _stop(processes)
                tasks.cancel_scope.cancel()


async def _stop(processes: list[anyio.abc.Process]) -> None:
    for process in processes:
        if process.stdin is not None:
            await process.stdin.aclose()
    with anyio.move_on_after(30):
        for process in processes:
            await process.wait()
    for process in processes:
        if process.returncode is None:
            process.kill()
            await process.wait()


def _file_name(actor: str) -> str:
    return actor.replace("/", "-")


def _open_append(files: ExitStack, path: Path) -> IO[bytes]:
    return files.enter_context(open(path, "ab"))


async def launch(config: RunConfig, run_dir: Path, *, train: bool = True) -> dict[str, EvalReport]:
    """Train until every learner has taken ``train.steps`` steps (``train`` False: only
    evaluate the newest checkpoints), then evaluate on the held-out split."""
    models = await anyio.to_thread.run_sync(prepare_models, config, run_dir)
    problems = endless(problems_of(config, "train"), config.problems.seed)
    with ExitStack() as files:
        samples = _open_append(files, run_dir / "samples.jsonl")
        return await _run(config, run_dir, models, problems, train, _sampler(samples))


def _sampler(out: IO[bytes], every: int = 16) -> Callable[[ScoredSegment], None]:
    """Writes every ``every``-th scored action's role, text and reward to ``out``."""
    seen = itertools.count()

    def sample(scored: ScoredSegment) -> None:
        if next(seen) % every == 0:
            segment = scored.segment
            record = {
                "role": segment.role,
                "episode": segment.episode_id,
                "version": int(segment.versions.min()),
                "text": segment.text,
                "reward": scored.reward,
                "parts": scored.parts,
            }
            out.write(json.dumps(record).encode() + b"\n")
            out.flush()

    return sample


async def _run(
    config: RunConfig,
    run_dir: Path,
    models: dict[str, str],
    problems: Iterator[Problem],
    train: bool,
    sampler: Callable[[ScoredSegment], None],
) -> dict[str, EvalReport]:
    async with (
        open_node("head", listen="tcp://127.0.0.1:*") as head,
        open_processes(config, run_dir, head, models, learners=train),
    ):
        for role, policy in config.roles.items():
            engines = [f"engine/{policy}/{i}" for i in range(config.policies[policy].engines)]
            sampling = config.sampling_for(role)
            agent = functools.partial(AgentActor, role, policy, engines, sampling=sampling)
            await head.spawn(f"agent/{role}", agent)
        conductor = Conductor(
            config.conductor,
            problems,
            policies=dict(config.roles),
            agents={role: f"agent/{role}" for role in config.roles},
            learners={policy: f"learner/{policy}" for policy in config.policies} if train else {},
            judge=await open_judge(config, head),
            on_scored=sampler,
        )
        await head.spawn("conductor", lambda: conductor)
        held_out = problems_of(config, "test")[: config.eval.problems]
        reports: dict[str, EvalReport] = {}
        if train and config.eval.before:
            await conductor.connect()
            print(f"evaluating on {len(held_out)} held-out problems before RL ...", flush=True)
            reports["start"] = await evaluate(conductor, held_out, config.eval)
        if train:
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(_report, conductor, config, run_dir)
                await conductor.run(until_batches=config.train.steps)
                tasks.cancel_scope.cancel()
        else:
            await conductor.connect()
            await _load_newest_checkpoints(head, config, run_dir)
        print(f"evaluating on {len(held_out)} held-out problems ...", flush=True)
        reports["end" if train else "checkpoint"] = await evaluate(conductor, held_out, config.eval)
    record = {when: dataclasses.asdict(report) for when, report in reports.items()}
    (run_dir / "eval.json").write_text(json.dumps(record, indent=1))
    return reports


async def _load_newest_checkpoints(head: Node, config: RunConfig, run_dir: Path) -> None:
    """Push each policy's newest checkpoint to its engines, as a learner would."""
    for policy, settings in config.policies.items():
        newest = latest_checkpoint(run_dir / "checkpoints" / policy)
        if newest is None:
            print(f"{policy}: no checkpoint, evaluating its initial weights", flush=True)
            continue
        version = int(json.loads((newest / "meta.json").read_text())["version"])
        weights = load_file(newest / "model.safetensors")
        for index in range(settings.engines):
            engine = await head.lookup(f"engine/{policy}/{index}", timeout=60)
            for bucket in to_buckets(policy, version, weights.items()):
                await head.call(engine, bucket, timeout=600)
        print(f"{policy}: evaluating version {version} ({newest})", flush=True)


async def _report(conductor: Conductor, config: RunConfig, run_dir: Path) -> None:
    """A console line and a ``metrics.jsonl`` record every ``train.console_every``
    seconds, and a last one when cancelled at the end of the run."""
    began = time.monotonic()
    with ExitStack() as files:
        metrics = _open_append(files, run_dir / "metrics.jsonl")

        def record() -> None:
            stats, elapsed = conductor.statistics(), time.monotonic() - began
            line = {"time_s": round(elapsed, 2), **msgspec.to_builtins(stats)}
            metrics.write(json.dumps(line).encode() + b"\n")
            metrics.flush()
            print(console_line(stats, config.train.steps, elapsed), flush=True)

        try:
            while True:
                await anyio.sleep(config.train.console_every)
                record()
        finally:
            record()


def console_line(stats: ConductorStats, steps: int, elapsed: float) -> str:
    version = min(stats.versions.values(), default=0)
    batches = min(stats.batches.values(), default=0)
    done = batches / max(steps, 1)
    eta = elapsed * (1 - done) / done if done > 0 else float("nan")
    bar = "#" * int(done * 20)
    roles = "  ".join(
        f"{role} r={r.reward_mean:.2f} {r.actions_per_s:.1f}/s" for role, r in stats.roles.items()
    )
    return (
        f"[{bar:<20}] batch {batches}/{steps} v{version} eta {eta:4.0f}s"
        f" | solver acc {stats.solver_accuracy:.2f}"
        f" | episodes {stats.finished}+{stats.in_flight}"
        f"{' (waiting for learners)' if stats.waiting_for_learners else ''} | {roles}"
    )


DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "marsrl-tiny.toml"


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="bin/launch", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("config", nargs="?", help=f"a TOML recipe (default: {DEFAULT_CONFIG.name})")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--resume", type=Path, metavar="RUN_DIR", help="continue this run")
    parser.add_argument(
        "--eval", action="store_true", help="only evaluate (the newest checkpoints of --resume)"
    )
    args = parser.parse_args()
    if args.resume and args.config:
        parser.error("--resume takes the run's own config.toml; give no CONFIG")
    try:
        source = args.resume / "config.toml" if args.resume else args.config or DEFAULT_CONFIG
        config = load_config(source, args.set)
    except ConfigError as error:
        parser.exit(2, f"bin/launch: {error}\n")
    run_dir = args.resume or new_run_dir(config)
    print(f"run directory: {run_dir}", flush=True)
    with open(run_dir / "logs" / "head.jsonl", "a") as head_log:
        configure_logging("info", stream=head_log)
        reports = anyio.run(
            functools.partial(launch, config, run_dir, train=not args.eval), backend="trio"
        )
    print(accuracy_table(reports, config.train.steps), flush=True)
    print(f"run directory: {run_dir}", flush=True)


def accuracy_table(reports: dict[str, EvalReport], steps: int) -> str:
    """Solver-only and system accuracy side by side, as MarsRL's Table 1 has them."""
    labels = {
        "start": "before RL (after warm start)",
        "end": f"after {steps} RL batches",
        "checkpoint": "the newest checkpoints",
    }
    problems = next(iter(reports.values())).problems
    lines = [f"held-out accuracy, {problems} problems      Solver   system   accepted"]
    for when, report in reports.items():
        lines.append(
            f"  {labels[when]:<34} {report.solver_accuracy:>6.3f}   "
            f"{report.system_accuracy:>6.3f}   {report.accepted:>8.2f}"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()

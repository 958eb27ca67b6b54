"""bin/launch: run a recipe on one host or several.

    bin/launch                                # the embedded default: MarsRL, tiny models, CPU
    bin/launch configs/mappa-tiny.toml        # another recipe
    bin/launch CONFIG --set train.steps=100 --set learner.lr=3e-4
    bin/launch --resume RUN_DIR [--eval]      # continue a run, or evaluate its checkpoints
    bin/launch CONFIG --join tcp://HEAD:PORT --rank 1 --run-dir DIR   # a worker host
    srun bin/launch CONFIG                    # every rank, placed by Slurm's environment
    bin/launch keys DIR                       # CURVE keys for a multi-host run's links

``launch`` builds (for ``model = "tiny"``) the embedded model, starts the engine and
learner node processes placed on the head (each logs JSON lines to ``RUN_DIR/logs/``),
runs the agents and the conductor on the head node in this process, and prints a
console line every ``train.console_every`` seconds while it appends the same figures
to ``RUN_DIR/metrics.jsonl``. It evaluates on held-out problems before RL and once
every learner has consumed ``train.steps`` batches, then stops the processes it
started.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import itertools
import json
import random
import shutil
import socket
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, closing
from pathlib import Path
from typing import IO, Any

import anyio
import anyio.abc
import anyio.to_thread
import msgspec
from safetensors.torch import load_file

from actors.agent import AgentActor
from actors.cluster import (
    ClusterError,
    SlurmTask,
    advertised,
    head_listen,
    node_listen,
    serve_worker,
    slurm_task,
)
from actors.conductor import Conductor, ConductorStats, RunFailed
from actors.engines.weights import to_buckets
from actors.evaluation import EvalReport, evaluate
from actors.ledger import CONDUCTOR, LedgerWriter, audit_problems, read_ledger, readmissions
from actors.messages import Problem, ScoredSegment
from actors.models import CheckpointError, check_model
from actors.problems import arithmetic_problems, load_problems
from actors.processes import NodeProcessFailed, open_append, open_processes
from actors.run_config import (
    EMBEDDED,
    JUDGE_POLICY,
    ConfigError,
    RunConfig,
    dump_config,
    load_config,
)
from actors.tiny_model import build_tiny_checkpoint
from actors.warm_start import format_examples, teach_formats
from learner.checkpoints import latest_checkpoint
from rewards.judge import Judge, JudgeActor, LLMJudge, RemoteJudge, RuleJudge, engine_generate
from runtime import KeysError, Node, configure_logging, create_cluster_keys, open_node


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
    """``RUNS_DIR/NAME-STAMP``, or ``NAME-STAMP-2``, ``-3``... when runs started in the
    same second: creating the directory claims the name."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    root = Path(config.runs_dir)
    root.mkdir(parents=True, exist_ok=True)
    for suffix in itertools.chain([""], (f"-{n}" for n in itertools.count(2))):
        run_dir = root / f"{config.name}-{stamp}{suffix}"
        try:
            run_dir.mkdir()
            break
        except FileExistsError:
            continue
    (run_dir / "logs").mkdir()
    (run_dir / "config.toml").write_text(dump_config(config))
    return run_dir


def problems_of(config: RunConfig, split: str) -> list[Problem]:
    """The run's problems of ``split``; the held-out ones are the same whatever the
    run's seed, so runs that differ in seed are evaluated alike."""
    source = config.problems
    if source.source == "arithmetic":
        count, seed = (source.train, config.seed) if split == "train" else (source.test, 0)
        return arithmetic_problems(count, difficulty=source.difficulty, split=split, seed=seed)
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


def check_models(config: RunConfig) -> None:
    """Every checkpoint the recipe names is complete and its tokenizer fits its model,
    checked before a run directory or a process exists; the error names the field."""
    named = {
        f"$.policies.{policy}.model": settings.model
        for policy, settings in config.policies.items()
        if settings.model != EMBEDDED
    }
    if config.judge.kind == "llm":
        named["$.judge.model"] = config.judge.model
    for field, path in named.items():
        try:
            check_model(path)
        except CheckpointError as error:
            raise ConfigError(f"{field}: {error}") from None


def prepare_models(config: RunConfig, run_dir: Path) -> dict[str, str]:
    """The checkpoint path of every policy; builds and warm-starts embedded ones.

    An embedded policy learns the formats of its ``warm_start_roles`` (by default every
    role of the run), and policies with the same warm-start settings start from one
    copy of the same weights: as all agents of the papers start from one pretrained
    checkpoint, so that one policy per role and one shared policy differ only in what
    RL does to them, and the warm start runs once rather than once per policy."""
    paths: dict[str, str] = {}
    built: dict[tuple[object, ...], Path] = {}
    for policy, settings in config.policies.items():
        if settings.model != EMBEDDED:
            paths[policy] = settings.model
            continue
        path = run_dir / "models" / policy
        recipe = (
            settings.warm_start_steps,
            settings.warm_start_correct,
            settings.warm_start_examples,
            warm_start_roles(config, policy),
            settings.warm_start_findings,
            warm_start_seed(config, policy),
        )
        if not path.is_dir():
            # Built aside and renamed into place whole: a resumed run, or a worker host
            # waiting on a shared run directory, never sees a half-built model.
            building = path.with_name(f".{policy}.building")
            shutil.rmtree(building, ignore_errors=True)
            if recipe in built:
                print(f"warm start: {policy} starts as a copy of {built[recipe].name}", flush=True)
                shutil.copytree(built[recipe], building)
            else:
                _build_embedded(config, policy, building)
            building.rename(path)
        built.setdefault(recipe, path)
        paths[policy] = str(path)
    if config.judge.kind == "llm":
        paths[JUDGE_POLICY] = config.judge.model
    return paths


def warm_start_seed(config: RunConfig, policy: str) -> int:
    seed = config.policies[policy].warm_start_seed
    return config.seed if seed is None else seed


def warm_start_roles(config: RunConfig, policy: str) -> tuple[str, ...]:
    return config.policies[policy].warm_start_roles or tuple(config.roles)


def _build_embedded(config: RunConfig, policy: str, path: Path) -> None:
    settings = config.policies[policy]
    seed = warm_start_seed(config, policy)
    build_tiny_checkpoint(path, seed=seed)
    roles = list(warm_start_roles(config, policy))
    examples = format_examples(
        roles,
        problems_of(msgspec.structs.replace(config, seed=seed), "train"),
        settings.warm_start_examples,
        correct=settings.warm_start_correct,
        findings=settings.warm_start_findings,
        seed=seed,
    )
    print(
        f"warm start: teaching {policy} the output formats of {roles} (seed {seed}) ...", flush=True
    )
    loss = teach_formats(path, examples, steps=settings.warm_start_steps, seed=seed)
    print(f"warm start: done (loss {loss:.3f})", flush=True)


async def launch(config: RunConfig, run_dir: Path, *, train: bool = True) -> dict[str, EvalReport]:
    """Train until every learner has taken ``train.steps`` steps (``train`` False: only
    evaluate the newest checkpoints), then evaluate on the held-out split."""
    models = await anyio.to_thread.run_sync(prepare_models, config, run_dir)
    ledger_path = run_dir / "ledger" / CONDUCTOR
    problems, again = problem_stream(config, read_ledger(ledger_path))
    with ExitStack() as files:
        samples = open_append(files, run_dir / "samples.jsonl")
        ledger = files.enter_context(closing(LedgerWriter(ledger_path))) if train else None
        conductor = functools.partial(
            Conductor,
            config.conductor,
            problems,
            policies=dict(config.roles),
            agents={role: f"agent/{role}" for role in config.roles},
            learners={policy: f"learner/{policy}" for policy in config.policies} if train else {},
            on_scored=_sampler(samples),
            seed=config.seed,
            ledger=ledger,
            again=again,
        )
        return await _run(config, run_dir, models, conductor, train)


def problem_stream(
    config: RunConfig, records: list[dict[str, Any]]
) -> tuple[Iterator[Problem], dict[str, str]]:
    """The training problems of a run whose conductor ledger holds ``records``: first
    those a killed launch left unfinished, admitted again (``readmissions``), then the
    endless stream from where the last launch stopped drawing."""
    again, renamed = readmissions(records)
    drawn = audit_problems(records).drawn
    stream = endless(problems_of(config, "train"), config.seed)
    return itertools.chain(again, itertools.islice(stream, drawn, None)), renamed


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
    new_conductor: Callable[..., Conductor],
    train: bool,
) -> dict[str, EvalReport]:
    async with (
        open_node(
            "head",
            listen=head_listen(config),
            keys=config.cluster_keys(),
            advertise=advertised(config, config.cluster.port),
        ) as head,
        open_processes(
            config,
            run_dir,
            head.address,
            models,
            learners=train,
            listen=node_listen(config),
            answering=head.peer_is_up,
        ),
    ):
        for role, policy in config.roles.items():
            engines = [f"engine/{policy}/{i}" for i in range(config.policies[policy].engines)]
            sampling = config.sampling_for(role)
            agent = functools.partial(AgentActor, role, policy, engines, sampling=sampling)
            await head.spawn(f"agent/{role}", agent)
        conductor = new_conductor(judge=await open_judge(config, head))
        await head.spawn("conductor", lambda: conductor)
        held_out = problems_of(config, "test")[: config.eval.problems]
        assess = functools.partial(
            evaluate,
            conductor,
            held_out,
            config.eval,
            workflow=config.conductor.workflow,
            executor_turns=config.conductor.executor_turns,
            review="verifier" in config.roles,
        )
        saved = saved_reports(run_dir)
        reports: dict[str, EvalReport] = {}
        if train and "start" in saved:  # a resumed run: its start was measured before
            reports["start"] = saved["start"]
        elif train and config.eval.before:
            await conductor.connect()
            print(f"evaluating on {len(held_out)} held-out problems before RL ...", flush=True)
            reports["start"] = await assess()
            save_reports(run_dir, {**saved, **reports})
        if train:
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(_report, conductor, config, run_dir)
                await conductor.run(until_batches=config.train.steps)
                tasks.cancel_scope.cancel()
        else:
            await conductor.connect()
            await _load_newest_checkpoints(head, config, run_dir)
        print(f"evaluating on {len(held_out)} held-out problems ...", flush=True)
        reports["end" if train else "checkpoint"] = await assess()
    save_reports(run_dir, {**saved, **reports})
    return reports


def saved_reports(run_dir: Path) -> dict[str, EvalReport]:
    """The evaluations in ``RUN_DIR/eval.json``, by when they were made."""
    path = run_dir / "eval.json"
    if not path.is_file():
        return {}
    return msgspec.json.decode(path.read_bytes(), type=dict[str, EvalReport])


def save_reports(run_dir: Path, reports: dict[str, EvalReport]) -> None:
    record = {when: dataclasses.asdict(report) for when, report in reports.items()}
    (run_dir / "eval.json").write_text(json.dumps(record, indent=1))


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
        metrics = open_append(files, run_dir / "metrics.jsonl")

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
        f"{role} r={r.reward_mean:.2f} {r.actions_per_s:.1f}/s q{r.queued} "
        f"stale {r.staleness_mean:.1f}"
        for role, r in stats.roles.items()
    )
    return (
        f"[{bar:<20}] batch {batches}/{steps} v{version} eta {eta:4.0f}s"
        f" | solver acc {stats.solver_accuracy:.2f}"
        f" | episodes {stats.finished}+{stats.in_flight}"
        f"{' (waiting for learners)' if stats.waiting_for_learners else ''} | {roles}"
    )


DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "marsrl-tiny.toml"


def make_keys(argv: list[str]) -> None:
    """``bin/launch keys DIR``: a new CURVE key pair for one cluster's runs."""
    parser = argparse.ArgumentParser(
        prog="bin/launch keys",
        description="Create the CURVE key pair that authenticates a multi-host run's links.",
    )
    parser.add_argument("directory", type=Path, help="where to write it (a new directory)")
    args = parser.parse_args(argv)
    try:
        secret = create_cluster_keys(args.directory)
    except KeysError as error:
        parser.exit(2, f"bin/launch keys: {error}\n")
    print(
        f"wrote {secret} (readable by you only) and its public key; set cluster.keys = "
        f'"{args.directory}" in the recipe and copy the directory to that path on every host',
        flush=True,
    )


def main() -> None:
    if sys.argv[1:2] == ["keys"]:
        make_keys(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(
        prog="bin/launch", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("config", nargs="?", help=f"a TOML recipe (default: {DEFAULT_CONFIG.name})")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--resume", type=Path, metavar="RUN_DIR", help="continue this run")
    parser.add_argument(
        "--eval", action="store_true", help="only evaluate (the newest checkpoints of --resume)"
    )
    parser.add_argument(
        "--join", metavar="tcp://HEAD:PORT", help="serve this host's rank of a multi-host run"
    )
    parser.add_argument("--rank", type=int, help="with --join: this host's rank (1, 2, ...)")
    parser.add_argument(
        "--run-dir", type=Path, help="with --join: the run directory (shared with the head)"
    )
    args = parser.parse_args()
    if args.resume and args.config:
        parser.error("--resume takes the run's own config.toml; give no CONFIG")
    if args.join and args.rank is None:
        parser.error("--join needs --rank")
    try:
        source = args.resume / "config.toml" if args.resume else args.config or DEFAULT_CONFIG
        config = load_config(source, args.set)
        check_models(config)
    except ConfigError as error:
        parser.exit(2, f"bin/launch: {error}\n")
    slurm = slurm_task() if config.cluster.hosts > 1 and not args.join else None
    try:
        failed: list[Exception] = []
        if args.join or (slurm is not None and slurm.rank > 0):
            try:
                _work(config, args.join, args.rank, args.run_dir, slurm)
            except* (RunFailed, NodeProcessFailed) as group:
                failed.extend(_leaves(group))
            if failed:
                parser.exit(1, f"bin/launch: {failed[0]}\n")
            return
        run_dir = args.resume or _slurm_run_dir(config, slurm) or new_run_dir(config)
        print(f"run directory: {run_dir}", flush=True)
        with open(run_dir / "logs" / "head.jsonl", "a") as head_log:
            configure_logging("info", stream=head_log)
            try:
                reports = anyio.run(
                    functools.partial(launch, config, run_dir, train=not args.eval), backend="trio"
                )
            except* (RunFailed, NodeProcessFailed) as group:
                failed.extend(_leaves(group))
        if failed:
            parser.exit(1, f"bin/launch: {failed[0]}\n")
    except ClusterError as error:
        parser.exit(1, f"bin/launch: {error}\n")
    print(accuracy_table(reports, config.train.steps), flush=True)
    print(f"run directory: {run_dir}", flush=True)


def _leaves(group: BaseExceptionGroup[Exception]) -> Iterator[Exception]:
    for error in group.exceptions:
        if isinstance(error, BaseExceptionGroup):
            yield from _leaves(error)
        else:
            yield error


def _slurm_run_dir(config: RunConfig, slurm: SlurmTask | None) -> Path | None:
    """Under Slurm every rank derives the same run directory from the job id."""
    if slurm is None:
        return None
    run_dir = Path(config.runs_dir) / f"{config.name}-slurm{slurm.job_id}"
    if not (run_dir / "config.toml").exists():
        (run_dir / "logs").mkdir(parents=True, exist_ok=True)
        (run_dir / "config.toml").write_text(dump_config(config))
    return run_dir


def _work(
    config: RunConfig,
    join: str | None,
    rank: int | None,
    run_dir: Path | None,
    slurm: SlurmTask | None,
) -> None:
    """A worker host: ``--join`` names the head, or Slurm's environment does."""
    if slurm is not None:
        head = f"tcp://{socket.gethostbyname(slurm.head_host)}:{config.cluster.port}"
        rank, run_dir = slurm.rank, _slurm_run_dir(config, slurm)
    else:
        head = str(join)
        run_dir = run_dir or Path(config.runs_dir) / f"{config.name}-rank{rank}"
    assert rank is not None and run_dir is not None
    print(f"rank {rank}: joining {head}; run directory {run_dir}", flush=True)
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    with open(run_dir / "logs" / f"rank-{rank}.jsonl", "a") as log:
        configure_logging("info", stream=log)
        anyio.run(serve_worker, config, run_dir, head, rank, backend="trio")


def accuracy_table(reports: dict[str, EvalReport], steps: int) -> str:
    """Solver-only and system accuracy side by side, as MarsRL's Table 1 has them."""
    labels = {
        "start": "before RL (after warm start)",
        "end": f"after {steps} RL batches",
        "checkpoint": "the newest checkpoints",
    }
    problems = next(iter(reports.values())).problems
    lines = [f"held-out accuracy, {problems} problems      Solver   system   accepted   verdicts"]
    for when, report in reports.items():
        lines.append(
            f"  {labels[when]:<34} {report.solver_accuracy:>6.3f}   "
            f"{report.system_accuracy:>6.3f}   {report.accepted:>8.2f}   "
            + (
                f"{report.verdict_accuracy:>8.3f}"
                if report.verdict_accuracy is not None
                else "       -"
            )
        )
    lines.append("  (verdicts: the Verifier's balanced accuracy, chance 0.5)")
    return "\n".join(lines)


if __name__ == "__main__":
    main()

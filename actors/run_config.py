"""A run's recipe: one TOML file decoded into Structs that forbid unknown fields, so a
typo is an error naming the field's path (``$.conductor.group_sise``) before any process
starts. ``--set key.path=value`` edits the decoded TOML before validation; values are
read as TOML (``--set learner.lr=3e-4``), and anything that is not a TOML value is a
string.
"""

from __future__ import annotations

import importlib
import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import msgspec
import tomli_w

from actors.conductor import ConductorConfig
from actors.evaluation import EvalSettings
from actors.messages import SamplingParams
from actors.roles import ROLES
from actors.workflows import WORKFLOWS
from learner.trainer import LearnerConfig
from runtime import CurveKeys, KeysError, load_cluster_keys

JUDGE_POLICY = "judge"
"""The policy name of the judge's engine (a frozen model, never trained)."""

EMBEDDED = "tiny"
"""A policy ``model`` of this name is the embedded tiny model, built at launch."""


class PolicyConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    model: str = EMBEDDED
    """A local checkpoint directory, or ``tiny`` for the embedded model."""
    engine: Literal["torch", "vllm"] = "torch"
    engines: int = 1
    max_batch: int = 64
    threads: int = 1
    """Torch threads per engine and learner process."""
    warm_start_steps: int = 300
    """Embedded model only: supervised steps that teach it the roles' output formats
    before RL (a stand-in for the pretraining a real checkpoint has had)."""
    warm_start_correct: float = 0.0
    """The fraction of warm-start answer labels that are right (the rest are wrong
    numbers near the answer): how good a start the stand-in pretraining gives."""
    warm_start_examples: int = 4096
    """Distinct examples the warm start draws its batches from. The Verifier's parity
    check was learnt from 19,200 (greedy findings right on 0.93 of held-out examples
    after 600 steps), not from 4,096 (0.82 after 900)."""
    warm_start_roles: tuple[str, ...] = ()
    """The roles whose formats the warm start teaches; empty: every role of the run.
    A policy per role can learn its own role alone."""
    warm_start_findings: Literal["result", "parity"] = "result"
    """What the Verifier's findings hold, in its warm-start targets and in the reviews
    the Corrector is taught to read: its own ``result`` of the problem, or a ``parity``
    check of the answer's last digit (``actors.warm_start.parity_findings``)."""
    warm_start_seed: int | None = None
    """Seeds the embedded model's initialisation and warm start; None: the run's
    ``seed``. Fixed, every seed of a recipe starts RL from the same checkpoint, as runs
    from one pretrained model do, and the run's seed varies RL alone."""
    learner: dict[str, Any] = {}
    """``LearnerConfig`` fields for this policy's learner alone, over the run's
    ``learner`` table: with a policy per role, each role can learn at its own rate."""


class JudgeConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """MAPPA's coach. ``rule`` scores by the known answer (for the generated tasks);
    ``llm`` asks a frozen ``model`` served by an engine of its own, which sees the
    reference answer only for the final verifier."""

    kind: Literal["none", "rule", "llm"] = "none"
    model: str = ""
    engine: Literal["torch", "vllm"] = "torch"
    max_tokens: int = 1024
    timeout: float = 120.0
    concurrency: int = 16
    cache_size: int = 4096


class ProblemsConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    source: str = "arithmetic"
    """``arithmetic`` for the generated family, or a JSONL file."""
    difficulty: int = 1
    train: int = 4096
    test: int = 256


class TrainConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    steps: int = 40
    """The run ends when every learner has consumed this many batches (a batch whose
    groups all scored alike is consumed without a step)."""
    checkpoint_every: int = 10
    console_every: float = 5.0
    """Seconds between console lines and metrics records."""


class EvalConfig(EvalSettings, frozen=True, forbid_unknown_fields=True):
    problems: int = 64
    """Held-out problems evaluated at the end of a run (and by ``--eval``)."""
    before: bool = True
    """Also evaluate before the first step, so the run reports its own rise."""


class ClusterConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Where the run's node processes go. One host by default. With ``hosts`` > 1,
    rank 0 is the head (the conductor, the agents, the judge, and every process that
    ``placement`` puts nowhere else) and every other rank runs ``bin/launch CONFIG
    --join tcp://HEAD:PORT --rank R``, or all ranks run under ``srun bin/launch CONFIG``.
    """

    hosts: int = 1
    port: int = 29517
    """The head's port when ``hosts`` > 1 (on one host it takes any free port). The
    other nodes of a multi-host run listen on the ports after it, each its own, so a
    firewall or a forwarding proxy can be set up in advance: the node processes in
    ``node_processes()`` order from ``port + 1``, then the worker hosts' own nodes."""
    interface: str = ""
    """The address this host's nodes listen on for the other hosts; empty: the first
    non-loopback address of this host's name. One host always uses loopback."""
    advertise: str = ""
    """The address other hosts dial this host's nodes at, when it is not the one they
    listen on (a NAT, or a proxy that forwards each port to this host): every node of
    this host then registers ``tcp://ADVERTISE:PORT`` with the port it listens on. Set
    per host (``--set cluster.advertise=...``); empty: the listen address."""
    placement: dict[str, int] = {}
    """Node process name (``engine/POLICY/I``, ``learner/POLICY``, ``engine/judge/0``)
    to the rank that runs it; a process not named runs on rank 0."""
    join_timeout: float = 600.0
    """How long a worker waits for the head and for a shared run directory's models."""
    restarts: int = 3
    """How often a node process that dies is started again (each counted separately)
    before the run stops with an error; 0: the first death stops it."""
    hung_after: float = 30.0
    """Seconds a node process on the head's host may be declared down by the head's
    heartbeats (hung: SIGSTOPped, or stuck outside Python) while it lives before it is
    killed and started again like one that died; 0: never. Calls to it fail after the
    heartbeat timeout (5 s) already; the grace spares a process only starved of CPU."""
    keys: str = ""
    """A directory made by ``bin/launch keys DIR``, at the same path on every host: every
    link between the run's nodes is then authenticated and encrypted with ZeroMQ CURVE,
    and a node without the keys cannot connect. Required when ``hosts`` > 1; one host
    listens on loopback only."""


class RunConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    name: str = "marsrl-tiny"
    runs_dir: str = "runs"
    seed: int = 0
    """Seeds the embedded models' initialisation and warm start, which problems are
    drawn and in what order, and the conductor's selections: runs that differ only in
    ``seed`` are the repetitions a reported figure is a spread over."""
    imports: list[str] = []
    """Python modules imported before the run starts: where roles and workflows of
    your own register themselves (``docs/adding-an-agent.md``)."""
    policies: dict[str, PolicyConfig] = msgspec.field(
        default_factory=lambda: {"team": PolicyConfig()}
    )
    roles: dict[str, str] = msgspec.field(
        default_factory=lambda: dict.fromkeys(("solver", "verifier", "corrector"), "team")
    )
    """Which policy plays each role: one policy for all is MarsRL's shared model, one
    per role is MAPPA's separate weights."""
    sampling: dict[str, SamplingParams] = {}
    """Per role; a role without an entry samples with ``default_sampling``."""
    default_sampling: SamplingParams = SamplingParams(temperature=0.85, max_tokens=16)
    problems: ProblemsConfig = ProblemsConfig()
    judge: JudgeConfig = JudgeConfig()
    conductor: ConductorConfig = ConductorConfig()
    learner: dict[str, Any] = {}
    """``LearnerConfig`` fields shared by every learner (``policy``, ``engines``,
    ``notify`` and ``checkpoint_dir`` are set by the launcher)."""
    train: TrainConfig = TrainConfig()
    eval: EvalConfig = EvalConfig()
    cluster: ClusterConfig = ClusterConfig()

    def node_processes(self, *, learners: bool = True) -> list[str]:
        """The name of every node process the run starts, engines first."""
        names = [
            f"engine/{policy}/{index}"
            for policy, settings in self.policies.items()
            for index in range(settings.engines)
        ]
        if self.judge.kind == "llm":
            names.append(f"engine/{JUDGE_POLICY}/0")
        if learners:
            names += [f"learner/{policy}" for policy in self.policies]
        return names

    def rank_of(self, process: str) -> int:
        return self.cluster.placement.get(process, 0)

    def cluster_keys(self) -> CurveKeys | None:
        """The CURVE keys every node of the run uses, if ``cluster.keys`` names any."""
        return load_cluster_keys(self.cluster.keys) if self.cluster.keys else None

    def learner_config(self, policy: str, **wiring: Any) -> LearnerConfig:
        """The run's ``learner`` table, under the policy's own ``learner`` settings."""
        own = self.policies[policy].learner
        settings = {**self.learner, **own, "policy": policy, **wiring}
        return msgspec.convert(settings, LearnerConfig)

    def sampling_for(self, role: str) -> SamplingParams:
        return self.sampling.get(role, self.default_sampling)


class ConfigError(ValueError):
    """A run configuration that cannot be used; the message names the field."""


def load_config(path: str | Path | None, overrides: Sequence[str] = ()) -> RunConfig:
    data: dict[str, Any] = {}
    if path is not None:
        try:
            data = tomllib.loads(Path(path).read_text())
        except (OSError, tomllib.TOMLDecodeError) as error:
            raise ConfigError(f"{path}: {error}") from None
    for override in overrides:
        key, sep, value = override.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set {override!r}: expected key.path=value")
        _assign(data, key.split("."), _toml_value(value))
    try:
        config = msgspec.convert(data, RunConfig)
    except msgspec.ValidationError as error:
        raise ConfigError(f"{path or 'the default config'}: {error}") from None
    _check(config)
    return config


def dump_config(config: RunConfig) -> str:
    """The config as TOML that ``load_config`` reads back to an equal config (TOML has
    no null: a field that is None is left out, and its default is None)."""
    return tomli_w.dumps(_without_none(msgspec.to_builtins(config)))


def _without_none(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_none(v) for v in value]
    return value


def _check(config: RunConfig) -> None:
    for module in config.imports:
        try:
            importlib.import_module(module)
        except ImportError as error:
            raise ConfigError(f"$.imports: cannot import {module!r}: {error}") from None
    for role in config.roles:
        if role not in ROLES:
            raise ConfigError(f"$.roles.{role}: no such role; known roles: {sorted(ROLES)}")
    if config.conductor.workflow not in WORKFLOWS:
        raise ConfigError(
            f"$.conductor.workflow: {config.conductor.workflow!r} is not one of {sorted(WORKFLOWS)}"
        )
    for role, policy in config.roles.items():
        if policy not in config.policies:
            raise ConfigError(
                f"$.roles.{role}: policy {policy!r} is not in $.policies "
                f"({sorted(config.policies)})"
            )
    for policy, settings in config.policies.items():
        for role in settings.warm_start_roles:
            if role not in config.roles:
                raise ConfigError(
                    f"$.policies.{policy}.warm_start_roles: {role!r} is not in $.roles "
                    f"({sorted(config.roles)})"
                )
    if config.judge.kind == "llm" and not config.judge.model:
        raise ConfigError("$.judge.model: an llm judge needs a model (a checkpoint directory)")
    if config.conductor.workflow == "mappa" and config.judge.kind == "none":
        raise ConfigError('$.judge.kind: the mappa workflow needs a judge ("rule" or "llm")')
    for role in config.sampling:
        if role not in config.roles:
            raise ConfigError(
                f"$.sampling.{role}: no such role in $.roles ({sorted(config.roles)})"
            )
    cluster = config.cluster
    if cluster.hosts < 1:
        raise ConfigError(f"$.cluster.hosts: at least 1, got {cluster.hosts}")
    if cluster.restarts < 0:
        raise ConfigError(f"$.cluster.restarts: at least 0, got {cluster.restarts}")
    if cluster.hung_after < 0:
        raise ConfigError(f"$.cluster.hung_after: at least 0, got {cluster.hung_after}")
    if cluster.hosts > 1 and not cluster.keys:
        raise ConfigError(
            "$.cluster.keys: a run over several hosts needs keys; create them with "
            "`bin/launch keys DIR` and set cluster.keys to DIR"
        )
    if cluster.keys:
        try:
            load_cluster_keys(cluster.keys)
        except KeysError as error:
            raise ConfigError(f"$.cluster.keys: {error}") from None
    known = config.node_processes()
    for process, rank in cluster.placement.items():
        if process not in known:
            raise ConfigError(
                f"$.cluster.placement.{process}: no such node process; the run has {known}"
            )
        if not 0 <= rank < cluster.hosts:
            raise ConfigError(
                f"$.cluster.placement.{process}: rank {rank} is not in 0..{cluster.hosts - 1}"
            )
    tables = [("$.learner", config.learner)] + [
        (f"$.policies.{policy}.learner", {**config.learner, **settings.learner})
        for policy, settings in config.policies.items()
    ]
    for where, table in tables:
        try:
            msgspec.convert({**table, "policy": "checked"}, LearnerConfig)
        except msgspec.ValidationError as error:
            detail = str(error).replace("`$", f"`{where}")
            if f"`{where}" not in detail:
                detail += f" - at `{where}`"
            raise ConfigError(f"learner settings: {detail}") from None


def _assign(data: dict[str, Any], keys: list[str], value: Any) -> None:
    for key in keys[:-1]:
        inner = data.setdefault(key, {})
        if not isinstance(inner, dict):
            raise ConfigError(f"--set {'.'.join(keys)}: {key!r} is not a table")
        data = inner
    data[keys[-1]] = value


def _toml_value(text: str) -> Any:
    try:
        return tomllib.loads(f"value = {text}")["value"]
    except tomllib.TOMLDecodeError:
        return text

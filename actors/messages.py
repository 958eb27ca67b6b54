"""The domain messages: the vocabulary that agents, engines, rewards and learners share.

Every message is a frozen, tagged msgspec Struct (see ``runtime.Message``). Token ids,
logprobs and versions are numpy arrays, so they travel as raw frames rather than as
msgpack lists; tensors of a weight update travel as ``Blob`` frames. Messages evolve only
by adding fields with defaults.
"""

from __future__ import annotations

import numpy as np

from runtime import Blob, Message, Request


class Problem(Message, frozen=True):
    """One input to an agent team: the ``text`` the first agent sees and the reference
    ``answer`` rewards check against. ``split`` is train or test (held out);
    ``difficulty`` orders generated problems for a curriculum (0 for a data file)."""

    problem_id: str
    text: str
    answer: str
    split: str = "train"
    difficulty: int = 0
    metadata: dict[str, str] = {}


class SamplingParams(Message, frozen=True):
    """How to sample one request; the engines and the learner read them alike.

    ``temperature`` 0 is greedy. ``top_k`` 0 and ``top_p`` 1.0 switch those filters off.
    A completion ends at ``max_tokens``, at the tokenizer's end-of-sequence token, or
    when its text contains one of ``stop`` (the text is cut before the stop string; the
    tokens, which were sampled and carry logprobs, are all kept). ``seed`` makes a
    request's samples reproducible on the same engine and weights. ``ignore_eos`` keeps
    generating past the end-of-sequence token (for benchmarks of fixed lengths).
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_tokens: int = 64
    stop: list[str] = []
    seed: int | None = None
    ignore_eos: bool = False


class ChatTurn(Message, frozen=True):
    role: str
    content: str


class SampleTimings(Message, frozen=True):
    """Seconds from the engine's receipt of the request."""

    queued: float
    first_token: float
    finished: float


class Sample(Message, frozen=True):
    """One completion. ``logprobs[i]`` is the log-probability of ``completion_ids[i]``
    under the policy that sampled it (see ``actors.sampling``), and ``versions[i]`` is
    that policy's version: a weight update in the middle of a completion shows here."""

    index: int
    prompt_ids: np.ndarray
    completion_ids: np.ndarray
    logprobs: np.ndarray
    versions: np.ndarray
    finish_reason: str
    text: str
    timings: SampleTimings


class Generation(Message, frozen=True):
    request_id: str
    policy: str
    samples: list[Sample]


class Generate(Request[Generation], frozen=True):
    """Ask an engine for ``sampling.n`` completions of one prompt: either ``prompt_ids``
    or a ``chat`` rendered with the policy's chat template (with the generation prompt)."""

    request_id: str
    sampling: SamplingParams = SamplingParams()
    prompt_ids: np.ndarray | None = None
    chat: list[ChatTurn] = []


class WeightsApplied(Message, frozen=True):
    """An engine's acknowledgement of a weight bucket. ``applied`` is true once the
    bucket completed its version and the engine generates with it; ``pause_s`` is how
    long generation stood still for the update."""

    policy: str
    version: int
    applied: bool
    pause_s: float = 0.0


class WeightBucket(Request[WeightsApplied], frozen=True):
    """Bucket ``index`` of ``count`` of the named tensors of policy version ``version``.

    Each tensor is raw bytes in a ``Blob`` with its dtype (torch's name, e.g.
    ``float32``, ``bfloat16``) and shape beside it. The engine applies a version once it
    holds all its buckets, between two decode steps.
    """

    policy: str
    version: int
    index: int
    count: int
    names: list[str]
    dtypes: list[str]
    shapes: list[list[int]]
    data: list[Blob]


class TensorSpec(Message, frozen=True):
    name: str
    dtype: str
    shape: list[int]


class WeightGroupJoined(Message, frozen=True):
    policy: str
    group: str
    rank: int


class JoinWeightGroup(Request[WeightGroupJoined], frozen=True):
    """Join the learner's torch.distributed weight group ``group`` as ``rank``: a store
    at ``host``:``port``, ``world_size`` members, ``backend`` gloo or nccl, and
    ``timeout_s`` for joining and for every broadcast. Replaces any group joined before."""

    policy: str
    group: str
    host: str
    port: int
    rank: int
    world_size: int
    backend: str
    timeout_s: float


class BroadcastWeights(Request[WeightsApplied], frozen=True):
    """Receive version ``version`` through the weight group ``group`` (the tensors of
    ``tensors``, in buckets of about ``bucket_bytes``), then apply it as a
    ``WeightBucket`` version is applied. The learner broadcasts while this call runs."""

    policy: str
    version: int
    group: str
    tensors: list[TensorSpec]
    bucket_bytes: int


class EngineStats(Message, frozen=True):
    policy: str
    engine: str
    version: int
    running: int
    waiting: int
    generated_tokens: int
    decode_steps: int
    updates: int
    last_pause_s: float
    busy_s: float = 0.0
    """Seconds the engine actor had at least one ``Generate`` running, since it started."""
    sequence_s: float = 0.0
    """Sequence-seconds: the samples it was asked for, integrated over the time they ran;
    over ``max_batch`` times the elapsed time, how full the engine's batch was on average."""


class GetEngineStats(Request[EngineStats], frozen=True):
    pass


class Segment(Message, frozen=True):
    """One agent action, ready for the reward stage: what was asked (``prompt_ids``),
    what the policy answered (``completion_ids``), the behaviour ``logprobs`` and policy
    ``versions`` of every completion token, and where it sits in its episode.

    ``group`` names the GRPO group it belongs to (every sample of one role on one
    input) and ``group_size`` how many samples make it complete; ``parent_id`` is the
    sample it continues ("" for a first action).
    """

    segment_id: str
    episode_id: str
    sample_id: str
    parent_id: str
    group: str
    group_size: int
    role: str
    policy: str
    prompt_ids: np.ndarray
    completion_ids: np.ndarray
    logprobs: np.ndarray
    versions: np.ndarray
    finish_reason: str
    text: str = ""
    observation: str = ""
    timings: SampleTimings | None = None
    sampling: SamplingParams = SamplingParams()
    """How the completion was sampled: the learner recomputes logprobs the same way."""


class ScoredSegment(Message, frozen=True):
    """A segment and its reward; ``parts`` are the named terms the reward was built
    from (an answer check, a judge's score), for logging. Sent one-way to the policy's
    learner, whose bounded mailbox is the pipeline's backpressure."""

    segment: Segment
    reward: float
    parts: dict[str, float] = {}


class AgentOutput(Message, frozen=True):
    """One action and what the role's parser read from it: an ``answer`` ("" when
    none parsed), a ``verdict`` (Correct / Wrong / "") and the ``code`` it wrote."""

    segment: Segment
    answer: str = ""
    verdict: str = ""
    code: str = ""


class TaskResult(Message, frozen=True):
    task_id: str
    outputs: list[AgentOutput]


class Task(Request[TaskResult], frozen=True):
    """Ask an agent for a group of ``group_size`` actions of ``role`` on one input.
    ``inputs`` are what the role's prompt is built from (``problem``, and for later
    roles ``solution`` and ``report``); ``parent_id`` is the sample this continues."""

    task_id: str
    episode_id: str
    role: str
    inputs: dict[str, str]
    group_size: int
    parent_id: str = ""
    sampling: SamplingParams | None = None
    """None: the agent's own sampling parameters (``n`` is ``group_size`` either way)."""


class FlushBatch(Message, frozen=True):
    """Train now on the complete groups (or counted actions) held, even if fewer than a
    batch. The conductor sends it when nothing is running and admission waits for a
    batch that the data already sent cannot fill. The learner answers with a
    ``LearnerProgress`` whose ``flushed`` is set, whether it trained or not."""

    policy: str


class WeightsWanted(Message, frozen=True):
    """An engine that has just started asks its learner for the current weights. A
    restarted engine serves the initial ones, and every token it samples is then too
    stale to train on: the learner takes no step, so it would publish nothing and the
    run would stand still. The learner sends them if the engine is behind."""

    engine: str


class LearnerProgress(Message, frozen=True):
    """Sent one-way by a learner after every step to the actors in its ``notify``
    list: the conductor's admission control follows the policies' versions by it."""

    policy: str
    version: int
    metrics: dict[str, float] = {}
    batches: int = 0
    """Batches consumed: steps, and batches skipped because every group in them had
    equal rewards (they take data in without making a version)."""
    flushed: bool = False
    """This answers a ``FlushBatch``: sent also when the learner held nothing to train
    on, so the conductor learns that only new episodes can fill its next batch."""


class LearnerStats(Message, frozen=True):
    """A learner's progress: ``version`` counts its optimizer steps; ``published`` is
    the newest version every engine of the policy acknowledged, ``engines`` the newest
    each one applied; ``staleness`` counts
    accepted tokens by how many versions behind the learner they were sampled;
    ``rejected`` counts refused segments by reason; ``skipped_batches`` batches whose
    groups all had equal rewards (no gradient, no step)."""

    policy: str
    version: int
    steps: int
    published: int
    engines: dict[str, int]
    trained_segments: int
    held_segments: int
    skipped_batches: int
    staleness: dict[int, int]
    rejected: dict[str, int]
    last_metrics: dict[str, float]
    train_s: float = 0.0
    """Seconds this learner spent in optimizer steps since it started; the rest of its
    time it waited for data or published weights."""
    publish_s: float = 0.0
    """Seconds spent publishing weights to the engines."""


class GetLearnerStats(Request[LearnerStats], frozen=True):
    pass

"""MAPPA's coach: a feedback model that scores every agent action from 0 to 10.

Process rewards move credit assignment from the episode to each action: the coach sees
the acting agent's role, what it was given, what it did and what its tool returned (and,
for the roles in ``reference_roles``, the reference answer) and ends its reply with
``PROCESS_SCORE: N``. The action's reward is N / 10. A reply without a score is re-asked
once with a format reminder; if it still has none, or the coach does not answer in
time, the action gets the neutral 5.0, and every way a score was obtained is counted.

* ``LLMJudge`` asks a frozen model through an engine (any ``generate`` callable), at
  temperature 0, with a concurrency limit, a timeout per request and an LRU cache.
* ``RuleJudge`` stands in for the coach on generated tasks whose answer is known, so
  the MAPPA pipeline can learn on CPU with models too small to coach each other.
* ``JudgeActor`` serves any judge on the runtime; ``RemoteJudge`` is the judge a
  conductor on another node holds to reach it.
"""

from __future__ import annotations

import hashlib
import itertools
import re
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable, Collection
from typing import Literal, Protocol

import anyio
import anyio.lowlevel
import msgspec

from actors.messages import ChatTurn, Generate, Generation, SamplingParams
from rewards.answers import extract_answer, is_equivalent
from runtime import Actor, ActorRef, Message, Node, Request

__all__ = [
    "FALLBACK_SCORE",
    "GetJudgeStats",
    "Judge",
    "JudgeActor",
    "JudgeRequest",
    "JudgeSource",
    "JudgeStats",
    "JudgeVerdict",
    "LLMJudge",
    "RemoteJudge",
    "RuleJudge",
    "engine_generate",
    "judge_prompt",
    "parse_score",
]

FALLBACK_SCORE = 5.0
"""The neutral score of an action the coach could not score."""

JudgeSource = Literal["parsed", "retried", "fallback", "timeout", "cached", "rule"]
"""How a score was obtained: read from the first reply, from the re-asked reply, the
fallback after two unreadable replies, the fallback after a timeout, from the cache,
or by rule."""

_SCORE = re.compile(r"PROCESS_SCORE[\s:=*]*([-+]?(?:\d+(?:\.\d+)?|\.\d+))")

_INSTRUCTIONS = (
    "You coach a team of AI agents that work on a task together, one action at a time. "
    "Review the single action below. Judge whether it does its role's job correctly, "
    "whether it uses its tools well, and whether it moves the team toward a correct "
    "final result; do not judge the other agents. Reason briefly, then end your reply "
    "with one line of the form\nPROCESS_SCORE: N\nwhere N is a number from 0 (wrong, "
    "harmful or useless) to 10 (correct and as helpful as an action can be)."
)
_REMINDER = (
    "Your reply did not end with a score line. Reply with one line only, of the form "
    "PROCESS_SCORE: N, where N is a number from 0 to 10."
)


class JudgeVerdict(Message, frozen=True):
    """A coach's ``score`` (0 to 10) of one action, the ``reward`` it gives (score / 10)
    and how the score was obtained."""

    score: float
    reward: float
    source: JudgeSource


class JudgeRequest(Request[JudgeVerdict], frozen=True):
    """One action to score: the acting agent's ``role``, the ``input`` it acted on, its
    ``output``, what its tool returned (``observation``, "" when none) and the task's
    ``reference`` answer ("" when unknown). An LLM coach is shown the reference only
    for the roles its ``LLMJudge`` names; the rule judge always checks against it."""

    role: str
    input: str
    output: str
    observation: str = ""
    reference: str = ""


class JudgeStats(Message, frozen=True):
    """Verdicts given, by how they were obtained. A format failure was re-asked for
    every ``retried`` and every ``fallback`` verdict. ``errors`` counts requests whose
    judge raised; ``in_flight`` requests are being scored, ``waiting`` wait for a slot."""

    requests: int = 0
    parsed: int = 0
    retried: int = 0
    fallback: int = 0
    timeouts: int = 0
    cached: int = 0
    rule: int = 0
    errors: int = 0
    cache_size: int = 0
    in_flight: int = 0
    waiting: int = 0


class GetJudgeStats(Request[JudgeStats], frozen=True):
    pass


class Judge(Protocol):
    """Scores one agent action; what a workflow holds to obtain process rewards."""

    async def score(self, request: JudgeRequest) -> JudgeVerdict: ...


def _verdict(score: float, source: JudgeSource) -> JudgeVerdict:
    return JudgeVerdict(score=score, reward=score / 10, source=source)


def parse_score(text: str) -> float | None:
    """The score of a coach's reply: the number after its last ``PROCESS_SCORE:``
    (decimals allowed, markdown around the colon tolerated). None when there is none
    or it lies outside 0..10, which is a format failure rather than a score to clamp."""
    found = _SCORE.findall(text)
    if not found:
        return None
    score = float(found[-1])
    return score if 0.0 <= score <= 10.0 else None


def judge_prompt(
    request: JudgeRequest,
    *,
    reference_roles: Collection[str] = ("final_verifier",),
    max_field_chars: int = 4000,
) -> list[ChatTurn]:
    """The chat that asks a coach to score ``request``. The reference answer is shown
    only to judge roles in ``reference_roles`` (MAPPA shows it for the final verifier);
    each field is cut to ``max_field_chars`` characters, keeping its start and end."""
    sections = [
        f"Role of the agent: {request.role}",
        f"What the agent was given:\n{_clip(request.input, max_field_chars)}",
        f"What the agent did:\n{_clip(request.output, max_field_chars)}",
        "What its tool returned:\n"
        + (_clip(request.observation, max_field_chars) if request.observation else "(nothing)"),
    ]
    if request.reference and request.role in reference_roles:
        sections.append(f"Reference answer: {_clip(request.reference, max_field_chars)}")
    sections.append("Score this action. End with the line PROCESS_SCORE: N.")
    return [ChatTurn("system", _INSTRUCTIONS), ChatTurn("user", "\n\n".join(sections))]


def _clip(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[... {len(text) - 2 * half} characters cut ...]\n{text[-half:]}"


class _Tally:
    """Verdicts counted by source, and requests whose judge raised."""

    def __init__(self) -> None:
        self.sources: Counter[str] = Counter()
        self.errors = 0

    def add(self, given: JudgeVerdict) -> JudgeVerdict:
        self.sources[given.source] += 1
        return given

    def snapshot(self, *, cache_size: int = 0, in_flight: int = 0, waiting: int = 0) -> JudgeStats:
        counts = self.sources
        return JudgeStats(
            requests=sum(counts.values()) + self.errors,
            parsed=counts["parsed"],
            retried=counts["retried"],
            fallback=counts["fallback"],
            timeouts=counts["timeout"],
            cached=counts["cached"],
            rule=counts["rule"],
            errors=self.errors,
            cache_size=cache_size,
            in_flight=in_flight,
            waiting=waiting,
        )

    def line(self) -> str:
        c = self.sources
        return (
            f"parsed {c['parsed']} | retried {c['retried']} | fallback {c['fallback']} | "
            f"timeouts {c['timeout']} | cached {c['cached']}"
        )


class LLMJudge:
    """Scores actions by asking a coach model through ``generate`` (an engine call,
    see ``engine_generate``), greedily, so the same prompt always gets the same score.

    At most ``concurrency`` requests are with the coach at once; the others wait for a
    slot. Each request (its re-ask included) gets ``timeout`` seconds with the coach,
    then the fallback score. Scores read from a reply are kept in an LRU cache of
    ``cache_size`` prompts, keyed by a SHA-256 of the prompt; fallbacks are not, so a
    coach that timed out is asked again next time. An error of ``generate`` other than
    a timeout (the engine refused the prompt, its node is down) is raised to the caller.
    """

    def __init__(
        self,
        generate: Callable[[Generate], Awaitable[Generation]],
        *,
        max_tokens: int = 1024,
        timeout: float = 120.0,
        concurrency: int = 16,
        cache_size: int = 4096,
        reference_roles: Collection[str] = ("final_verifier",),
        max_field_chars: int = 4000,
    ) -> None:
        if timeout <= 0 or concurrency < 1 or cache_size < 0:
            raise ValueError(
                f"LLMJudge needs timeout > 0, concurrency >= 1 and cache_size >= 0; got "
                f"timeout={timeout}, concurrency={concurrency}, cache_size={cache_size}"
            )
        self._generate = generate
        self.sampling = SamplingParams(temperature=0.0, max_tokens=max_tokens)
        self.timeout = timeout
        self.cache_size = cache_size
        self.reference_roles = frozenset(reference_roles)
        self.max_field_chars = max_field_chars
        self._limiter = anyio.CapacityLimiter(concurrency)
        self._cache: OrderedDict[bytes, float] = OrderedDict()
        self._ids = itertools.count()
        self._tally = _Tally()

    async def score(self, request: JudgeRequest) -> JudgeVerdict:
        chat = judge_prompt(
            request, reference_roles=self.reference_roles, max_field_chars=self.max_field_chars
        )
        key = hashlib.sha256(msgspec.msgpack.encode(chat)).digest()
        cached = self._cache.get(key)
        if cached is not None:
            self._cache.move_to_end(key)
            await anyio.lowlevel.checkpoint()
            return self._tally.add(_verdict(cached, "cached"))
        async with self._limiter:
            try:
                with anyio.fail_after(self.timeout):
                    score, source = await self._ask(chat)
            except TimeoutError:
                return self._tally.add(_verdict(FALLBACK_SCORE, "timeout"))
        if source != "fallback":
            self._remember(key, score)
        return self._tally.add(_verdict(score, source))

    def statistics(self) -> JudgeStats:
        limiter = self._limiter.statistics()
        return self._tally.snapshot(
            cache_size=len(self._cache),
            in_flight=limiter.borrowed_tokens,
            waiting=limiter.tasks_waiting,
        )

    def __repr__(self) -> str:
        limiter = self._limiter.statistics()
        return (
            f"<LLMJudge [{self._tally.line()} | in flight {limiter.borrowed_tokens}/"
            f"{limiter.total_tokens} | cache {len(self._cache)}/{self.cache_size}]>"
        )

    async def _ask(self, chat: list[ChatTurn]) -> tuple[float, JudgeSource]:
        reply = await self._reply(chat)
        score = parse_score(reply)
        if score is not None:
            return score, "parsed"
        again = [*chat, ChatTurn("assistant", reply), ChatTurn("user", _REMINDER)]
        score = parse_score(await self._reply(again))
        if score is not None:
            return score, "retried"
        return FALLBACK_SCORE, "fallback"

    async def _reply(self, chat: list[ChatTurn]) -> str:
        request = Generate(f"judge-{next(self._ids)}", self.sampling, chat=chat)
        generation = await self._generate(request)
        return generation.samples[0].text if generation.samples else ""

    def _remember(self, key: bytes, score: float) -> None:
        if self.cache_size == 0:
            return
        self._cache[key] = score
        self._cache.move_to_end(key)
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)


class RuleJudge:
    """A stand-in for the coach on tasks whose answer is known (the generated
    arithmetic problems), so the MAPPA pipeline learns on CPU with tiny models.

    An action scores ``correct`` (10) if its output holds an answer equivalent to the
    request's reference, ``parsed`` (2) if it holds some other answer, ``nothing`` (0)
    if none parses. For roles in ``observation_roles`` (the code executor, whose
    answer is what its code printed) only the tool's observation counts: when an
    answer written in the executor's text counted too, the tiny executors of the MAPPA
    run stopped writing code and guessed in ``\\boxed{}`` like the Solver, and the
    tool went unused. Without a reference there is nothing to check: the neutral
    ``FALLBACK_SCORE``.
    """

    def __init__(
        self,
        *,
        correct: float = 10.0,
        parsed: float = 2.0,
        nothing: float = 0.0,
        observation_roles: Collection[str] = ("code_executor",),
    ) -> None:
        self.scores = (correct, parsed, nothing)
        self.observation_roles = frozenset(observation_roles)
        self._tally = _Tally()

    async def score(self, request: JudgeRequest) -> JudgeVerdict:
        await anyio.lowlevel.checkpoint()
        return self._tally.add(_verdict(self.rule_score(request), "rule"))

    def rule_score(self, request: JudgeRequest) -> float:
        correct, parsed, nothing = self.scores
        if not request.reference:
            return FALLBACK_SCORE
        observed = request.role in self.observation_roles
        answer = extract_answer(request.observation if observed else request.output)
        if answer is None:
            return nothing
        return correct if is_equivalent(answer, request.reference) else parsed

    def statistics(self) -> JudgeStats:
        return self._tally.snapshot()

    def __repr__(self) -> str:
        return f"<RuleJudge [scored {self._tally.sources['rule']}]>"


class JudgeActor(Actor):
    """Serves a judge on the runtime: answers ``JudgeRequest`` with a ``JudgeVerdict``
    and ``GetJudgeStats`` with the verdicts it gave. Its concurrency is high so that the
    judge's own limit, not the mailbox, bounds the work with the coach."""

    inbox = JudgeRequest | GetJudgeStats
    mailbox_size = 1024
    concurrency = 1024

    def __init__(self, judge: Judge) -> None:
        self.judge = judge
        self._tally = _Tally()
        self._in_flight = 0

    async def handle(self, message: JudgeRequest | GetJudgeStats) -> JudgeVerdict | JudgeStats:
        if isinstance(message, GetJudgeStats):
            return self._tally.snapshot(in_flight=self._in_flight)
        self._in_flight += 1
        try:
            return self._tally.add(await self.judge.score(message))
        except Exception:
            self._tally.errors += 1
            raise
        finally:
            self._in_flight -= 1


class RemoteJudge:
    """The judge of a workflow whose coach is a ``JudgeActor`` at ``ref``, called from
    ``node`` (or an actor) with ``timeout`` seconds per request."""

    def __init__(self, caller: Node | Actor, ref: ActorRef, *, timeout: float = 600.0) -> None:
        self.caller = caller
        self.ref = ref
        self.timeout = timeout

    async def score(self, request: JudgeRequest) -> JudgeVerdict:
        return await self.caller.call(self.ref, request, timeout=self.timeout)

    def __repr__(self) -> str:
        return f"<RemoteJudge {self.ref}>"


def engine_generate(
    caller: Node | Actor, engine: ActorRef
) -> Callable[[Generate], Awaitable[Generation]]:
    """An ``LLMJudge``'s ``generate`` that calls the engine actor at ``engine`` from
    ``caller``; the judge's timeout bounds every call."""

    async def generate(request: Generate) -> Generation:
        return await caller.call(engine, request)

    return generate

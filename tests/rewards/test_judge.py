"""The coach's score is read from its last ``PROCESS_SCORE``; a reply without one is
re-asked once, then falls back to 5.0, as does a coach that does not answer in time;
repeated prompts come from the cache; concurrency is limited; every outcome is counted.
The rule judge scores by the known answer, and both serve behind the judge actor."""

from __future__ import annotations

import numpy as np
import pytest
import trio
import trio.testing

from actors.messages import ChatTurn, Generate, Generation, Sample, SampleTimings
from rewards.judge import (
    FALLBACK_SCORE,
    GetJudgeStats,
    JudgeActor,
    JudgeRequest,
    JudgeStats,
    JudgeVerdict,
    LLMJudge,
    RemoteJudge,
    RuleJudge,
    engine_generate,
    judge_prompt,
    parse_score,
)
from runtime import Actor
from runtime.testing import open_cluster

REQUEST = JudgeRequest(role="problem_solver", input="What is 3 + 4?", output="\\boxed{7}")


def generation(request: Generate, text: str) -> Generation:
    empty = np.zeros(0, dtype=np.int32)
    sample = Sample(
        0, empty, empty, empty.astype(np.float32), empty, "stop", text, SampleTimings(0, 0, 0)
    )
    return Generation(request.request_id, "coach", [sample])


class ScriptedCoach:
    """A fake ``generate``: answers with its replies in order, records every request."""

    def __init__(self, *replies: str) -> None:
        self.replies = list(replies)
        self.requests: list[Generate] = []

    async def __call__(self, request: Generate) -> Generation:
        self.requests.append(request)
        await trio.lowlevel.checkpoint()
        return generation(request, self.replies.pop(0))


@pytest.mark.parametrize(
    ("text", "score"),
    [
        ("Fine work.\nPROCESS_SCORE: 7", 7.0),
        ("PROCESS_SCORE: 7.5", 7.5),
        ("**PROCESS_SCORE:** 9", 9.0),
        ("PROCESS_SCORE: 3 ... on reflection PROCESS_SCORE: 8/10", 8.0),
        ("PROCESS_SCORE: 0", 0.0),
        ("PROCESS_SCORE: 10.0", 10.0),
        ("PROCESS_SCORE: 11", None),
        ("PROCESS_SCORE: -1", None),
        ("PROCESS_SCORE: 7 then PROCESS_SCORE: 12", None),
        ("PROCESS_SCORE: N", None),
        ("I would give it a 7.", None),
        ("", None),
    ],
)
def test_the_last_score_line_is_read_and_out_of_range_is_refused(
    text: str, score: float | None
) -> None:
    assert parse_score(text) == score


def test_the_prompt_shows_the_reference_only_to_the_final_verifier() -> None:
    final = JudgeRequest("final_verifier", "x", "\\boxed{7}", "7\n", reference="7")
    solver = JudgeRequest("problem_solver", "x", "\\boxed{7}", reference="7")
    system, user = judge_prompt(final)
    assert system.role == "system" and "PROCESS_SCORE: N" in system.content
    assert "Reference answer: 7" in user.content and "final_verifier" in user.content
    assert "Reference answer" not in judge_prompt(solver)[1].content


def test_long_fields_are_cut_in_the_middle() -> None:
    long = JudgeRequest("solver", "start" + "x" * 100_000 + "end", "out")
    user = judge_prompt(long, max_field_chars=100)[1].content
    assert "start" in user and "end" in user and "characters cut" in user
    assert len(user) < 1000


@pytest.mark.anyio
async def test_a_score_is_asked_greedily_and_read() -> None:
    coach = ScriptedCoach("Solid.\nPROCESS_SCORE: 7.5")
    judge = LLMJudge(coach, max_tokens=64)
    assert await judge.score(REQUEST) == JudgeVerdict(7.5, 0.75, "parsed")
    (request,) = coach.requests
    assert request.sampling.temperature == 0 and request.sampling.max_tokens == 64
    assert request.chat == judge_prompt(REQUEST)
    assert judge.statistics() == JudgeStats(requests=1, parsed=1, cache_size=1)


@pytest.mark.anyio
async def test_a_format_failure_is_asked_again_once() -> None:
    coach = ScriptedCoach("Looks fine to me.", "PROCESS_SCORE: 8")
    judge = LLMJudge(coach)
    assert await judge.score(REQUEST) == JudgeVerdict(8.0, 0.8, "retried")
    first, second = coach.requests
    assert second.chat[: len(first.chat)] == first.chat
    assert second.chat[len(first.chat)] == ChatTurn("assistant", "Looks fine to me.")
    assert "PROCESS_SCORE: N" in second.chat[-1].content
    assert judge.statistics().retried == 1


@pytest.mark.anyio
async def test_two_format_failures_fall_back_and_are_not_cached() -> None:
    coach = ScriptedCoach("hmm", "still no score", "PROCESS_SCORE: 6")
    judge = LLMJudge(coach)
    assert await judge.score(REQUEST) == JudgeVerdict(FALLBACK_SCORE, 0.5, "fallback")
    assert await judge.score(REQUEST) == JudgeVerdict(6.0, 0.6, "parsed")
    stats = judge.statistics()
    assert (stats.requests, stats.fallback, stats.parsed, stats.cached) == (2, 1, 1, 0)


@pytest.mark.anyio
async def test_a_repeated_prompt_comes_from_a_bounded_cache() -> None:
    other = JudgeRequest("problem_solver", "What is 1 + 1?", "\\boxed{2}")
    coach = ScriptedCoach("PROCESS_SCORE: 9", "PROCESS_SCORE: 4", "PROCESS_SCORE: 9")
    judge = LLMJudge(coach, cache_size=1)
    assert (await judge.score(REQUEST)).source == "parsed"
    assert await judge.score(REQUEST) == JudgeVerdict(9.0, 0.9, "cached")
    assert (await judge.score(other)).score == 4.0
    assert (await judge.score(REQUEST)).source == "parsed"
    assert len(coach.requests) == 3
    assert judge.statistics() == JudgeStats(requests=4, parsed=3, cached=1, cache_size=1)


@pytest.mark.trio
async def test_a_coach_that_does_not_answer_times_out_to_the_fallback(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def silent(request: Generate) -> Generation:
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    judge = LLMJudge(silent, timeout=30)
    started = trio.current_time()
    assert await judge.score(REQUEST) == JudgeVerdict(FALLBACK_SCORE, 0.5, "timeout")
    assert trio.current_time() - started == pytest.approx(30)
    assert judge.statistics() == JudgeStats(requests=1, timeouts=1)


@pytest.mark.anyio
async def test_an_engine_error_reaches_the_caller() -> None:
    async def broken(request: Generate) -> Generation:
        raise ValueError("prompt too long")

    with pytest.raises(ValueError, match="prompt too long"):
        await LLMJudge(broken).score(REQUEST)


@pytest.mark.anyio
async def test_at_most_concurrency_requests_are_with_the_coach() -> None:
    release = trio.Event()
    active = peak = 0

    async def slow(request: Generate) -> Generation:
        nonlocal active, peak
        active += 1
        peak = max(peak, active)
        await release.wait()
        active -= 1
        return generation(request, "PROCESS_SCORE: 5")

    judge = LLMJudge(slow, concurrency=2)
    verdicts: list[JudgeVerdict] = []

    async def score(i: int) -> None:
        verdicts.append(await judge.score(JudgeRequest("solver", f"problem {i}", "out")))

    async with trio.open_nursery() as nursery:
        for i in range(5):
            nursery.start_soon(score, i)
        await trio.testing.wait_all_tasks_blocked()
        stats = judge.statistics()
        assert (stats.in_flight, stats.waiting) == (2, 3)
        assert repr(judge).endswith("| in flight 2/2 | cache 0/4096]>")
        release.set()
    assert peak == 2 and len(verdicts) == 5
    assert judge.statistics().parsed == 5


@pytest.mark.parametrize(
    ("request_", "score"),
    [
        (JudgeRequest("final_verifier", "", "So \\boxed{\\frac{14}{2}}.", reference="7"), 10.0),
        (JudgeRequest("final_verifier", "", "So \\boxed{8}.", reference="7"), 2.0),
        (JudgeRequest("final_verifier", "", "I am not sure.", reference="7"), 0.0),
        (JudgeRequest("problem_solver", "", "\\boxed{7}"), FALLBACK_SCORE),
        (JudgeRequest("code_executor", "", "print(3 + 4)", "7\n", reference="7"), 10.0),
        (JudgeRequest("code_executor", "", "\\boxed{7}", "no code was given", reference="7"), 0.0),
        (JudgeRequest("final_verifier", "", "Checked it.", "7\n", reference="7"), 0.0),
    ],
)
@pytest.mark.anyio
async def test_the_rule_judge_scores_by_the_known_answer(
    request_: JudgeRequest, score: float
) -> None:
    judge = RuleJudge()
    assert await judge.score(request_) == JudgeVerdict(score, score / 10, "rule")
    assert judge.statistics() == JudgeStats(requests=1, rule=1)


class ScriptedEngine(Actor):
    """An engine actor whose model always gives the same score."""

    inbox = Generate
    concurrency = 16

    async def handle(self, request: Generate) -> Generation:
        return generation(request, "Reasonable.\nPROCESS_SCORE: 6")


@pytest.mark.anyio
async def test_the_judge_actor_serves_a_rule_judge_and_counts() -> None:
    async with open_cluster("head", "judge") as (head, node):
        ref = await node.spawn("judge", lambda: JudgeActor(RuleJudge()))
        right = JudgeRequest("final_verifier", "", "\\boxed{7}", reference="7")
        wrong = JudgeRequest("final_verifier", "", "\\boxed{6}", reference="7")
        assert await head.call(ref, right, timeout=10) == JudgeVerdict(10.0, 1.0, "rule")
        assert await RemoteJudge(head, ref).score(wrong) == JudgeVerdict(2.0, 0.2, "rule")
        stats = await head.call(ref, GetJudgeStats(), timeout=10)
        assert stats == JudgeStats(requests=2, rule=2)


@pytest.mark.anyio
async def test_the_judge_actor_asks_an_llm_coach_through_an_engine_actor() -> None:
    async with open_cluster("head", "judge") as (head, node):
        engine = await head.spawn("engine/coach/0", ScriptedEngine)
        ref = await node.spawn(
            "judge", lambda: JudgeActor(LLMJudge(engine_generate(node, engine), timeout=10))
        )
        judge = RemoteJudge(head, ref, timeout=10)
        assert await judge.score(REQUEST) == JudgeVerdict(6.0, 0.6, "parsed")
        assert await judge.score(REQUEST) == JudgeVerdict(6.0, 0.6, "cached")
        stats = await head.call(ref, GetJudgeStats(), timeout=10)
        assert (stats.requests, stats.parsed, stats.cached, stats.errors) == (2, 1, 1, 0)

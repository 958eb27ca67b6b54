"""The run's ledger: the audit finds segments lost or trained twice across a learner's
resumes, problems a killed run left unfinished, and the resumed run's problem stream
admits those again before it goes on where the killed one stopped drawing."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import msgspec

from actors.launch import endless, problem_stream, problems_of
from actors.ledger import (
    CONDUCTOR,
    LedgerWriter,
    audit,
    audit_learner,
    audit_problems,
    learner_ledger,
    read_ledger,
    readmissions,
)
from actors.run_config import load_config

CONFIG = Path(__file__).resolve().parent.parent / "configs" / "marsrl-tiny.toml"


def accepted(*ids: str) -> list[dict[str, Any]]:
    return [{"event": "accepted", "segment": sid} for sid in ids]


def batch(version: int, *ids: str, stepped: bool = True) -> dict[str, Any]:
    return {"event": "batch", "version": version, "stepped": stepped, "segments": list(ids)}


def resumed(version: int, consumed: int) -> dict[str, Any]:
    return {"event": "resumed", "version": version, "consumed": consumed}


def stopped(version: int, *held: str) -> dict[str, Any]:
    return {"event": "stopped", "version": version, "held": list(held)}


def test_a_learner_killed_after_its_checkpoint_trains_those_batches_again_once() -> None:
    records = [
        *accepted("a", "b", "c", "d", "e", "f"),
        batch(1, "a", "b"),
        batch(2, "c", "d"),  # after the checkpoint of version 1; then killed
        resumed(1, 2),
        batch(2, "c", "d"),
        batch(3, "e", "f"),
        stopped(3),
    ]
    result = audit_learner("team", records)
    assert (result.lost, result.duplicated, result.contradictions) == ([], [], [])
    assert (result.trained, result.steps, result.version) == (6, 3, 3)
    assert (result.resumes, result.retrained_batches) == (1, 1)


def test_a_segment_in_two_batches_is_trained_twice() -> None:
    records = [*accepted("a", "b", "c"), batch(1, "a", "b"), batch(2, "b", "c"), stopped(2)]
    assert audit_learner("team", records).duplicated == ["b"]


def test_an_accepted_segment_neither_trained_nor_held_is_lost() -> None:
    records = [*accepted("a", "b", "c", "d"), batch(1, "a", "b"), stopped(1, "c")]
    result = audit_learner("team", records)
    assert (result.lost, result.held) == (["d"], 1)


def test_a_resume_that_does_not_match_the_batches_before_it_is_a_contradiction() -> None:
    records = [*accepted("a", "b"), batch(1, "a"), batch(2, "b"), resumed(1, 2), stopped(2)]
    assert audit_learner("team", records).contradictions


def test_versions_that_go_back_are_a_contradiction() -> None:
    records = [
        *accepted("a", "b"),
        batch(2, "a"),
        batch(1, "b"),
        {"event": "published", "version": 2},
        {"event": "published", "version": 1},
        stopped(1),
    ]
    assert len(audit_learner("team", records).contradictions) == 2


def test_a_learner_whose_last_life_never_stopped_is_reported() -> None:
    records = [*accepted("a"), batch(1, "a")]
    assert audit_learner("team", records).contradictions == [
        "the learner's last record is not its stop"
    ]


def admitted(problem: str, again: str | None = None) -> dict[str, Any]:
    text = problem.split("@")[0]
    return {
        "event": "admitted",
        "problem": problem,
        "again": again,
        "input": {"problem_id": problem, "text": text, "answer": "1"},
    }


def ended(problem: str, how: str = "finished") -> dict[str, Any]:
    return {"event": "ended", "problem": problem, "how": how}


def test_problems_a_killed_run_left_unfinished_are_admitted_again_under_new_ids() -> None:
    killed = [
        {"event": "launch", "steps": 10},
        admitted("p@0"),
        admitted("q@0"),
        admitted("r@0"),
        ended("p@0"),
        ended("r@0", "failed"),
    ]
    assert audit_problems(killed).unfinished == ["q@0"]
    problems, again = readmissions(killed)
    assert [p.problem_id for p in problems] == ["q@0~2"]
    assert (problems[0].text, again) == ("q", {"q@0~2": "q@0"})
    killed_again = [*killed, {"event": "launch", "steps": 10}, admitted("q@0~2", "q@0")]
    problems, again = readmissions(killed_again)
    assert again == {"q@0~3": "q@0~2"}
    done = [*killed_again, {"event": "launch", "steps": 10}, admitted("q@0~3", "q@0~2")]
    done += [admitted("s@0"), ended("q@0~3"), ended("s@0", "cancelled")]
    result = audit_problems(done)
    assert result.unfinished == []
    assert (result.admitted, result.drawn, result.readmitted, result.launches) == (6, 4, 2, 3)
    assert (result.finished, result.failed, result.cancelled) == (2, 1, 1)


def test_a_resumed_stream_admits_the_unfinished_first_then_goes_on_where_it_stopped() -> None:
    config = load_config(CONFIG)
    first = list(itertools.islice(endless(problems_of(config, "train"), config.seed), 6))
    records: list[dict[str, Any]] = [{"event": "launch", "steps": 10}]
    for problem in first[:5]:
        records.append({**admitted(problem.problem_id), "input": msgspec.to_builtins(problem)})
    records += [ended(p.problem_id) for p in first[:4]]
    stream, again = problem_stream(config, records)
    readmitted, following = next(stream), next(stream)
    assert readmitted.problem_id == f"{first[4].problem_id}~2"
    assert (readmitted.text, readmitted.answer) == (first[4].text, first[4].answer)
    assert again == {readmitted.problem_id: first[4].problem_id}
    assert following == first[5]


def test_ledger_files_are_read_back_whole_and_a_line_cut_short_is_skipped(
    tmp_path: Path,
) -> None:
    writer = LedgerWriter(tmp_path / learner_ledger("team"))
    for record in [*accepted("a", "b"), batch(1, "a", "b"), stopped(1)]:
        writer.write(**record)
    writer.close()
    with open(tmp_path / learner_ledger("team"), "ab") as file:
        file.write(b'{"event": "accep')
    conductor = LedgerWriter(tmp_path / CONDUCTOR)
    conductor.write("launch", steps=1)
    conductor.close()
    assert len(read_ledger(tmp_path / learner_ledger("team"))) == 4
    result = audit(tmp_path)
    assert result.clean and result.learners["team"].trained == 2
    assert result.problems.launches == 1

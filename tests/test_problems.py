"""Problem files, the generated arithmetic family, and the curriculum."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from actors.messages import Problem
from actors.problems import (
    DIFFICULTIES,
    Curriculum,
    ProblemFileError,
    arithmetic_problems,
    load_problems,
    split_of,
)


def write_lines(tmp_path: Path, *lines: str) -> Path:
    path = tmp_path / "algebra.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_load_problems_reads_a_good_file(tmp_path: Path) -> None:
    path = write_lines(
        tmp_path,
        json.dumps({"problem": "What is 3 + 4?", "answer": "7", "id": "p1"}),
        "",
        "   ",
        json.dumps({"problem": "What is 6 x 7?", "answer": 42, "split": "test"}),
        json.dumps(
            {"problem": "x?", "answer": "1", "difficulty": 3, "metadata": {"source": "hand"}}
        ),
    )
    assert load_problems(path) == [
        Problem("p1", "What is 3 + 4?", "7"),
        Problem("algebra-4", "What is 6 x 7?", "42", split="test"),
        Problem("algebra-5", "x?", "1", difficulty=3, metadata={"source": "hand"}),
    ]


def test_load_problems_of_an_empty_file(tmp_path: Path) -> None:
    assert load_problems(write_lines(tmp_path, "")) == []


GOOD = json.dumps({"problem": "What is 1 + 1?", "answer": "2"})


@pytest.mark.parametrize(
    ("bad_line", "expected"),
    [
        ('{"problem": "What is 1 + 1?", "answer": }', "JSON is malformed"),
        ('{"problem": "What is 1 + 1?"}', "missing required field `answer`"),
        ('{"problem": 5, "answer": "5"}', "Expected `str`, got `int` - at `$.problem`"),
        ('{"problem": "q", "answer": 1.5}', "got `float` - at `$.answer`"),
        ('{"problem": "q", "answer": "1", "answr": "1"}', "unknown field `answr`"),
        ('{"problem": "q", "answer": "1", "split": "dev"}', "at `$.split`"),
        ('{"problem": "q", "answer": "1", "difficulty": -1}', "at `$.difficulty`"),
        ('{"problem": "q", "answer": "1", "id": ""}', "at `$.id`"),
        ('["q", "1"]', "Expected `object`, got `array`"),
    ],
)
def test_malformed_record_names_file_line_and_field(
    tmp_path: Path, bad_line: str, expected: str
) -> None:
    path = write_lines(tmp_path, GOOD, "", bad_line, GOOD)
    with pytest.raises(ProblemFileError) as caught:
        load_problems(path)
    message = str(caught.value)
    assert message.startswith(f"{path}:3: ")
    assert expected in message
    assert "each line is one JSON object with `problem` and `answer`" in message
    assert (caught.value.path, caught.value.line) == (path, 3)
    assert isinstance(caught.value, ValueError)


def test_duplicate_id_names_both_lines(tmp_path: Path) -> None:
    path = write_lines(
        tmp_path,
        json.dumps({"problem": "a", "answer": "1", "id": "same"}),
        json.dumps({"problem": "b", "answer": "2"}),
        json.dumps({"problem": "c", "answer": "3", "id": "same"}),
    )
    with pytest.raises(ProblemFileError, match="duplicate id 'same', first used on line 1"):
        load_problems(path)
    with pytest.raises(ProblemFileError) as caught:
        load_problems(path)
    assert str(caught.value).startswith(f"{path}:3: ")


def test_generated_id_clashing_with_an_explicit_one_is_a_duplicate(tmp_path: Path) -> None:
    path = write_lines(
        tmp_path,
        json.dumps({"problem": "a", "answer": "1", "id": "algebra-2"}),
        json.dumps({"problem": "b", "answer": "2"}),
    )
    with pytest.raises(ProblemFileError, match=r":2: duplicate id 'algebra-2'.* line 1"):
        load_problems(path)


def expressions(problems: list[Problem]) -> set[str]:
    return {p.metadata["expression"] for p in problems}


@pytest.mark.parametrize("difficulty", DIFFICULTIES)
def test_generated_splits_are_disjoint_whatever_the_seed(difficulty: int) -> None:
    train = set[str]()
    test = set[str]()
    for seed in range(3):
        train |= expressions(arithmetic_problems(300, difficulty=difficulty, seed=seed))
        test |= expressions(
            arithmetic_problems(100, difficulty=difficulty, split="test", seed=seed)
        )
    assert train and test
    assert not train & test
    assert all(split_of(e) == "train" for e in train)
    assert all(split_of(e) == "test" for e in test)


def test_generated_problems_are_deterministic_for_a_seed() -> None:
    first = arithmetic_problems(50, difficulty=3, seed=7)
    assert arithmetic_problems(50, difficulty=3, seed=7) == first
    assert arithmetic_problems(50, difficulty=3, seed=8) != first
    assert arithmetic_problems(20, difficulty=3, seed=7) == first[:20]


def test_difficulty_one_is_single_digit_addition_with_a_one_digit_answer() -> None:
    train = arithmetic_problems(42, difficulty=1)
    test = arithmetic_problems(13, difficulty=1, split="test")
    assert len(expressions(train) | expressions(test)) == 55
    for problem in train + test:
        a, b = problem.metadata["expression"].split("+")
        assert problem.text == f"What is {a} + {b}?"
        assert len(a) == len(b) == len(problem.answer) == 1
        assert int(problem.answer) == int(a) + int(b)
        assert problem.difficulty == 1


def test_difficulty_two_has_two_digit_sums() -> None:
    for problem in arithmetic_problems(200, difficulty=2):
        a, b = problem.metadata["expression"].split("+")
        assert int(a) < 100 and int(b) < 100
        assert 10 <= int(problem.answer) <= 99


def test_difficulty_three_mixes_operators() -> None:
    problems = arithmetic_problems(300, difficulty=3)
    operators = {op for p in problems for op in "+-*" if op in p.metadata["expression"]}
    assert operators == {"+", "-", "*"}
    for problem in problems:
        expression = problem.metadata["expression"]
        assert int(problem.answer) == eval(expression) >= 0
        spaced = expression.replace("+", " + ").replace("-", " - ").replace("*", " * ")
        assert problem.text == f"What is {spaced}?"


def test_difficulty_four_follows_precedence() -> None:
    problems = arithmetic_problems(300, difficulty=4)
    for problem in problems:
        expression = problem.metadata["expression"]
        assert sum(expression.count(op) for op in "+-*") == 2
        assert int(problem.answer) == eval(expression)
    assert any(int(p.answer) < 0 for p in problems)


def test_asking_for_more_than_exist_repeats_with_unique_ids() -> None:
    problems = arithmetic_problems(30, difficulty=1, split="test", seed=1)
    ids = [p.problem_id for p in problems]
    assert len(set(ids)) == 30
    assert len(expressions(problems)) == 13
    assert ids[13].endswith("/2") and ids[26].endswith("/3")
    assert ids[0] == f"arith-{problems[0].metadata['expression']}"


def test_unknown_difficulty_or_split_is_refused() -> None:
    with pytest.raises(ValueError, match=r"difficulty must be one of \(1, 2, 3, 4\), got 9"):
        arithmetic_problems(1, difficulty=9)
    with pytest.raises(ValueError, match="split must be 'train' or 'test', got 'dev'"):
        arithmetic_problems(1, split="dev")


def test_curriculum_starts_at_the_lowest_and_waits_for_a_full_window() -> None:
    curriculum = Curriculum([3, 1, 2], threshold=0.8, window=5)
    assert curriculum.difficulty == 1
    for _ in range(4):
        curriculum.record(1, True)
    assert curriculum.difficulty == 1
    curriculum.record(1, True)
    assert curriculum.difficulty == 2


def test_curriculum_does_not_move_below_the_threshold() -> None:
    curriculum = Curriculum([1, 2], threshold=0.8, window=5)
    for correct in [True, True, True, False, False, True, True]:
        curriculum.record(1, correct)
        assert curriculum.difficulty == 1
    assert curriculum.accuracy(1) == pytest.approx(0.6)
    curriculum.record(1, True)
    assert curriculum.difficulty == 1
    curriculum.record(1, True)
    assert curriculum.accuracy(1) == pytest.approx(0.8)
    assert curriculum.difficulty == 2


def test_curriculum_ignores_other_difficulties_and_stays_at_the_top() -> None:
    curriculum = Curriculum([1, 2], window=2)
    curriculum.record(1, True)
    curriculum.record(1, True)
    assert curriculum.difficulty == 2
    curriculum.record(1, False)
    curriculum.record(1, False)
    assert curriculum.difficulty == 2
    assert curriculum.accuracy(2) is None
    curriculum.record(2, True)
    curriculum.record(2, True)
    assert curriculum.difficulty == 2
    with pytest.raises(ValueError, match=r"difficulty 5 is not in this curriculum \[1, 2\]"):
        curriculum.record(5, True)


def test_curriculum_for_problems_and_repr() -> None:
    problems = arithmetic_problems(3, difficulty=2) + arithmetic_problems(3, difficulty=1)
    curriculum = Curriculum.for_problems(problems, window=4)
    assert curriculum.difficulties == [1, 2]
    curriculum.record(1, True)
    assert repr(curriculum) == (
        "<Curriculum difficulty 1 of [1, 2] | accuracy 1.00 over 1/4, moves up at 0.80>"
    )


def test_curriculum_refuses_bad_settings() -> None:
    with pytest.raises(ValueError, match="at least one difficulty"):
        Curriculum([])
    with pytest.raises(ValueError, match="threshold"):
        Curriculum([1], threshold=1.5)
    with pytest.raises(ValueError, match="window"):
        Curriculum([1], window=0)

"""The run's ledger: what entered the pipeline and what was trained on, written as it
happens, so that a run killed any number of times can be audited afterwards.

The conductor records each problem it admits and how its episode ended. Each learner
records each segment it accepted (once its segment log holds it: from then on the
sender forgets it), each it refused and why, each batch it consumed, each resume
from a checkpoint, each version it published, and what it still held when it
stopped. Records are JSON lines flushed as they are written, so a killed process
loses none it wrote; a line cut short by the kill is skipped on reading.

``audit`` reads a run's ledger back. A resumed learner trains again the batches it
consumed after its checkpoint, so the batches a learner's weights came from are the
ones recorded up to each resume's checkpoint plus those after it; of those, a segment
in two batches was trained twice, and an accepted segment in none (and not held at
the end) was lost.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from actors.messages import Problem

CONDUCTOR = "conductor.jsonl"


def learner_ledger(policy: str) -> str:
    """The file name of ``policy``'s learner's ledger."""
    return f"learner-{policy}.jsonl"


class LedgerWriter:
    """Appends records to one ledger file; each is handed to the OS as it is written."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "ab")  # noqa: SIM115 - held open for the writer's life
        self._encoder = msgspec.json.Encoder()

    def write(self, event: str, **fields: Any) -> None:
        self._file.write(self._encoder.encode({"event": event, **fields}) + b"\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def read_ledger(path: str | Path) -> list[dict[str, Any]]:
    """The records of a ledger file in order; a line that does not decode (the last
    one, cut short by a kill) is skipped."""
    path = Path(path)
    if not path.is_file():
        return []
    records = []
    for line in path.read_bytes().splitlines():
        try:
            record = msgspec.json.decode(line)
        except msgspec.DecodeError:
            continue
        if isinstance(record, dict) and "event" in record:
            records.append(record)
    return records


@dataclass
class LearnerAudit:
    policy: str
    accepted: int = 0
    trained: int = 0
    """Segments in the batches the final weights came from."""
    held: int = 0
    """Accepted and still held, not trained on, when the learner last stopped."""
    batches: int = 0
    """Batches the final weights came from: steps, and batches skipped for equal rewards."""
    steps: int = 0
    version: int = 0
    resumes: int = 0
    retrained_batches: int = 0
    """Batches consumed after a checkpoint by a learner that was then killed: trained
    again by the resumed one."""
    rejected: dict[str, int] = field(default_factory=dict)
    lost: list[str] = field(default_factory=list)
    duplicated: list[str] = field(default_factory=list)
    contradictions: list[str] = field(default_factory=list)
    """Contradictions in the record: a resume whose checkpoint does not match the
    batches before it, versions that did not increase, a run that never stopped."""


@dataclass
class ProblemAudit:
    admitted: int = 0
    finished: int = 0
    failed: int = 0
    cancelled: int = 0
    """In flight when the run reached its target, and stopped."""
    readmitted: int = 0
    """In flight when the run was killed: admitted again by the resumed run."""
    launches: int = 0
    drawn: int = 0
    """Problems taken from the run's problem stream (the rest were admitted again)."""
    unfinished: list[str] = field(default_factory=list)
    """Admitted, never ended and never admitted again: lost, unless a resumed run
    admits them again."""


@dataclass
class Audit:
    problems: ProblemAudit
    learners: dict[str, LearnerAudit]

    @property
    def lost(self) -> int:
        return len(self.problems.unfinished) + sum(len(a.lost) for a in self.learners.values())

    @property
    def duplicated(self) -> int:
        return sum(len(a.duplicated) for a in self.learners.values())

    @property
    def contradictions(self) -> list[str]:
        return [f"{a.policy}: {p}" for a in self.learners.values() for p in a.contradictions]

    @property
    def clean(self) -> bool:
        return self.lost == 0 and self.duplicated == 0 and not self.contradictions


def audit(ledger_dir: str | Path) -> Audit:
    """Audit the ledger files in ``ledger_dir`` (a run's ``RUN_DIR/ledger``)."""
    root = Path(ledger_dir)
    learners = {}
    for path in sorted(root.glob("learner-*.jsonl")):
        policy = path.name.removeprefix("learner-").removesuffix(".jsonl")
        learners[policy] = audit_learner(policy, read_ledger(path))
    return Audit(audit_problems(read_ledger(root / CONDUCTOR)), learners)


def audit_problems(records: list[dict[str, Any]]) -> ProblemAudit:
    result = ProblemAudit()
    open_ids: dict[str, None] = {}
    again: set[str] = set()
    for record in records:
        event = record["event"]
        if event == "launch":
            result.launches += 1
        elif event == "admitted":
            result.admitted += 1
            result.drawn += not record.get("again")
            open_ids[record["problem"]] = record["input"]
            if record.get("again"):
                again.add(record["again"])
        elif event == "ended":
            open_ids.pop(record["problem"], None)
            how = record["how"]
            if how == "finished":
                result.finished += 1
            elif how == "failed":
                result.failed += 1
            else:
                result.cancelled += 1
    result.readmitted = len(again)
    result.unfinished = [p for p in open_ids if p not in again]
    return result


def readmissions(records: list[dict[str, Any]]) -> tuple[list[Problem], dict[str, str]]:
    """The problems a killed run left unfinished, under new ids (their first actions
    may be trained on already, and segment ids start with the problem's id), and the
    map of each new id to the old one; for the conductor of a resumed run."""
    inputs = {r["problem"]: r["input"] for r in records if r["event"] == "admitted"}
    launch = sum(1 for r in records if r["event"] == "launch") + 1
    problems, again = [], {}
    for old in audit_problems(records).unfinished:
        new = f"{re.sub(r'~[0-9]+$', '', old)}~{launch}"
        problems.append(msgspec.convert({**inputs[old], "problem_id": new}, Problem))
        again[new] = old
    return problems, again


def audit_learner(policy: str, records: list[dict[str, Any]]) -> LearnerAudit:
    result = LearnerAudit(policy)
    accepted: set[str] = set()
    rejected: Counter[str] = Counter()
    batches: list[dict[str, Any]] = []  # the batches the current weights came from
    consumed = 0
    held: list[str] = []
    published = 0
    stopped = False
    for record in records:
        event = record["event"]
        if event == "accepted":
            accepted.add(record["segment"])
        elif event == "rejected":
            rejected[record["reason"]] += 1
        elif event == "batch":
            if batches and record["version"] < batches[-1]["version"]:
                result.contradictions.append(
                    f"version {record['version']} after version {batches[-1]['version']}"
                )
            batches.append(record)
            consumed += len(record["segments"])
            stopped = False
        elif event == "resumed":
            result.resumes += 1
            while batches and consumed > record["consumed"]:
                consumed -= len(batches.pop()["segments"])
                result.retrained_batches += 1
            if consumed != record["consumed"] or record["version"] != _version(batches):
                result.contradictions.append(
                    f"resumed at version {record['version']} with {record['consumed']} "
                    f"segments consumed; the ledger had {consumed} at version "
                    f"{_version(batches)}"
                )
            stopped = False
        elif event == "published":
            if record["version"] < published:
                result.contradictions.append(
                    f"published version {record['version']} after {published}"
                )
            published = max(published, record["version"])
        elif event == "stopped":
            held = record["held"]
            stopped = True
    if records and not stopped:
        result.contradictions.append("the learner's last record is not its stop")
    trained = [sid for batch in batches for sid in batch["segments"]]
    seen = Counter(trained)
    result.accepted = len(accepted)
    result.trained = len(trained)
    result.held = len(held)
    result.batches = len(batches)
    result.steps = sum(1 for batch in batches if batch["stepped"])
    result.version = _version(batches)
    result.rejected = dict(rejected)
    result.duplicated = sorted(sid for sid, n in seen.items() if n > 1)
    result.lost = sorted(accepted - seen.keys() - set(held))
    return result


def _version(batches: list[dict[str, Any]]) -> int:
    return int(batches[-1]["version"]) if batches else 0

"""Multi-host runs: Slurm's node lists, placement errors that name the field, and a
run whose engine lives on a second "host" (a worker process on this machine, joined
to the head over TCP as another host's would be), also when that host crashes whole
and joins again."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from actors.cluster import first_host, slurm_task
from actors.ledger import audit
from actors.run_config import ConfigError, load_config
from tests.test_launch import SHARED, short_recipe

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize(
    ("nodelist", "first"),
    [
        ("node7", "node7"),
        ("node7,node9", "node7"),
        ("gpu[03-05,9],cpu1", "gpu03"),
        ("gpu[12,3]", "gpu12"),
        ("a-b[1-2]", "a-b1"),
    ],
)
def test_the_head_is_the_first_host_of_the_slurm_node_list(nodelist: str, first: str) -> None:
    assert first_host(nodelist) == first


def test_slurm_environment_gives_rank_and_head() -> None:
    environ = {
        "SLURM_PROCID": "2",
        "SLURM_NTASKS": "4",
        "SLURM_JOB_NODELIST": "n[10-13]",
        "SLURM_JOB_ID": "881",
    }
    task = slurm_task(environ)
    assert task is not None
    assert (task.rank, task.tasks, task.head_host, task.job_id) == (2, 4, "n10", "881")
    assert slurm_task({}) is None


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["cluster.placement={'engine/critic/0' = 1}"], r"\$\.cluster\.placement\.engine/critic/0"),
        (["cluster.placement={'engine/team/0' = 1}"], r"rank 1 is not in 0\.\.0"),
        (["cluster.hosts=0"], r"\$\.cluster\.hosts"),
        (["cluster.restarts=-1"], r"\$\.cluster\.restarts: at least 0"),
        (["cluster.hosts=2"], r"\$\.cluster\.keys: a run over several hosts needs keys"),
        (["cluster.keys='/none'"], r"\$\.cluster\.keys: /none: no cluster\.key_secret"),
    ],
)
def test_bad_cluster_settings_name_the_field(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(SHARED, overrides)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def two_hosts(tmp_path: Path, recipe: list[str]) -> tuple[list[str], int]:
    """Arguments for a run of the shared-policy recipe whose engine is on rank 1, over
    keys made by ``bin/launch keys``, and the head's port."""
    port = free_port()
    keys = tmp_path / "keys"
    made = subprocess.run(
        [sys.executable, "-m", "actors.launch", "keys", str(keys)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert made.returncode == 0, made.stderr
    settings = [
        f"runs_dir='{tmp_path}'",
        "cluster.hosts=2",
        f"cluster.keys='{keys}'",
        f"cluster.port={port}",
        "cluster.interface='127.0.0.1'",
        "cluster.placement={'engine/team/0' = 1}",
        *recipe,
    ]
    return [str(SHARED), *(f"--set={o}" for o in settings)], port


def start_head(settings: list[str], job: str) -> subprocess.Popen[str]:
    """The head under Slurm's environment (rank 0 of job ``job``)."""
    slurm = {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_JOB_NODELIST": "localhost"}
    return subprocess.Popen(
        [sys.executable, "-m", "actors.launch", *settings],
        cwd=ROOT,
        env={**os.environ, **slurm, "SLURM_JOB_ID": job},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def worker_command(settings: list[str], port: int, run_dir: Path) -> list[str]:
    join = ["--join", f"tcp://127.0.0.1:{port}", "--rank", "1", "--run-dir", str(run_dir)]
    return [sys.executable, "-m", "actors.launch", *settings, *join]


@pytest.mark.slow
def test_an_engine_on_a_worker_host_serves_the_head_run(tmp_path: Path) -> None:
    """The head starts under Slurm's environment (rank 0), the worker with ``--join``;
    the worker serves the engine until the head's run ends, then stops by itself. Their
    links are authenticated with keys made by ``bin/launch keys``."""
    recipe = [
        "train.steps=2",
        "policies.team.warm_start_steps=10",
        "conductor.group_size=2",
        "conductor.problems_per_step=2",
        "learner.groups_per_batch=4",
        "problems.difficulty=1",
        "eval.problems=2",
        "eval.before=false",
    ]
    settings, port = two_hosts(tmp_path, recipe)
    head = start_head(settings, "41")
    run_dir = tmp_path / "marsrl-tiny-shared-slurm41"
    worker = subprocess.run(
        worker_command(settings, port, run_dir),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    out, err = head.communicate(timeout=120)
    assert head.returncode == 0, out[-2000:] + err[-4000:]
    assert worker.returncode == 0, worker.stdout[-2000:] + worker.stderr[-4000:]
    assert "after 2 RL batches" in out
    assert "rank 1: serving ['engine/team/0']" in worker.stdout
    assert "the head is gone" in worker.stdout
    assert (run_dir / "logs" / "engine-team-0.jsonl").stat().st_size > 0
    assert (run_dir / "logs" / "learner-team.jsonl").stat().st_size > 0


def batches_in_ledger(run_dir: Path) -> int:
    ledger = run_dir / "ledger" / "learner-team.jsonl"
    return ledger.read_bytes().count(b'"event":"batch"') if ledger.is_file() else 0


@pytest.mark.slow
def test_a_worker_host_killed_whole_and_joined_again_serves_the_run_to_its_end(
    tmp_path: Path,
) -> None:
    """SIGKILL the worker host's launcher and its engine process at once, as a host
    that crashed; started again with the same command, it serves the engine on the
    port it had, the head's run goes on to its target, and its ledger audits clean."""
    settings, port = two_hosts(tmp_path, short_recipe(60))
    head = start_head(settings, "42")
    run_dir = tmp_path / "marsrl-tiny-shared-slurm42"
    command = worker_command(settings, port, run_dir)
    worker = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 300
        while batches_in_ledger(run_dir) < 10:
            assert head.poll() is None and time.monotonic() < deadline, "no training"
            time.sleep(0.2)
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait()
        again = subprocess.run(
            command, cwd=ROOT, capture_output=True, text=True, timeout=600, check=False
        )
        out, err = head.communicate(timeout=120)
    finally:
        for process in (head, worker):
            if process.poll() is None:
                process.kill()
    assert head.returncode == 0, out[-2000:] + err[-4000:]
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-3000:]
    assert "after 60 RL batches" in out
    ledger = audit(run_dir / "ledger")
    assert ledger.clean, (ledger.problems, ledger.learners)
    assert ledger.learners["team"].batches >= 60

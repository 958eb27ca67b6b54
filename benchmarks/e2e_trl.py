"""The TRL side of the end-to-end suite, run as its own process: TRL's ``GRPOTrainer``
trains the Solver on the run's own training problems, prompt and reward, from the same
warm-started checkpoint, for a fixed wall-clock budget.

    python -m benchmarks.e2e_trl --config RUN_CONFIG.toml --model DIR --seconds 120 \\
        --out DIR --threads 2

It saves the trained model to ``OUT/model`` and writes ``OUT/curve.json``: per
optimizer step, the seconds since training began, the samples generated so far and
the mean reward of the step's samples. TRL is a benchmark-only dependency (the
``peers`` extra).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch

from actors.launch import problems_of
from actors.roles import role_named
from actors.run_config import load_config
from rewards.marsrl import solver_reward


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, help="the relaytrain run's config.toml")
    parser.add_argument("--model", required=True, help="the warm-started checkpoint")
    parser.add_argument("--seconds", type=float, required=True, help="training time budget")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    config = load_config(args.config)
    role = role_named("solver")
    rows = [
        {
            "prompt": [
                {"role": t.role, "content": t.content} for t in role.render({"problem": p.text})
            ],
            "answer": p.answer,
        }
        for p in problems_of(config, "train")
    ]
    sampling = config.sampling_for("solver")
    learner = config.learner_config("team")
    group = config.conductor.group_size
    batch = learner.groups_per_batch * group

    def reward(completions: list[Any], answer: list[str], **_: Any) -> list[float]:
        texts = [c[-1]["content"] if isinstance(c, list) else str(c) for c in completions]
        return [
            solver_reward(role.parse(text).answer, reference).value
            for text, reference in zip(texts, answer, strict=True)
        ]

    curve: list[dict[str, float]] = []
    budget = args.seconds

    class Budget(TrainerCallback):
        """Stops training once the budget is spent and records the curve."""

        began = 0.0

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            Budget.began = time.monotonic()

        def on_log(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            logs = kwargs.get("logs") or {}
            if "reward" in logs:
                curve.append(
                    {
                        "time_s": time.monotonic() - Budget.began,
                        "samples": state.global_step * batch,
                        "reward": float(logs["reward"]),
                    }
                )

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if time.monotonic() - Budget.began >= budget:
                control.should_training_stop = True

    trl_config = GRPOConfig(
        output_dir=str(args.out / "trainer"),
        per_device_train_batch_size=batch,
        gradient_accumulation_steps=1,
        num_generations=group,
        max_completion_length=sampling.max_tokens,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        learning_rate=learner.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=learner.weight_decay,
        max_grad_norm=learner.max_grad_norm,
        beta=learner.kl_coef,
        epsilon=learner.clip_low,
        loss_type="grpo",
        max_steps=1_000_000,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        bf16=False,
        seed=config.seed,
        dataloader_num_workers=0,
    )
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32)
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=trl_config,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        callbacks=[Budget()],
    )
    trainer.train()
    trainer.save_model(str(args.out / "model"))
    (args.out / "curve.json").write_text(json.dumps(curve))


if __name__ == "__main__":
    main()

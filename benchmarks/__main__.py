"""bin/bench: run benchmark suites, print their tables, write SUITE.json under --out.

bin/bench runtime            # actor messages against raw pyzmq (about 90 s)
bin/bench engines            # engines against HF generate, weight updates (minutes)
bin/bench learner            # learner step overhead, weight publication against raw zmq
bin/bench pipeline           # schedules under a long-tailed load: synchronous vs streaming
bin/bench e2e                # the default recipe's Solver: relaytrain against TRL's GRPOTrainer
bin/bench soak               # the synthetic pipeline for 10 minutes: memory and queues
bin/bench --quick            # every suite, short (CI): checks they work, not speed
"""

from __future__ import annotations

import argparse
from pathlib import Path

from benchmarks import e2e, engines, learner, pipeline, runtime, soak

SUITES = {
    "runtime": runtime.run,
    "engines": engines.run,
    "learner": learner.run,
    "pipeline": pipeline.run,
    "e2e": e2e.run,
    "soak": soak.run,
}


def main() -> None:
    parser = argparse.ArgumentParser(
        prog="bin/bench", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "suites", nargs="*", metavar="SUITE", help=f"{', '.join(SUITES)} or all (default: all)"
    )
    parser.add_argument("--quick", action="store_true", help="a short run for smoke tests")
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("bench-out"),
        help="where SUITE.json files go (default: bench-out/)",
    )
    args = parser.parse_args()
    unknown = set(args.suites) - {*SUITES, "all"}
    if unknown:
        parser.error(f"unknown suite {sorted(unknown)[0]!r}; choose from {', '.join(SUITES)}, all")
    names = list(SUITES) if not args.suites or "all" in args.suites else args.suites
    for name in names:
        SUITES[name](args.quick, args.out)


if __name__ == "__main__":
    main()

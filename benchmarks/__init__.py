"""Benchmark suites behind bin/bench; each compares relaytrain with a baseline measured
in the same run on the same machine."""

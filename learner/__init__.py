"""Learner actors: advantages, losses, weight publication and checkpoints."""

"""Agent roles, workflows, the conductor, generation engines and the domain messages."""

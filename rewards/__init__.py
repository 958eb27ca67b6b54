"""Answer checking, agent-specific rewards and the judge (feedback-reward) actor."""

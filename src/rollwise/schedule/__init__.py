"""Which (environment, task) pairs get the next rollouts. `SCHEDULERS` is the only dispatch."""

from rollwise.schedule.baselines import plan_random

SCHEDULERS = {"random": plan_random}

"""Which (environment, task) pairs get the next rollouts. `SCHEDULERS` is the only dispatch.

One signature: SCHEDULERS[name](catalog, history, budget, cfg) -> plan (plan.py's columns plus
the method's score parts), where history is the table of what earlier rounds observed
(history.py; None before any), budget a plan.Budget and cfg the method's params section
(params.yaml schedule.<name>; None for random). Every plan is rolled out by plan.execute_plan.
"""

from rollwise.schedule.baselines import plan_band, plan_dapo, plan_random, plan_spo
from rollwise.schedule.envsched import plan_envsched

SCHEDULERS = {
    "random": plan_random,
    "envsched": plan_envsched,
    "band": plan_band,
    "dapo": plan_dapo,
    "spo": plan_spo,
}

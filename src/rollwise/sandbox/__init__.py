"""The code sandbox: model-written Python runs in a separate, limited process (worker.py),
never in the pipeline's own; host.py starts it and proxies its tool calls as recorded steps.
Shared by code actions (rollout.action_mode: code) and any environment that runs model code."""

from rollwise.sandbox.host import CodeResult, SandboxLimits, run_code

__all__ = ["CodeResult", "SandboxLimits", "run_code"]

"""When a failed stage is worth another try: a network or server blink (MLflow, S3, a tool
server) is retried by Prefect, twice, after 10 s and 60 s; bad params, bad data, a missing
upstream artifact or a code error are not, since a retry would only fail the same way, later."""

from __future__ import annotations

import contextlib
import importlib
import socket

RETRIES = 2
RETRY_DELAYS_S = [10, 60]


def _network_errors() -> tuple[type[BaseException], ...]:
    """Exception types that mean "the network or a server blinked": worth a retry."""
    types: list[type[BaseException]] = [ConnectionError, TimeoutError, socket.gaierror]
    optional = {
        "requests": ("ConnectionError", "Timeout"),
        "httpx": ("TransportError",),
        "urllib3.exceptions": ("ProtocolError", "NewConnectionError", "TimeoutError"),
        "botocore.exceptions": ("ConnectionError", "HTTPClientError"),
    }
    for module, names in optional.items():
        with contextlib.suppress(ImportError):
            mod = importlib.import_module(module)
            types += [getattr(mod, n) for n in names if hasattr(mod, n)]
    return tuple(types)


NETWORK_ERRORS = _network_errors()
# Never retried, whatever they wrap: bad params/data (ParamsError is a ValueError), a missing
# upstream artifact, code errors. A retry would only fail the same way, later.
PERMANENT_ERRORS = (ValueError, TypeError, LookupError, FileNotFoundError, PermissionError)


def is_transient(exc: BaseException | None) -> bool:
    """True for connection/timeout errors (to MLflow, S3, ...), also when wrapped by a client."""
    if exc is None or isinstance(exc, PERMANENT_ERRORS):
        return False
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, NETWORK_ERRORS) or "Max retries exceeded" in str(exc):
            return True  # the last: how MLflow's REST client reports a refused connection
        exc = exc.__cause__ or exc.__context__
    return False


def retry_if_transient(task, task_run, state) -> bool:
    """Prefect `retry_condition_fn`: retry a failed stage only on a transient network error."""
    exc = state.result(raise_on_failure=False)
    return is_transient(exc if isinstance(exc, BaseException) else None)

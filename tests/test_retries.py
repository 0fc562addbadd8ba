"""Which failed stages Prefect retries: network blinks yes, bad params or data never."""

from __future__ import annotations

import socket

import pytest
from prefect.states import Failed

from flows.retries import is_transient, retry_if_transient
from rollwise.config import ParamsError


def raised(exc: BaseException, cause: BaseException | None = None) -> BaseException:
    """`exc` as a client raises it: with `cause` as its __cause__ (raise ... from cause)."""
    try:
        raise exc from cause
    except BaseException as caught:  # noqa: BLE001 - the object under test
        return caught


@pytest.mark.parametrize(
    "exc",
    [
        ConnectionRefusedError("MLflow is down"),
        TimeoutError("S3 did not answer"),
        socket.gaierror("no such host"),
        raised(RuntimeError("log_metric failed"), ConnectionResetError("reset by peer")),
        RuntimeError("API request failed: Max retries exceeded with url: /api/2.0/mlflow/runs"),
    ],
    ids=["refused", "timeout", "dns", "wrapped", "mlflow-message"],
)
def test_network_blinks_are_retried(exc):
    assert is_transient(exc)


@pytest.mark.parametrize(
    "exc",
    [
        ParamsError("train.lrr: unknown key 'lrr'"),
        FileNotFoundError("data/rollouts/round_01/episodes.parquet"),
        KeyError("reward"),
        raised(ValueError("corrupt parquet"), ConnectionError("read during a blink")),
        RuntimeError("a bug"),
        None,
    ],
    ids=["params", "missing-artifact", "code", "permanent-wraps-network", "other", "none"],
)
def test_bad_input_and_bugs_are_not_retried(exc):
    assert not is_transient(exc)


def test_a_cyclic_exception_chain_ends():
    a, b = RuntimeError("a"), RuntimeError("b")
    a.__context__, b.__context__ = b, a
    assert not is_transient(a)


def test_prefect_asks_the_failed_state():
    """The condition reads the exception out of the failed task state, as Prefect passes it."""
    assert retry_if_transient(None, None, Failed(data=ConnectionRefusedError("down")))
    assert not retry_if_transient(None, None, Failed(data=ParamsError("rounds: must be >= 1")))

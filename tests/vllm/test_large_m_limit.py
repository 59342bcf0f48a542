"""At tensor parallel > 1 the plugin limits the large-M fused kernel to
ternary.ops.TP_LARGE_M_MAX rows a step (csrc/ops.cpp says why), unless the user set
TERNARY_LARGE_M_MAX; one process (TP=1) keeps no limit."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed in this environment")

import vllm.distributed

from ternary import ops
from ternary.vllm import linear


@pytest.fixture
def tp(monkeypatch):
    # set, then deleted: monkeypatch then removes what the plugin writes into os.environ
    monkeypatch.setenv(ops.LARGE_M_ENV, "")
    monkeypatch.delenv(ops.LARGE_M_ENV)

    def set_tp(n):
        monkeypatch.setattr(vllm.distributed, "get_tensor_model_parallel_world_size", lambda: n)

    return set_tp


def test_tp2_sets_the_limit(tp):
    tp(2)
    assert linear.limit_large_m_for_tensor_parallel() == ops.TP_LARGE_M_MAX == 8192
    assert os.environ[ops.LARGE_M_ENV] == "8192" and ops.large_m_cap() == 8192


def test_tp1_and_no_parallel_state_keep_no_limit(tp, monkeypatch):
    tp(1)
    assert linear.limit_large_m_for_tensor_parallel() is None
    assert ops.large_m_cap() is None

    def uninitialized():
        raise AssertionError("tensor model parallel group is not initialized")

    monkeypatch.setattr(vllm.distributed, "get_tensor_model_parallel_world_size", uninitialized)
    assert linear.limit_large_m_for_tensor_parallel() is None
    assert ops.large_m_cap() is None


def test_the_users_value_wins(tp, monkeypatch):
    tp(2)
    monkeypatch.setenv(ops.LARGE_M_ENV, "0")  # lifted on purpose
    assert linear.limit_large_m_for_tensor_parallel() is None
    assert ops.large_m_cap() is None

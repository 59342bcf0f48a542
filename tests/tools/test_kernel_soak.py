"""ternary.tools.kernel_soak: its refusals and its watchdog (CPU), and the large-M kernel launched
tens of thousands of times without a hang (gpu, slow: the persistent wgmma_big kernel hung
about once in 10,000 launches at M = 16384, K = 5504 before its fix)."""

from __future__ import annotations

import sys

import pytest
import torch

from ternary import cli
from ternary.tools import kernel_soak


def test_unknown_variant_is_named(capsys):
    assert cli.main(["kernel-soak", "--variants", "default,bogus"]) == 2
    err = capsys.readouterr().err
    assert "unknown ['bogus']" in err and "nopersist" in err


def test_run_variant_refuses_an_unknown_variant(tmp_path):
    with pytest.raises(kernel_soak.SoakError, match="unknown variant 'fast'; variants: default"):
        kernel_soak.run_variant("fast", [0], 64, 1, 1, tmp_path, seed=0)


def test_tensor_parallel_that_does_not_split_llama_is_named(capsys):
    assert cli.main(["kernel-soak", "--tp", "3"]) == 2
    assert "--tp 3: tensor parallel 3 does not divide" in capsys.readouterr().err


def test_bad_token_count_is_named(capsys):
    assert cli.main(["kernel-soak", "--m", "0"]) == 2
    assert "--m 0" in capsys.readouterr().err


def test_gpu_index_past_the_machine_is_named(capsys):
    count = torch.cuda.device_count()
    assert cli.main(["kernel-soak", "--gpus", str(count)]) == 2
    assert f"shows {count} CUDA GPU(s)" in capsys.readouterr().err


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the report of a child without CUDA")
def test_a_child_without_a_gpu_fails_with_its_reason(tmp_path):
    [row] = kernel_soak.run_variant("default", [0], 64, 1, 5, tmp_path, seed=0)
    assert not row["ok"] and not row["hung"] and row["returncode"] not in (0, None)
    assert "needs a CUDA GPU" in row["stderr_tail"], row["stderr_tail"]


def test_a_child_that_stops_is_reported_hung_with_its_last_op(tmp_path, monkeypatch):
    """The watchdog: a child that writes a launch line and never finishes is stopped after
    its time, and the row names its last op and carries its Python stack."""
    script = ("import faulthandler, sys, time\n"
              "faulthandler.dump_traceback_later(1.5, file=open(sys.argv[2], 'w'))\n"
              "open(sys.argv[1], 'a').write('launch 7 down_proj M=16384 K=5504 N=4096\\n')\n"
              "time.sleep(600)\n")

    def command(base, m, seconds, grace, seed, sync, tp):
        return [sys.executable, "-c", script, str(base.with_suffix(".progress")),
                str(base.with_suffix(".stack"))]

    monkeypatch.setattr(kernel_soak, "_child_command", command)
    [row] = kernel_soak.run_variant("nopdl", [0], 16384, 1, 1, tmp_path, seed=0, startup=1)
    assert row["hung"] and not row["ok"]
    assert row["last"] == "launch 7 down_proj M=16384 K=5504 N=4096"
    assert row["launches"] == 1 and row["env"] == {"TERNARY_PDL": "0"}
    assert "time.sleep" in row["stack"] or "<string>" in row["stack"], row["stack"]


@pytest.mark.gpu
@pytest.mark.slow
def test_large_m_kernels_do_not_hang_in_120_s_of_launches(tmp_path):
    """Llama-2-7B's TP=2 shapes at M = 16384, a sync after every launch, on one GPU for 120 s
    (about 80,000 launches on an H200, 20,000 of down_proj), every output checked against
    float64 at the start and the end."""
    from ternary import _ext

    if not _ext.fused_route(16384, 4096, 5504, 0, 0).startswith("wgmma_big"):
        pytest.skip("no large-M fused kernel on this GPU")
    [row] = kernel_soak.run_variant("default", [torch.cuda.current_device()], 16384, 120, 20,
                                    tmp_path, seed=0)
    assert row["ok"], (f"{'hung' if row['hung'] else 'failed'} after {row['launches']} "
                       f"launches; last: {row['last']}; {row['stderr_tail']}")
    assert len([c for c in row["checks"] if c.startswith("check end")]) == 4, row["checks"]

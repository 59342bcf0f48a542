"""The toolchain cache is verified by content: a same-size changed byte in a cached nvcc or
header, or a symlink pointed elsewhere, is found and named, and the provider reassembles."""

from __future__ import annotations

import json

import pytest

from ternary._build import matrix
from ternary._build.toolchains import cache


@pytest.fixture
def cached(tmp_path, monkeypatch):
    monkeypatch.setenv("TERNARY_CACHE", str(tmp_path / "cache"))
    home = cache.root() / "demo"
    inputs = {"lock_sha256": "abc"}

    def assemble(partial, downloads):
        (partial / "bin").mkdir()
        (partial / "bin" / "nvcc").write_bytes(b"\x7fELF nvcc")
        (partial / "include").mkdir()
        (partial / "include" / "cuda_runtime.h").write_text("#pragma once\n")
        (partial / "lib").symlink_to("bin")

    cache.build(home, inputs, assemble)
    return home, inputs


def test_same_size_flipped_byte_is_found_by_name(cached):
    home, inputs = cached
    assert cache.check(home, inputs) is None
    nvcc = home / "bin" / "nvcc"
    data = bytearray(nvcc.read_bytes())
    data[3] ^= 0x01
    nvcc.write_bytes(bytes(data))
    why = cache.check(home, inputs)
    assert "bin/nvcc has sha256" in why and "same size" in why
    assert not cache.valid(home, inputs)


def test_flipped_header_byte_and_changed_symlink(cached):
    home, inputs = cached
    (home / "include" / "cuda_runtime.h").write_text("#pragma onca\n")  # same size
    (home / "lib").unlink()
    (home / "lib").symlink_to("include")
    why = cache.check(home, inputs)
    assert "include/cuda_runtime.h has sha256" in why and "lib has sha256" in why


def test_old_size_only_stamp_gets_hashes_once(cached):
    home, inputs = cached
    stamp = json.loads((home / cache.STAMP).read_text())
    del stamp["sha256"]
    (home / cache.STAMP).write_text(json.dumps(stamp))
    assert cache.check(home, inputs) is None
    assert "sha256" in json.loads((home / cache.STAMP).read_text())


def test_deb_provider_reassembles_a_tampered_cache(cached, monkeypatch, capsys):
    from ternary._build.toolchains import deb, wheels

    home, _ = cached
    lock = wheels.lock_path(deb.DEB.cuda_version)
    inputs = {"deb_sha256": deb.DEB.sha256, "lock_sha256": deb.sha256(lock), "layout": deb.LAYOUT}
    monkeypatch.setattr(deb, "name", lambda: "demo")
    stamp = json.loads((home / cache.STAMP).read_text())
    (home / cache.STAMP).write_text(json.dumps({**stamp, "inputs": inputs}))
    nvcc = home / "bin" / "nvcc"
    nvcc.write_bytes(nvcc.read_bytes()[:-1] + b"X")
    rebuilt = []
    monkeypatch.setattr(deb, "assemble", lambda h, d, show: (rebuilt.append(h),
                                                             (h / "bin").mkdir(),
                                                             (h / "bin" / "nvcc").write_text("ok")))
    monkeypatch.setattr(deb, "nvcc_version", lambda h: "12.4.131")
    monkeypatch.setattr(deb, "refusal", lambda *a: None)
    got, notes = deb.provide(matrix.get("h100"))
    assert rebuilt and got == home and "assembled" in notes[0]
    out = capsys.readouterr()
    assert "cached toolchain not used" in out.out + out.err and "bin/nvcc" in out.out + out.err
    assert cache.check(home, inputs) is None

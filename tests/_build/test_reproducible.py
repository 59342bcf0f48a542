"""Bit-identical wheels: the zip normaliser, SOURCE_DATE_EPOCH, the comparison of two crafted
wheels that `nox -s reproduce-<target>` reports, and (behind the `build` marker) the real
reproduce run."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import zipfile
from pathlib import Path

import pytest

from ternary._build import matrix, pipeline, reproducible

SO = "ternary/_C.cpython-311-x86_64-linux-gnu.so"


def _elf(payload: bytes) -> bytes:
    """A minimal ELF64 file: header, payload in section .rodata, section name table."""
    import struct

    names = b"\0.rodata\0.shstrtab\0"
    body_off = 64
    names_off = body_off + len(payload)
    shoff = names_off + len(names)
    header = (b"\x7fELF\x02\x01\x01" + b"\0" * 9
              + struct.pack("<HHIQQQIHHHHHH", 3, 62, 1, 0, 0, shoff, 0, 64, 0, 0, 64, 3, 2))
    sections = struct.pack("<IIQQQQIIQQ", 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
    sections += struct.pack("<IIQQQQIIQQ", 1, 1, 2, 0, body_off, len(payload), 0, 0, 1, 0)
    sections += struct.pack("<IIQQQQIIQQ", 9, 3, 0, 0, names_off, len(names), 0, 0, 1, 0)
    return header + payload + names + sections


def _wheel(path: Path, members: dict[str, bytes], *, when=(2026, 12, 1, 10, 0, 0), mode=0o644,
           order=None) -> Path:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name in order or members:
            info = zipfile.ZipInfo(name, date_time=when)
            info.external_attr = (0o100000 | mode) << 16
            z.writestr(info, members[name])
    return path


def test_identical_wheels_compare_identical(tmp_path):
    m = {SO: _elf(b"x" * 100), "ternary/__init__.py": b"", "x.dist-info/RECORD": b"r"}
    r = reproducible.compare(_wheel(tmp_path / "a.whl", m), _wheel(tmp_path / "b.whl", m))
    assert r["identical"] and r["differences"] == [] and r["sha256"][0] == r["sha256"][1]


def test_path_in_library_is_named_with_section_and_bytes(tmp_path):
    a = _wheel(tmp_path / "a.whl", {SO: _elf(b"\0\0/work/a/csrc/fused.cu\0tail"), "t.py": b"1"})
    b = _wheel(tmp_path / "b.whl", {SO: _elf(b"\0\0/srv/xy/csrc/fused.cu\0tail"),
                                    "t.py": b"1"})
    r = reproducible.compare(a, b)
    assert not r["identical"]
    (d,) = r["differences"]
    assert d["member"] == SO and d["kind"] == "content"
    assert d["offset"] == 64 + 3  # ELF header, two NULs, then "/" agrees: 'w' against 's'
    assert "in ELF section .rodata" in d["detail"]
    assert "6 differ" in d["detail"] and "differing bytes by section: .rodata 6" in d["detail"]
    assert "'/work/a/csrc/fused.cu'" in d["detail"] and "'/srv/xy/csrc/fused.cu'" in d["detail"]
    assert d["first"].startswith("work/a/csrc/fused.cu\\x00") and d["second"].startswith("srv/")


def test_times_modes_order_and_missing_members_are_each_named(tmp_path):
    m = {"a.py": b"1", "b.py": b"2", "c.py": b"3"}
    a = _wheel(tmp_path / "a.whl", m)
    b = _wheel(tmp_path / "b.whl", {**m, "new.py": b"4"}, when=(2026, 12, 1, 11, 0, 0), mode=0o664,
               order=["b.py", "a.py", "c.py", "new.py"])
    kinds = {(d["member"], d["kind"]) for d in reproducible.compare(a, b)["differences"]}
    assert ("new.py", "only in second") in kinds
    # one row for the three members whose time and mode differ alike
    assert {("3 members: a.py, b.py, c.py", "time"), ("3 members: a.py, b.py, c.py", "mode"),
            ("a.py", "order")} <= kinds


def test_container_difference_when_members_agree(tmp_path):
    m = {"a.py": b"1" * 1000}
    a = _wheel(tmp_path / "a.whl", m)
    b = tmp_path / "b.whl"
    with zipfile.ZipFile(b, "w") as z:  # the same member, deflated instead of stored
        info = zipfile.ZipInfo("a.py", date_time=(2026, 12, 1, 10, 0, 0))
        info.external_attr = (0o100644) << 16
        info.compress_type = zipfile.ZIP_DEFLATED
        z.writestr(info, m["a.py"])
    (d,) = reproducible.compare(a, b)["differences"]
    assert d["kind"] == "container" and d["member"] == ""


def test_normalize_makes_time_umask_and_clock_irrelevant(tmp_path):
    m = {SO: b"\x7fELF...", "ternary/__init__.py": b"", "x.dist-info/RECORD": b"r"}
    a = _wheel(tmp_path / "a.whl", m, when=(2026, 12, 1, 10, 0, 0), mode=0o775)
    b = _wheel(tmp_path / "b.whl", m, when=(2031, 1, 2, 3, 4, 6), mode=0o755)
    for w in (a, b):
        reproducible.normalize_wheel(w, 1764581000)
    assert reproducible.sha256(a) == reproducible.sha256(b)
    with zipfile.ZipFile(a) as z:
        assert [i.filename for i in z.infolist()] == list(m)
        assert {i.date_time for i in z.infolist()} == {time.gmtime(1764581000)[:6]}
        assert {oct(i.external_attr >> 16) for i in z.infolist()} == {"0o100755"}


def test_normalize_keeps_contents_and_clamps_to_1980(tmp_path):
    a = _wheel(tmp_path / "a.whl", {"a.py": b"hello", "s.sh": b"#!"}, mode=0o600)
    reproducible.normalize_wheel(a, 0)
    with zipfile.ZipFile(a) as z:
        assert z.read("a.py") == b"hello"
        assert z.getinfo("a.py").date_time == (1980, 1, 1, 0, 0, 0)
        assert z.getinfo("a.py").external_attr >> 16 == 0o100644


def test_source_date_epoch_from_commit_or_environment(tmp_path, monkeypatch):
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    ct = subprocess.run(["git", "log", "-1", "--format=%ct"], cwd=matrix.REPO, capture_output=True,
                        text=True).stdout.strip()
    if not ct:
        pytest.skip("not a git checkout")
    value, origin = reproducible.source_date_epoch(matrix.REPO)
    assert value == int(ct) and origin.startswith("commit time of ")
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "100")
    value, origin = reproducible.source_date_epoch(matrix.REPO)
    assert value == reproducible.ZIP_EPOCH_MIN and "1980" in origin
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "yesterday")
    with pytest.raises(reproducible.ReproError, match="SOURCE_DATE_EPOCH='yesterday'"):
        reproducible.source_date_epoch(matrix.REPO)
    monkeypatch.delenv("SOURCE_DATE_EPOCH")
    assert reproducible.source_date_epoch(tmp_path)[0] == reproducible.ZIP_EPOCH_MIN


def test_render_plain_and_rich(tmp_path, capsys):
    a = _wheel(tmp_path / "a.whl", {SO: _elf(b"/a/x.cu\0")})
    b = _wheel(tmp_path / "b.whl", {SO: _elf(b"/bb/x.cu\0")})
    reproducible.render(reproducible.compare(a, b), "reproduce-demo")
    out = capsys.readouterr().out
    assert "DIFFERENT: 1 difference" in out and SO in out


# --- the real thing ----------------------------------------------------------------------

@pytest.mark.build
@pytest.mark.slow
@pytest.mark.parametrize("target,args", [("cpu", []), ("h100", ["--toolchain", "deb"])])
def test_reproduce_real_builds(target, args, tmp_path):
    """Two fresh checkouts of HEAD, two builds, byte-identical wheels (minutes for h100)."""
    if shutil.which("git") is None:
        pytest.skip("needs git")
    code = pipeline.main(["reproduce", target, *args, "--json", "--workdir", str(tmp_path / "w")])
    result = json.loads((matrix.REPO / "dist" / f"reproduce-{target}.json").read_text())
    assert code == 0, result["differences"]
    assert result["identical"] and result["runs"][0]["checkout"] != result["runs"][1]["checkout"]


# --- what keeps paths out of ternary._C ---------------------------------------------------

def test_no_anonymous_namespace_in_cuda_sources():
    """cudafe++ names an anonymous namespace after a hash of the file's path, which lands in
    every kernel symbol of the fatbin (measured: _GLOBAL__N__48d31452 under one directory,
    _GLOBAL__N__c90d2b02 under another): sources and the headers they include use named
    inline namespaces."""
    offenders = [str(p.relative_to(matrix.REPO)) for p in sorted((matrix.REPO / "csrc").rglob("*"))
                 if p.suffix in (".cu", ".cuh", ".h") and "namespace {" in p.read_text()]
    assert offenders == [], (f"{offenders}: use `inline namespace TERNARY_TU {{` "
                             "(csrc/common/tu.cuh) instead")


def test_default_nvcc_flags_carry_no_lineinfo_and_map_the_paths():
    text = (matrix.REPO / "setup.py").read_text()
    nvcc = text[text.index('"nvcc": ['):].split("]", 1)[0]
    assert "-lineinfo" not in nvcc
    assert "-ffile-prefix-map" in text and 'sys.prefix: "/venv"' in text

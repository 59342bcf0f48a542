"""Bit-identical wheels: the time every member carries (SOURCE_DATE_EPOCH, from the commit),
a normalised zip (fixed times and modes, members in the order bdist_wheel sorted them), and
the comparison of two wheels that `nox -s reproduce-<target>` prints. Standard library only
(it runs in the noxfile's interpreter, before any target environment exists)."""

from __future__ import annotations

import dataclasses
import os
import stat
import struct
import subprocess
import time
import zipfile
from pathlib import Path

from ternary import settings
from ternary._build.hashing import sha256

# A zip member's time is a DOS date: nothing before 1980-01-01 00:00:00 UTC.
ZIP_EPOCH_MIN = 315532800


class ReproError(RuntimeError):
    """Reproducibility cannot be established; the message names the file and what to do."""


def source_date_epoch(repo: Path) -> tuple[int, str]:
    """(seconds, where they come from): SOURCE_DATE_EPOCH when the environment sets it,
    else the commit time of repo's HEAD, never before 1980 (zip cannot store it)."""
    raw = os.environ.get("SOURCE_DATE_EPOCH", "").strip()
    if raw:
        if not raw.isdigit():
            raise ReproError(f"SOURCE_DATE_EPOCH={raw!r} is not a whole number of seconds since "
                             "1970: unset it (the commit time is used) or set e.g. "
                             "`SOURCE_DATE_EPOCH=$(git log -1 --format=%ct)`")
        value, origin = int(raw), "SOURCE_DATE_EPOCH from the environment"
    else:
        out = subprocess.run(["git", "log", "-1", "--format=%ct %H"], cwd=repo,
                             capture_output=True, text=True)
        if out.returncode != 0 or not out.stdout.strip():
            value, origin = ZIP_EPOCH_MIN, (f"{repo} is not a git checkout: 1980-01-01, the "
                                            "earliest time a zip member holds")
        else:
            ct, sha = out.stdout.split()
            value, origin = int(ct), f"commit time of {sha[:12]}"
    if value < ZIP_EPOCH_MIN:
        value, origin = ZIP_EPOCH_MIN, origin + ", raised to 1980-01-01 (zip's earliest time)"
    return value, origin


def _mode(info: zipfile.ZipInfo) -> int:
    """0o755 for a member any execute bit was set on, else 0o644 (the umask is not kept)."""
    return 0o755 if (info.external_attr >> 16) & 0o111 else 0o644


def normalize_wheel(path: Path, epoch: int) -> None:
    """Rewrite path in place with every member at time `epoch`, mode 0644/0755, made on
    Unix, deflated, in the order it has (bdist_wheel sorts, dist-info last). RECORD holds
    hashes of the contents, which do not change."""
    date_time = time.gmtime(max(epoch, ZIP_EPOCH_MIN))[:6]
    tmp = path.with_name(path.name + ".normalizing")
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            new = zipfile.ZipInfo(info.filename, date_time=date_time)
            new.create_system = 3
            new.compress_type = zipfile.ZIP_DEFLATED
            if info.is_dir():
                new.external_attr = (stat.S_IFDIR | 0o755) << 16 | 0x10
            else:
                new.external_attr = (stat.S_IFREG | _mode(info)) << 16
            dst.writestr(new, src.read(info))
    tmp.replace(path)


# --- comparison ---------------------------------------------------------------------------

@dataclasses.dataclass
class Difference:
    member: str  # the zip member ("" for the zip container itself)
    kind: str  # only in first | only in second | content | time | mode | order | container
    detail: str  # readable: sizes, offset, ELF section, the bytes on both sides
    offset: int | None = None
    first: str = ""  # the first differing bytes, escaped (first wheel)
    second: str = ""  # ... and the second's

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def _elf_sections(data: bytes) -> list[tuple[str, int, int]] | None:
    """(name, offset, size) of every section of an ELF64 little-endian file that has bytes in
    it, plus its headers; None for anything else."""
    if data[:4] != b"\x7fELF" or len(data) < 64 or data[4] != 2 or data[5] != 1:
        return None
    try:
        phoff, shoff = struct.unpack_from("<QQ", data, 0x20)
        phentsize, phnum, shentsize, shnum, shstrndx = struct.unpack_from("<HHHHH", data, 0x36)
        raw = [struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize) for i in range(shnum)]
        strtab = raw[shstrndx][4]
        out = [("ELF header", 0, 64), ("program headers", phoff, phentsize * phnum),
               ("section headers", shoff, shentsize * shnum)]
        for name_off, sh_type, _flags, _addr, off, size in raw:
            if sh_type != 8 and size:  # 8: SHT_NOBITS holds no bytes in the file
                end = data.index(b"\0", strtab + name_off)
                out.append((data[strtab + name_off:end].decode("ascii", "replace"), off, size))
        return out
    except (struct.error, IndexError, ValueError):
        return None


def _elf_section(data: bytes, offset: int) -> str | None:
    """The name of the ELF section (or header) holding file offset `offset`."""
    sections = _elf_sections(data)
    if sections is None:
        return None
    for name, off, size in sections:
        if off <= offset < off + size:
            return name
    return "between sections"


def _elf_differing(a: bytes, b: bytes) -> str:
    """Where two same-size ELF files differ: differing bytes per section, most first."""
    sections = _elf_sections(a)
    if sections is None or len(a) != len(b):
        return ""
    counts = []
    for name, off, size in sections:
        n = sum(x != y for x, y in zip(a[off:off + size], b[off:off + size]))
        if n:
            counts.append((n, name))
    counts.sort(reverse=True)
    more = f", {len(counts) - 6} more sections" if len(counts) > 6 else ""
    return "differing bytes by section: " + ", ".join(f"{name} {n:,}" for n, name in counts[:6]) + more


def _show(data: bytes, offset: int, width: int = 24) -> str:
    """The bytes from offset on, printable ASCII as is, the rest as \\xNN; with the text
    run they sit in when that is a string (a path, a symbol)."""
    chunk = data[offset:offset + width]
    return "".join(chr(b) if 32 <= b < 127 and b != 92 else f"\\x{b:02x}" for b in chunk) or "(end)"


def _context(data: bytes, offset: int) -> str:
    """The printable string around offset (a path or a symbol name), if it is one."""
    lo = offset
    while lo > 0 and 32 <= data[lo - 1] < 127 and offset - lo < 120:
        lo -= 1
    hi = offset
    while hi < len(data) and 32 <= data[hi] < 127 and hi - offset < 120:
        hi += 1
    text = data[lo:hi].decode("ascii")
    return text if len(text) >= 4 else ""


def first_difference(a: bytes, b: bytes) -> int | None:
    n = min(len(a), len(b))
    lo = 0
    step = 1 << 16
    while lo < n and a[lo:lo + step] == b[lo:lo + step]:
        lo += step
    for i in range(lo, min(lo + step, n)):
        if a[i] != b[i]:
            return i
    return None if len(a) == len(b) else n


def content_difference(member: str, a: bytes, b: bytes) -> Difference:
    off = first_difference(a, b)
    assert off is not None
    differing = sum(x != y for x, y in zip(a, b)) + abs(len(a) - len(b))
    parts = [f"{len(a):,} / {len(b):,} bytes, {differing:,} differ; first at offset {off:,}"]
    section = _elf_section(a, off)
    if section:
        parts.append(f"in ELF section {section}")
    ctx_a, ctx_b = _context(a, off), _context(b, off)
    if ctx_a or ctx_b:
        parts.append(f"text there: {ctx_a!r} / {ctx_b!r}")
    by_section = _elf_differing(a, b)
    if by_section:
        parts.append(by_section)
    return Difference(member, "content", "; ".join(parts), off, _show(a, off), _show(b, off))


def compare(first: Path, second: Path) -> dict:
    """Everything that differs between two wheels (or any two zips), member by member."""
    result = {"first": str(first), "second": str(second),
              "sha256": [sha256(first), sha256(second)]}
    result["identical"] = result["sha256"][0] == result["sha256"][1]
    diffs: list[Difference] = []
    if not result["identical"]:
        try:
            za, zb = zipfile.ZipFile(first), zipfile.ZipFile(second)
        except zipfile.BadZipFile as e:
            raise ReproError(f"{first} or {second} is not a zip ({e}): rebuild it") from None
        with za, zb:
            ia = {i.filename: i for i in za.infolist()}
            ib = {i.filename: i for i in zb.infolist()}
            meta: dict[tuple[str, str, str], list[str]] = {}
            diffs += [Difference(n, "only in first", f"{ia[n].file_size:,} bytes")
                      for n in ia if n not in ib]
            diffs += [Difference(n, "only in second", f"{ib[n].file_size:,} bytes")
                      for n in ib if n not in ia]
            for name in (n for n in ia if n in ib):
                x, y = ia[name], ib[name]
                da, db = za.read(x), zb.read(y)
                if da != db:
                    diffs.append(content_difference(name, da, db))
                if x.date_time != y.date_time:
                    meta.setdefault(("time", str(x.date_time), str(y.date_time)), []).append(name)
                if x.external_attr != y.external_attr:
                    ma, mb = oct(x.external_attr >> 16), oct(y.external_attr >> 16)
                    meta.setdefault(("mode", ma, mb), []).append(name)
            # One row for all members whose time (or mode) differs the same way.
            for (kind, va, vb), names in meta.items():
                member = names[0] if len(names) == 1 else (
                    f"{len(names)} members: {', '.join(names[:3])}"
                    + (", ..." if len(names) > 3 else ""))
                diffs.append(Difference(member, kind, f"{va} / {vb}"))
            common_a = [n for n in ia if n in ib]
            common_b = [n for n in ib if n in ia]
            if common_a != common_b:
                i = next(k for k, (p, q) in enumerate(zip(common_a, common_b)) if p != q)
                diffs.append(Difference(common_a[i], "order",
                                        f"member {i}: {common_a[i]} / {common_b[i]}"))
        if not diffs:
            a, b = first.read_bytes(), second.read_bytes()
            off = first_difference(a, b)
            diffs.append(Difference("", "container",
                                    f"every member and its metadata agree; the zip files differ "
                                    f"first at offset {off:,} (compression, extra fields, comment)",
                                    off, _show(a, off or 0), _show(b, off or 0)))
    result["differences"] = [d.as_dict() for d in diffs]
    return result


def render(result: dict, title: str) -> None:
    """The comparison as a table: rich where it is installed, plain lines otherwise."""
    rows = [(d["member"] or "(zip file)", d["kind"], d["detail"],
             d["first"], d["second"]) for d in result["differences"]]
    verdict = ("IDENTICAL" if result["identical"] else
               f"DIFFERENT: {len(rows)} difference{'s' if len(rows) != 1 else ''}")
    header = [f"{title}: {verdict}",
              f"  first   {result['sha256'][0]}  {result['first']}",
              f"  second  {result['sha256'][1]}  {result['second']}"]
    runs = [(str(k + 1), r["checkout"], f"umask {r['umask']}, TZ={r['TZ']}, USER={r['USER']}, "
             f"LC_ALL={r['LC_ALL']}\nTMPDIR={r['tmpdir']}\nvenvs {r['venvs']}\n"
             f"toolchains {r['toolchain_cache']}", r["started"], f"{r['seconds']} s",
             r["wheel_sha256"][:16] + "...") for k, r in enumerate(result.get("runs", []))]
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        for n, where, how, started, seconds, sha in runs:
            how = how.replace("\n", "\n  ")
            print(f"build {n}: {where}\n  {how}\n  started {started}, took {seconds}\n  sha256 {sha}")
        print("\n".join(header))
        for member, kind, detail, a, b in rows:
            print(f"  {member}  [{kind}]  {detail}")
            if a or b:
                print(f"      first:  {a}\n      second: {b}")
        return
    console = Console(width=max(Console().width, 160))
    if runs:
        table = Table(show_lines=True)
        for name in ("build", "checkout", "environment", "started", "took"):
            table.add_column(name, overflow="fold")
        table.add_column("wheel sha256", overflow="fold")
        for row in runs:
            table.add_row(*row)
        console.print(table, highlight=False, markup=False)
    console.print("\n".join(header), highlight=False, markup=False)
    if rows:
        table = Table(show_lines=True)
        table.add_column("member", overflow="fold", max_width=60)
        table.add_column("what", no_wrap=True)
        table.add_column("detail and first differing bytes (first / second)", overflow="fold")
        for member, kind, detail, a, b in rows:
            table.add_row(member, kind, detail + (f"\n{a}\n{b}" if a or b else ""))
        console.print(table, highlight=False, markup=False)


# --- two builds of one commit -------------------------------------------------------------

# How the two builds differ, besides their checkout paths (the second one long and nested).
# The second also builds its own environment and reads a copy of the toolchain cache at
# another path; both start without SOURCE_DATE_EPOCH, so each takes it from the commit.
VARIANTS = (
    {"dir": "1", "umask": 0o022, "env": {"TZ": "UTC", "USER": "builder", "LOGNAME": "builder",
                                          "LC_ALL": "C.UTF-8"}},
    {"dir": "second-checkout/with/a/much/longer/path/than/the/first/vllm-ternary", "umask": 0o077,
     "env": {"TZ": "XST-14", "USER": "someone-else", "LOGNAME": "someone-else", "LC_ALL": "C"}},
)


def _git(repo: Path, *args: str) -> str:
    out = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True)
    if out.returncode != 0:
        raise ReproError(f"`git {' '.join(args)}` in {repo} failed: {out.stderr.strip()}")
    return out.stdout.strip()


def checkout(repo: Path, commit: str, dest: Path) -> None:
    """A fresh clone of repo at commit in dest (objects shared, nothing copied)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    _git(dest.parent, "clone", "--quiet", "--shared", "--no-checkout", str(repo), str(dest))
    _git(dest, "checkout", "--quiet", "--detach", commit)


def _cache_root() -> Path:
    base = settings.raw("TERNARY_CACHE")
    return Path(base) if base else Path.home() / ".cache" / "vllm-ternary"


def reproduce(repo: Path, target: str, build_args: list[str], workdir: Path, *,
              keep: bool = False, log=print) -> dict:
    """Build target twice from fresh clones of repo's HEAD, with different paths, umasks,
    time zones, users, TMPDIRs, environments and toolchain-cache paths; compare the wheels."""
    import json
    import shutil
    import sys

    commit = _git(repo, "rev-parse", "HEAD")
    dirty = _git(repo, "status", "--porcelain", "--untracked-files=no")
    workdir = workdir.resolve()
    shutil.rmtree(workdir, ignore_errors=True)
    out_dir = repo / "dist" / f"reproduce-{target}"
    shutil.rmtree(out_dir, ignore_errors=True)
    runs = []
    try:
        for i, variant in enumerate(VARIANTS):
            clone = workdir / variant["dir"]
            checkout(repo, commit, clone)
            tmp = workdir / f"tmp-{i + 1}" / ("x" * 20 * i)
            tmp.mkdir(parents=True)
            env = {k: v for k, v in os.environ.items()
                   if k not in ("SOURCE_DATE_EPOCH", "TERNARY_REPO", "TERNARY_VENVS")}
            env.update(variant["env"], TMPDIR=str(tmp))
            if i == 0:
                # The first reuses the invoking checkout's environments (fast when synced).
                env["TERNARY_VENVS"] = settings.raw("TERNARY_VENVS") or str(repo / ".venvs")
            else:
                # The second: its own environment in its clone, its own toolchain cache path
                # (hard links to the first's cache: no download, another path).
                cache = workdir / "toolchain-cache-2"
                src = _cache_root() / "toolchains"
                if src.is_dir():
                    cache.mkdir(parents=True)
                    subprocess.run(["cp", "-al", str(src), str(cache / "toolchains")], check=True)
                env["TERNARY_CACHE"] = str(cache)
            cmd = [sys.executable, "-m", "ternary._build.pipeline", "build", target, *build_args]
            log(f"[reproduce-{target}] build {i + 1} of 2 in {clone} (umask {variant['umask']:03o}, "
                f"TZ={env['TZ']}, USER={env['USER']}, TMPDIR={tmp})")
            t0 = time.monotonic()
            started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            proc = subprocess.run(cmd, cwd=clone, env=env, stdout=sys.stderr,
                                  preexec_fn=lambda m=variant["umask"]: os.umask(m))
            seconds = round(time.monotonic() - t0, 1)
            if proc.returncode != 0:
                raise ReproError(f"build {i + 1} of {target} in {clone} failed (exit "
                                 f"{proc.returncode}); its output is above. Rerun with --keep "
                                 "to look into the checkout")
            report = json.loads((clone / "dist" / f"build-{target}.json").read_text())
            dest = out_dir / str(i + 1)
            dest.mkdir(parents=True)
            wheel = dest / Path(report["wheel"]).name
            shutil.copy2(clone / report["wheel"], wheel)
            (dest / f"build-{target}.json").write_text(json.dumps(report, indent=2) + "\n")
            runs.append({"checkout": str(clone), "started": started, "seconds": seconds,
                         "umask": f"{variant['umask']:03o}", "tmpdir": str(tmp),
                         **{k: env[k] for k in ("TZ", "USER", "LC_ALL")},
                         "venvs": env.get("TERNARY_VENVS", str(clone / ".venvs")),
                         "toolchain_cache": env.get("TERNARY_CACHE", str(_cache_root())),
                         "wheel": str(wheel), "wheel_sha256": report["wheel_sha256"],
                         "source_date_epoch": report["source_date_epoch"]})
    finally:
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)
    result = compare(Path(runs[0]["wheel"]), Path(runs[1]["wheel"]))
    result.update(target=target, commit=commit, runs=runs,
                  uncommitted_changes_ignored=bool(dirty))
    (repo / "dist" / f"reproduce-{target}.json").write_text(json.dumps(result, indent=2) + "\n")
    return result

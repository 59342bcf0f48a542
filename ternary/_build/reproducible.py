"""Bit-identical wheels: the time every member carries (SOURCE_DATE_EPOCH, from the commit),
a normalised zip (fixed times and modes, members in the order bdist_wheel sorted them), and
the comparison of two wheels that `nox -s reproduce-<target>` prints. Standard library only
(it runs in the noxfile's interpreter, before any target environment exists)."""

from __future__ import annotations

import dataclasses
import hashlib
import os
import stat
import struct
import subprocess
import time
import zipfile
from pathlib import Path

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


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


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


def _elf_section(data: bytes, offset: int) -> str | None:
    """The name of the ELF64 little-endian section holding file offset `offset`."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1 or len(data) < 64:
        return None
    try:
        shoff, = struct.unpack_from("<Q", data, 0x28)
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
        sections = [struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize)
                    for i in range(shnum)]
        strtab_off = sections[shstrndx][4]
        for name_off, sh_type, _flags, _addr, off, size in sections:
            if sh_type != 8 and off <= offset < off + size:  # 8: SHT_NOBITS has no bytes
                end = data.index(b"\0", strtab_off + name_off)
                return data[strtab_off + name_off:end].decode("ascii", "replace")
        if offset >= shoff:
            return "section header table"
        return "ELF headers / between sections"
    except (struct.error, IndexError, ValueError):
        return None


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
                    diffs.append(Difference(name, "time", f"{x.date_time} / {y.date_time}",
                                            first=str(x.date_time), second=str(y.date_time)))
                if x.external_attr != y.external_attr:
                    ma, mb = oct(x.external_attr >> 16), oct(y.external_attr >> 16)
                    diffs.append(Difference(name, "mode", f"{ma} / {mb}", first=ma, second=mb))
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
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:
        print("\n".join(header))
        for member, kind, detail, a, b in rows:
            print(f"  {member}  [{kind}]  {detail}")
            if a or b:
                print(f"      first:  {a}\n      second: {b}")
        return
    console = Console(width=max(Console().width, 160))
    console.print("\n".join(header), highlight=False)
    if rows:
        table = Table(show_lines=True)
        table.add_column("member", no_wrap=True)
        table.add_column("what", no_wrap=True)
        table.add_column("detail and first differing bytes (first / second)", overflow="fold")
        for member, kind, detail, a, b in rows:
            table.add_row(member, kind, detail + (f"\n{a}\n{b}" if a or b else ""))
        console.print(table, highlight=False, markup=False)

"""Fetch one .deb from another Debian suite with a private apt configuration.

The system's apt setup (sources, lists, caches, hooks, pinning) is only read, never
changed: every directory apt writes to lives under the caller's work directory, and
APT_CONFIG keeps /etc/apt/apt.conf.d out (its hooks would refresh system caches)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from ternary._build.checks import ToolchainError

SOURCES_LIST = Path("/etc/apt/sources.list")
SOURCES_DIR = Path("/etc/apt/sources.list.d")
DEFAULT_KEYRING = "/usr/share/keyrings/debian-archive-keyring.gpg"

# System settings worth keeping in the private configuration: proxies (corporate networks)
# and the date checks a snapshot mirror needs switched off.
_CARRIED = re.compile(r"^Acquire::(\w+::Proxy\S*|Check-Valid-Until|Check-Date|Retries)\s")


def _deb822_stanzas(text: str) -> list[dict[str, str]]:
    stanzas, cur, key = [], {}, None
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        if not line.strip():
            if cur:
                stanzas.append(cur)
            cur, key = {}, None
        elif line[0] in " \t" and key:
            cur[key] += " " + line.strip()
        elif ":" in line:
            key, _, value = line.partition(":")
            key = key.strip().lower()
            cur[key] = value.strip()
    if cur:
        stanzas.append(cur)
    return stanzas


def debian_mirrors(sources_list: Path | None = None,
                   sources_dir: Path | None = None) -> list[tuple[str, str]]:
    """(uri, keyring) of each configured Debian archive mirror (security archives left
    out: they do not carry other suites' main archive)."""
    sources_list = sources_list or SOURCES_LIST
    sources_dir = sources_dir or SOURCES_DIR
    found: list[tuple[str, str]] = []
    for f in sorted(sources_dir.glob("*.sources")) if sources_dir.is_dir() else []:
        for s in _deb822_stanzas(f.read_text(errors="replace")):
            if "deb" not in s.get("types", "").split() or s.get("enabled", "yes") == "no":
                continue
            for uri in s.get("uris", "").split():
                found.append((uri, s.get("signed-by", DEFAULT_KEYRING)))
    one_line = [sources_list] + (sorted(sources_dir.glob("*.list")) if sources_dir.is_dir() else [])
    for f in one_line:
        if not f.is_file():
            continue
        for line in f.read_text(errors="replace").splitlines():
            m = re.match(r"^\s*deb\s+(\[[^\]]*\]\s+)?(\S+)\s", line)
            if m:
                opts = m.group(1) or ""
                key = re.search(r"signed-by=(\S+?)[\s\]]", opts)
                found.append((m.group(2), key.group(1) if key else DEFAULT_KEYRING))
    mirrors = [(u.rstrip("/"), k) for u, k in found
               if u.rstrip("/").endswith("/debian") and "security" not in u]
    return list(dict.fromkeys(mirrors))


def _carried_settings() -> list[str]:
    try:
        out = subprocess.run(["apt-config", "dump"], capture_output=True, text=True,
                             check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        return []
    return [line for line in out.splitlines() if _CARRIED.match(line)]


def private_config(work: Path, *, uri: str, keyring: str, suite: str, component: str,
                   arch: str) -> dict[str, str]:
    """Write a self-contained apt configuration under work; returns the environment
    that makes apt-get use it."""
    for d in ("apt.conf.d", "sources.list.d", "preferences.d", "lists/partial",
              "archives/partial"):
        (work / d).mkdir(parents=True, exist_ok=True)
    (work / "status").touch()
    (work / "sources.list").write_text(f"deb [signed-by={keyring}] {uri} {suite} {component}\n")
    conf = [
        'Dir::Etc::main "/dev/null";',
        f'Dir::Etc::parts "{work}/apt.conf.d";',
        f'Dir::Etc::sourcelist "{work}/sources.list";',
        f'Dir::Etc::sourceparts "{work}/sources.list.d";',
        'Dir::Etc::preferences "/dev/null";',
        f'Dir::Etc::preferencesparts "{work}/preferences.d";',
        f'Dir::State::lists "{work}/lists";',
        f'Dir::State::status "{work}/status";',
        f'Dir::Cache "{work}";',
        f'Dir::Cache::archives "{work}/archives";',
        'Dir::Cache::pkgcache "";',
        'Dir::Cache::srcpkgcache "";',
        f'APT::Architecture "{arch}";',
        f'APT::Architectures {{ "{arch}"; }};',
        'Acquire::Languages "none";',
        # apt drops to the _apt user for downloads; that user cannot write a root-owned
        # private directory, so download as ourselves.
        'APT::Sandbox::User "root";' if os.geteuid() == 0 else "",
        *[line if line.endswith(";") else line + ";" for line in _carried_settings()],
    ]
    (work / "apt.conf").write_text("\n".join(c for c in conf if c) + "\n")
    return {**os.environ, "APT_CONFIG": str(work / "apt.conf"), "LC_ALL": "C"}


def fetch_deb(work: Path, *, package: str, version: str, suite: str, component: str,
              arch: str, progress: bool = True) -> Path:
    """Download package=version from suite/component of the system's Debian mirror into
    work/archives; returns the .deb path. Raises ToolchainError with apt's message."""
    mirrors = debian_mirrors()
    if not mirrors:
        raise ToolchainError(
            f"no Debian archive mirror found in {SOURCES_LIST} or {SOURCES_DIR}/*.sources "
            f"(a `deb` entry whose URI ends in /debian): the deb toolchain needs one to fetch "
            f"{package} {version} from {suite} {component}. Add one, or use `--toolchain system`"
        )
    errors = []
    for uri, keyring in mirrors:
        env = private_config(work, uri=uri, keyring=keyring, suite=suite, component=component,
                             arch=arch)
        quiet = [] if progress else ["-qq"]
        upd = subprocess.run(["apt-get", *quiet, "update"], env=env, text=True,
                             capture_output=not progress)
        if upd.returncode != 0:
            errors.append(f"{uri}: apt-get update failed{': ' + upd.stderr.strip() if upd.stderr else ''}")
            continue
        dl = subprocess.run(["apt-get", *quiet, "download", f"{package}:{arch}={version}"],
                            env=env, cwd=work / "archives", text=True,
                            capture_output=not progress)
        debs = sorted((work / "archives").glob(f"{package}_*_{arch}.deb"))
        if dl.returncode == 0 and debs:
            return debs[0]
        errors.append(f"{uri}: apt-get download {package}={version} failed"
                      f"{': ' + dl.stderr.strip() if dl.stderr else ''}")
    raise ToolchainError(
        f"could not fetch {package} {version} ({suite} {component}, {arch}) from the configured "
        f"Debian mirrors: " + "; ".join(errors) + ". Check network access to the mirror, or use "
        "`--toolchain system` with an installed CUDA toolkit"
    )

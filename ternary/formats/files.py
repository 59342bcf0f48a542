"""The files of a Hugging Face model directory: config.json, safetensors shards (single file or
model.safetensors.index.json), read lazily one tensor at a time; and a writer that emits
shards as it goes so a conversion never holds the whole model in memory."""

from __future__ import annotations

import errno
import json
import os
import struct
from pathlib import Path
from typing import Iterator

import torch

from ternary.formats.errors import FormatError

CONFIG = "config.json"
INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"

# safetensors header dtype names -> bytes per element (to check that a file is complete)
_DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2,
                "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}


def read_header(path: Path) -> dict[str, dict]:
    """The tensor table of one safetensors file, after checking that the file holds every
    byte the header promises (a truncated download otherwise fails deep inside a reader)."""
    try:
        size = path.stat().st_size
        f = path.open("rb")
    except OSError as e:  # a dangling link (a copied Hugging Face cache), a directory, ...
        raise FormatError(path, None, f"cannot read it: {e.strerror or e}",
                          "re-download it, or copy the file the link points to") from None
    with f:
        head = f.read(8)
        if len(head) < 8:
            raise FormatError(path, None, f"truncated safetensors file: {size} bytes, shorter "
                              "than the 8-byte header length", "re-download or re-write it")
        (n,) = struct.unpack("<Q", head)
        if 8 + n > size:
            raise FormatError(path, None, f"truncated safetensors file: header says {n} header "
                              f"bytes but the file has {size} bytes in all",
                              "re-download or re-write it")
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise FormatError(path, None, f"unreadable safetensors header ({e})",
                              "re-download or re-write it") from None
    if not isinstance(header, dict):
        raise FormatError(path, None, f"safetensors header is a JSON {type(header).__name__}, "
                          "not an object of tensors", "re-download or re-write it")
    meta = header.pop("__metadata__", None)
    if meta is not None and not (isinstance(meta, dict)
                                 and all(isinstance(v, str) for v in meta.values())):
        # safetensors refuses to open such a file; say so here, where the file is named
        raise FormatError(path, None, f"safetensors __metadata__ must map names to strings; it "
                          f"is {meta!r}", "re-write the file (its tensors may be intact)")
    end = 0
    for name, info in header.items():
        _check_entry(path, name, info)
        begin, stop = info["data_offsets"]
        count = 1
        for d in info["shape"]:
            count *= d
        want = count * _DTYPE_BYTES.get(info["dtype"], 0)
        if _DTYPE_BYTES.get(info["dtype"]) and stop - begin != want:
            raise FormatError(path, name, f"header gives {stop - begin} bytes for a "
                              f"{info['dtype']} {info['shape']} tensor, which needs {want}",
                              "re-write the file")
        end = max(end, stop)
    # safetensors lays the tensors out back to back from offset 0 and refuses anything else
    # when the file is opened; say which tensor breaks it here, where the file is named
    at = 0
    for name, info in sorted(header.items(), key=lambda kv: tuple(kv[1]["data_offsets"])):
        begin, stop = info["data_offsets"]
        if begin != at:
            raise FormatError(path, name, f"data_offsets {[begin, stop]} "
                              f"{'overlap the previous tensor' if begin < at else 'leave a gap'}"
                              f" (the data so far ends at byte {at})",
                              "re-download or re-write the file")
        at = stop
    if 8 + n + end > size:
        raise FormatError(path, None, f"truncated safetensors file: the tensors need "
                          f"{8 + n + end} bytes but the file has {size}",
                          "re-download or re-write it")
    return header


def _check_entry(path: Path, name: str, info) -> None:
    """One header entry has the keys and types the safetensors spec gives it."""
    def bad(what: str):
        return FormatError(path, name, f"malformed safetensors header entry: {what}",
                           "re-download or re-write the file")

    if not isinstance(info, dict):
        raise bad(f"a JSON {type(info).__name__} instead of an object")
    for key in ("dtype", "shape", "data_offsets"):
        if key not in info:
            raise bad(f"no {key!r}")
    if not isinstance(info["dtype"], str):
        raise bad(f"dtype {info['dtype']!r} is not a string")

    def ints(v, n=None) -> bool:
        return (isinstance(v, list) and (n is None or len(v) == n)
                and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v))

    if not ints(info["shape"]):
        raise bad(f"shape {info['shape']!r} is not a list of non-negative integers")
    if not ints(info["data_offsets"], 2) or info["data_offsets"][0] > info["data_offsets"][1]:
        raise bad(f"data_offsets {info['data_offsets']!r} is not [begin, end] with "
                  "0 <= begin <= end")


class ModelFiles:
    """Lazy access to the tensors of a model directory. Headers are read (and checked) up
    front; tensor data is read from a memory map only when asked for.

    With a `problems` list, a shard whose header is unreadable or truncated is recorded
    there and left out (its tensors in `unreadable`), so `inspect` goes on to check the
    other shards; without one it raises."""

    def __init__(self, model_dir: str | os.PathLike, problems: list | None = None):
        self.dir = Path(model_dir)
        self._problems = problems
        self.unreadable: dict[str, Path] = {}  # tensor -> its shard, whose header failed
        # shards whose header failed, where no index says what they hold
        self.unlisted_bad: list[Path] = []
        if not self.dir.is_dir():
            raise FormatError(self.dir, None, "not a directory",
                              "pass a Hugging Face model directory")
        self.config = self._read_config()
        self._where: dict[str, Path] = {}  # tensor -> shard
        self.headers: dict[Path, dict[str, dict]] = {}
        index = self.dir / INDEX
        if index.exists():
            self._read_index(index)
        else:
            shards = sorted(self.dir.glob("*.safetensors"))
            if not shards:
                raise FormatError(self.dir, None, "no *.safetensors files and no " + INDEX,
                                  "only safetensors checkpoints are supported")
            for shard in shards:
                if self._header(shard) is None:
                    self.unlisted_bad.append(shard)
                    continue
                for name in self._header(shard):
                    if name in self._where:
                        raise FormatError(shard, name, f"tensor also stored in "
                                          f"{self._where[name].name}", "remove one copy")
                    self._where[name] = shard
        if not self._where and self._problems:  # no shard readable: nothing to go on with
            err = FormatError.of(self._problems[0])
            err.records = list(self._problems)  # (inspect lists them all)
            raise err
        self._open: dict[Path, object] = {}

    def _read_config(self) -> dict:
        path = self.dir / CONFIG
        if not path.exists():
            raise FormatError(path, None, "missing", "a model directory needs its config.json")
        try:
            config = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise FormatError(path, None, f"not valid JSON ({e})",
                              "fix or re-download it") from None
        if not isinstance(config, dict):
            raise FormatError(path, None, f"is a JSON {type(config).__name__}, not an object",
                              "fix or re-download it")
        for key in ("quantization_config", "text_config"):
            if config.get(key) is not None and not isinstance(config[key], dict):
                raise FormatError(path, None, f"{key} is {config[key]!r}, not an object",
                                  "fix config.json")
        return config

    def _read_index(self, index: Path) -> None:
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError) as e:
            raise FormatError(index, None, f"no readable weight_map ({e!r})",
                              "fix or re-download it") from None
        if not isinstance(weight_map, dict):
            raise FormatError(index, None, f"weight_map is a JSON {type(weight_map).__name__}, "
                              "not an object", "fix or re-download it")
        for name, fname in weight_map.items():
            if not isinstance(fname, str) or not fname:
                raise FormatError(index, name, f"weight_map gives {fname!r} as its file",
                                  "fix or re-download the index")
            shard = self.dir / fname
            if not shard.exists():
                raise FormatError(index, name, f"maps to {fname}, which does not exist",
                                  "re-download the missing shard")
            if self._header(shard) is None:
                self.unreadable[name] = shard
                continue
            if name not in self._header(shard):
                raise FormatError(shard, name, f"listed in {INDEX} but absent from the shard",
                                  "re-download the shard or fix the index")
            self._where[name] = shard

    def _header(self, shard: Path) -> dict[str, dict] | None:
        if shard not in self.headers:
            try:
                self.headers[shard] = read_header(shard)
            except FormatError as e:
                if self._problems is None:
                    raise
                self._problems.append(e.record)
                self.headers[shard] = None
        return self.headers[shard]

    # -- queries ---------------------------------------------------------------------

    @property
    def quantization_config(self) -> dict:
        return self.config.get("quantization_config") or {}

    def names(self) -> list[str]:
        return list(self._where)

    def __contains__(self, name: str) -> bool:
        return name in self._where

    def file_of(self, name: str) -> Path:
        return self._where[name]

    def shape(self, name: str) -> list[int]:
        return list(self._header(self._where[name])[name]["shape"])

    def dtype(self, name: str) -> str:
        """The safetensors dtype name (U8, I8, BF16, F32, ...), without reading data."""
        return self._header(self._where[name])[name]["dtype"]

    def nbytes(self, name: str) -> int:
        begin, end = self._header(self._where[name])[name]["data_offsets"]
        return end - begin

    def get(self, name: str) -> torch.Tensor:
        from safetensors import safe_open

        shard = self._where[name]
        try:
            if shard not in self._open:
                # one shard mapped at a time: pages of a memory map count as resident, and a
                # stream over a large model would otherwise keep every shard it read mapped
                self._open.clear()
                self._open[shard] = safe_open(str(shard), framework="pt")
            return self._open[shard].get_tensor(name)
        except Exception as e:  # safetensors' own SafetensorError, OSError, ...
            if isinstance(e, FormatError):
                raise
            raise FormatError(shard, name, f"safetensors cannot read it: "
                              f"{type(e).__name__}: {e}",
                              "re-download or re-write the file") from None

    def shards(self) -> list[Path]:
        return sorted(set(self._where.values()))

    def close(self) -> None:
        self._open.clear()

    def __enter__(self) -> "ModelFiles":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def test_pause() -> None:
    """TERNARY_TEST_SLOW_WRITE_S: a test's window to kill a writer half-way."""
    from ternary import settings

    s = float(settings.get("TERNARY_TEST_SLOW_WRITE_S") or 0)
    if s > 0:
        import time

        time.sleep(s)


class ShardWriter:
    """Writes tensors into safetensors shards of at most `max_shard_bytes`, flushing each
    shard as soon as it is full. Shards are renamed to model-0000i-of-0000n.safetensors
    (plus the index) on close, because n is known only then; one shard becomes
    model.safetensors without an index, as transformers writes it."""

    def __init__(self, out_dir: str | os.PathLike, max_shard_bytes: int = 2 << 30):
        self.dir = Path(out_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.max = max_shard_bytes
        self._pending: dict[str, torch.Tensor] = {}
        self._pending_bytes = 0
        self._written: list[tuple[Path, list[str]]] = []
        self.total_bytes = 0

    def add(self, name: str, tensor: torch.Tensor) -> None:
        if name in self._pending or any(name in names for _, names in self._written):
            raise ValueError(f"tensor {name!r} written twice")
        size = tensor.numel() * tensor.element_size()
        if self._pending and self._pending_bytes + size > self.max:
            self._flush()
        self._pending[name] = tensor.contiguous()
        self._pending_bytes += size
        self.total_bytes += size

    def _flush(self) -> None:
        from safetensors.torch import save_file

        path = self.dir / f".shard-{len(self._written) + 1:05d}.safetensors.partial"
        try:
            save_file(self._pending, str(path), metadata={"format": "pt"})
        except Exception as e:  # safetensors reports a full disk as SafetensorError
            if type(e).__name__ != "SafetensorError" or "I/O error" not in str(e):
                raise
            code = errno.ENOSPC if "os error 28" in str(e) else errno.EIO
            raise OSError(code, os.strerror(code), str(path)) from e
        self._written.append((path, list(self._pending)))
        self._pending, self._pending_bytes = {}, 0

    def close(self) -> list[Path]:
        if self._pending or not self._written:
            self._flush()
        n = len(self._written)
        if n == 1:
            final = self.dir / SINGLE
            self._written[0][0].replace(final)
            return [final]
        weight_map, finals = {}, []
        for i, (path, names) in enumerate(self._written, 1):
            final = self.dir / f"model-{i:05d}-of-{n:05d}.safetensors"
            path.replace(final)
            finals.append(final)
            weight_map.update({t: final.name for t in names})
        (self.dir / INDEX).write_text(json.dumps(
            {"metadata": {"total_size": self.total_bytes}, "weight_map": weight_map}, indent=2))
        return finals


def iter_tensor_names(files: ModelFiles) -> Iterator[str]:
    """Tensor names shard by shard, in file order, so a stream touches each shard once."""
    for shard in files.shards():
        for name in files.headers[shard] or ():
            if files.file_of(name) == shard:
                yield name

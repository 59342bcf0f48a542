"""A quantized linear module as every reader here hands it out: ternary codes, a float32
scale in the canonical layout, the group size, and what was found on the way (for
`ternary inspect`). Plus the checks the format readers share."""

from __future__ import annotations

import dataclasses
from math import gcd
from typing import Any

import torch

from ternary.formats.errors import FormatError, Problem
from ternary.formats.files import CONFIG, INDEX, ModelFiles
from ternary.formats.modules import not_converted, split_fused_layers

SCALE_DTYPE = torch.float32


@dataclasses.dataclass
class TernaryModule:
    """One quantized linear layer `name` (without `.weight`), N outputs, K inputs.

    `scale` is float32 in the canonical layout: [1] (tensor), [N] (channel, group_size 0) or
    [N, ceil(K/group_size)] (group). The dense weight is codes * scale. `packed` is the
    canonical uint8 [N, K/4] (created from the codes when the source stored another layout).
    """

    name: str
    n: int
    k: int
    scale: torch.Tensor
    group_size: int
    file: str
    codes_: torch.Tensor | None = None  # int8 [N, K] in {-1, 0, 1}
    packed_: torch.Tensor | None = None  # uint8 [N, K/4]
    info: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def scale_mode(self) -> str:
        if self.group_size:
            return "group"
        return "tensor" if self.scale.numel() == 1 and self.n != 1 else "channel"

    @property
    def codes(self) -> torch.Tensor:
        if self.codes_ is None:
            from ternary import ops

            self.codes_ = ops.unpack(self.packed_)
        return self.codes_

    @property
    def packed(self) -> torch.Tensor:
        if self.packed_ is None:
            if self.k % 4:
                raise FormatError(self.file, f"{self.name}.weight",
                                  f"K={self.k} is not a multiple of 4, so the canonical "
                                  "[N, K/4] packing cannot hold this module",
                                  "list it in modules_to_not_convert (convert "
                                  "--not-convert NAME) to keep it as it is")
            from ternary import ops

            self.packed_ = ops.pack(self.codes_)
        return self.packed_

    def dense(self) -> torch.Tensor:
        """float32 [N, K]: the weight exactly as the checkpoint defines it."""
        return self.codes.to(torch.float32) * expand_scale(self.scale, self.n, self.k,
                                                           self.group_size)

    def canonical(self, mode: str, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(packed, scale) in the checkpoint-wide scale `mode` (a coarser scale is repeated
        into the finer layout; that is exact, see common_scale)."""
        if mode == "tensor":
            scale = self.scale.reshape(1)
        elif mode == "channel":
            scale = self.scale.reshape(-1).expand(self.n).contiguous()
        else:
            groups = -(-self.k // group_size)
            if self.group_size:
                starts = torch.arange(groups) * group_size // self.group_size
                scale = self.scale[:, starts].contiguous()
            else:
                scale = self.scale.reshape(-1, 1).expand(self.n, groups).contiguous()
        return self.packed, scale

    def histogram(self) -> dict[str, int]:
        counts = torch.bincount((self.codes.reshape(-1).to(torch.int64) + 1), minlength=3)
        return {"-1": int(counts[0]), "0": int(counts[1]), "+1": int(counts[2])}


def quantized_module_names(files: ModelFiles, code_dtype: str) -> list[str]:
    """Modules with a weight_scale, or a weight stored in the format's code dtype."""
    names = set()
    for t in files.names():
        if t.endswith(".weight_scale"):
            names.add(t[: -len(".weight_scale")])
        elif t.endswith(".weight") and files.dtype(t) == code_dtype:
            names.add(t[: -len(".weight")])
    return sorted(names)


def expand_scale(scale: torch.Tensor, n: int, k: int, group_size: int) -> torch.Tensor:
    if group_size:
        return scale.repeat_interleave(group_size, dim=1)[:, :k]
    return scale.reshape(-1, 1)


def common_scale(modules: list[tuple[int, bool]]) -> tuple[str, int | None]:
    """The one (scale, group_size) of config.json for modules given as (group_size,
    scale_is_one_value) pairs. A tensor or channel scale is exact in any finer layout (its
    value repeats); group sizes g_i are all exact at gcd(g_i), whose groups nest in each."""
    groups = [g for g, _ in modules if g]
    if groups:
        g = 0
        for x in groups:
            g = gcd(g, x)
        return "group", g
    if all(one for _, one in modules):
        return "tensor", None
    return "channel", None


# -------------------------------------------------------------------------------------
# Checks the readers share. Each appends Problems and returns whether the tensor is usable.


def where(files: ModelFiles, tensor: str | None) -> str:
    if tensor is not None and tensor in files:
        return str(files.file_of(tensor))
    return str(files.dir / CONFIG)


def problem(files: ModelFiles, tensor: str | None, text: str, hint: str = "") -> Problem:
    return Problem(where(files, tensor), tensor, text, hint)


def skip_list_problems(qc: dict, where: str = "quantization_config.") -> list[tuple[str, str]]:
    """modules_to_not_convert must be a list of names (a string would read letter by letter
    and match nothing): the config_problems of every format share this."""
    skip = qc.get("modules_to_not_convert")
    if skip is None or (isinstance(skip, list) and all(isinstance(e, str) for e in skip)):
        return []
    what = f"{where}modules_to_not_convert is {skip!r}; expected a list of names"
    return [(what, 'fix config.json, e.g. ["lm_head"]')]


def split_fused_problems(files: ModelFiles) -> list[tuple[str, str]]:
    """modules_to_not_convert naming part of a layer vLLM fuses (q_proj without k_proj and
    v_proj): vLLM refuses such a checkpoint (ternary.vllm.spec.is_skipped)."""
    skip = files.quantization_config.get("modules_to_not_convert")
    if not isinstance(skip, list):
        return []
    names = [t[: -len(".weight")] for t in files.names() if t.endswith(".weight")]
    return [((f"quantization_config.modules_to_not_convert lists {listed} but not {missing}, "
              f"which vLLM loads as one layer {fused!r}"),
             "list all of them or none, and store them all dense or all packed")
            for fused, listed, missing in split_fused_layers(names, skip)]


def listed_but_packed(files: ModelFiles, name: str, problems: list[Problem]) -> bool:
    """A module modules_to_not_convert lists is stored dense; one stored packed contradicts
    the list (and vLLM, which serves listed modules dense, cannot load it). True when fine."""
    skip = files.quantization_config.get("modules_to_not_convert")
    if not (isinstance(skip, list) and not_converted(name, skip)):
        return True
    problems.append(problem(files, f"{name}.weight", "stored packed, but quantization_config."
                            f"modules_to_not_convert ({skip}) lists it, which means dense",
                            "remove it from modules_to_not_convert, or store it dense "
                            "(ternary convert --not-convert)"))
    return False


def weight_and_scale(files: ModelFiles, name: str, layout: str,
                     weight: tuple[str, tuple[str, ...], str],
                     scale: tuple[str, tuple[str, ...], str], problems: list[Problem]
                     ) -> tuple[list[int], bool] | None:
    """What every packed format's reader checks first: module `name` has its weight and
    weight_scale tensors, modules_to_not_convert does not list it, both have their format's
    dtypes and the weight is 2-D (`layout`, e.g. "[N, K/4]"). `weight` and `scale` are (what
    it is, dtypes allowed, what it is called in a dtype problem). Returns None where the reader cannot go on, else the
    weight's shape and whether the dtypes were right (a reader with a wrong dtype still
    checks the shapes, so inspect lists every problem), the problems recorded."""
    wt, st = f"{name}.weight", f"{name}.weight_scale"
    ok = require(files, wt, weight[0], problems)
    ok = require(files, st, scale[0], problems) and ok
    if not (ok and listed_but_packed(files, name, problems)):
        return None
    ok = check_dtype(files, wt, weight[1], weight[2], problems)
    ok = check_dtype(files, st, scale[1], scale[2], problems) and ok
    shape = files.shape(wt)
    if len(shape) != 2:
        problems.append(problem(files, wt, f"{weight[0].split(' (')[0]} has shape {shape}; "
                                f"expected 2-D {layout}", "re-export the checkpoint"))
        return None
    return shape, ok


def config_ok(files: ModelFiles, found: list[tuple[str, str]], problems: list[Problem]) -> bool:
    """Records a format's config_problems (problem, what to do) against config.json; True
    when there were none."""
    problems.extend(problem(files, None, what, fix) for what, fix in found)
    return not found


def require(files: ModelFiles, tensor: str, what: str, problems: list[Problem]) -> bool:
    if tensor in files:
        return True
    if tensor in files.unreadable:  # its shard's problem is already on the list
        return False
    near = sorted(t for t in files.names() if t.startswith(tensor.rsplit(".", 1)[0] + "."))
    # the file that should hold it: its module's shard, or the index that lists the shards
    index = files.dir / INDEX
    file = files.file_of(near[0]) if near else index if index.exists() else files.dir
    unread = ""
    if files.unlisted_bad:
        unread = (f" (not in the readable shards; {', '.join(p.name for p in files.unlisted_bad)}"
                  " could not be read and may hold it)")
    problems.append(Problem(str(file), tensor, f"missing {what}{unread}; tensors of this "
                            f"module: {near}", f"the checkpoint must store {tensor}"))
    return False


def check_dtype(files: ModelFiles, tensor: str, allowed: tuple[str, ...], what: str,
                problems: list[Problem]) -> bool:
    dtype = files.dtype(tensor)
    if dtype in allowed:
        return True
    problems.append(problem(files, tensor, f"wrong dtype {dtype} {files.shape(tensor)} for "
                            f"{what}; expected {' or '.join(allowed)}",
                            "re-export the checkpoint with the format's dtypes"))
    return False


def check_scale_values(files: ModelFiles, tensor: str, scale: torch.Tensor,
                       problems: list[Problem]) -> bool:
    from ternary.ops import bad_scale_values

    why = bad_scale_values(scale)
    if why is None:
        return True
    problems.append(problem(files, tensor, why.split("; ")[0],
                            "every scale must be finite and non-zero; re-quantize those rows"))
    return False


def two_bit_planes(packed: torch.Tensor) -> list[torch.Tensor]:
    """The four 2-bit fields of every byte, low bits first."""
    return [(packed >> (2 * i)) & 3 for i in range(4)]


def report_code3(files: ModelFiles, tensor: str, fields: torch.Tensor, layout: str,
                 problems: list[Problem]) -> bool:
    """fields: the 2-bit codes in logical [N, K] order."""
    bad = fields == 3
    if not bad.any():
        return True
    first = bad.nonzero()[0].tolist()
    problems.append(problem(files, tensor, f"{int(bad.sum())} codes are 3, which is invalid "
                            f"(only 0, 1, 2 encode -1, 0, +1); first at logical [n, k] = "
                            f"{first} ({layout})", "the weight is corrupt: re-export it"))
    return False


def check_config_shape(files: ModelFiles, tensor: str, n: int | None, k: int,
                       expected: tuple[tuple[int, int], str] | None,
                       problems: list[Problem]) -> bool:
    if expected is None:
        return True
    (en, ek), why = expected
    if (n is not None and n != en) or k != ek:
        # n None: a format that packs along N checks its rows itself, so only K is compared
        got, want = ((f"shape [N={n}, K={k}]", f"[N={en}, K={ek}]") if n is not None
                     else (f"K={k}", f"K={ek}"))
        problems.append(problem(files, tensor, f"{got} contradicts config.json ({why}), which "
                                f"gives {want}", "the weights do not belong to this config.json"))
        return False
    return True

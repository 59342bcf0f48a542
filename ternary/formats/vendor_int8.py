"""`vendor-int8`: P.weight int8 [N, K], one code per byte in the low two bits, and a float32
P.weight_scale: [N] per channel, or [N, C] when scales are stored per group of columns.

Vendors differ in two ways that the data, not the label, must settle:
- the code map: 0/1/2 -> -1/0/+1 ("neg-zero-pos") or 0/+1/-1 ("zero-pos-neg"). Quantized
  weights are close to sign-symmetric, so the two codes meaning -1 and +1 occur about equally
  often while the code meaning 0 does not; the pair that balances names the map.
- the group size: a stated quantization_config.group_size can be wrong. The columns of the
  scale tensor show the truth: scales that repeat in runs of r columns of width w are groups
  of w * r (and a row of identical columns is a per-channel scale).
Both are reported (`ternary inspect`); an override wins; anything undecidable is an error
that names the override to pass."""

from __future__ import annotations

import math

import torch

from ternary.formats import module as m
from ternary.formats.errors import Problem
from ternary.formats.files import ModelFiles
from ternary.formats.modules import expected_shape

NAME = "vendor-int8"
ALIASES = ("vendor-int8", "vendor_int8")
CODE_MAPS = {"neg-zero-pos": (-1, 0, 1), "zero-pos-neg": (0, 1, -1)}
# Decide only when the losing map's imbalance exceeds the winner's by this many standard
# deviations of a count difference (at most sqrt(n) for n codes) and by a factor of 2.
SIGMAS = 6.0
RATIO = 2.0


def encode(codes: torch.Tensor, scale: torch.Tensor, code_map: str = "neg-zero-pos"
           ) -> dict[str, torch.Tensor]:
    """The tensors of one module from int8 codes [N, K] in {-1, 0, 1} and a float32 scale
    ([N] or [N, C]) in the given code map."""
    table = torch.tensor(CODE_MAPS[code_map])
    stored = torch.empty_like(codes)
    for code, value in enumerate(table.tolist()):
        stored[codes == value] = code
    return {"weight": stored, "weight_scale": scale.to(torch.float32).contiguous()}


def detect_code_map(counts: list[int]) -> tuple[str | None, str]:
    """(map or None when undecidable, the evidence) from the counts of codes 0, 1, 2."""
    c0, c1, c2 = counts[:3]
    n = c0 + c1 + c2
    gaps = {"neg-zero-pos": abs(c0 - c2), "zero-pos-neg": abs(c1 - c2)}
    evidence = (f"code counts 0:{c0} 1:{c1} 2:{c2}; the -1/+1 pair is (0, 2) for neg-zero-pos "
                f"(imbalance {gaps['neg-zero-pos']}) and (1, 2) for zero-pos-neg "
                f"(imbalance {gaps['zero-pos-neg']})")
    (best, gb), (other, go) = sorted(gaps.items(), key=lambda kv: kv[1])
    if n and go - gb > SIGMAS * math.sqrt(n) and go > RATIO * gb:
        return best, evidence
    return None, evidence


def column_width(k: int, columns: int, stated: int | None) -> tuple[int | None, str]:
    """The number of K positions each scale column covers, and why."""
    candidates = [g for g in range(1, k + 1) if -(-k // g) == columns]
    if stated in candidates:
        return stated, f"{columns} scale columns fit the stated group_size {stated}"
    why = (f"stated group_size {stated} would need {-(-k // stated)} columns, " if stated
           else "no group_size stated, ")
    if k % columns == 0:
        g = k // columns
        why += f"K={k} / {columns} columns = {g}"
        if len(candidates) > 1:  # the data cannot tell these apart: say so, never silently
            why += (f" (group sizes {candidates[0]}-{candidates[-1]} also make {columns} "
                    "columns: pass --group-size if the model used another)")
        return g, why
    if len(candidates) == 1:
        return candidates[0], why + f"only group size {candidates[0]} gives {columns} columns"
    return None, why + (f"K={k} with {columns} columns fits group sizes {candidates[:5]}"
                        f"{'...' if len(candidates) > 5 else ''}")


def runs(scale: torch.Tensor) -> int:
    """Largest r such that every row's columns are constant within blocks of r columns
    (block j // r; the last block may be shorter): the gcd of the columns where any row's
    value changes, or all columns when none does."""
    c = scale.shape[1]
    changes = (scale[:, 1:] != scale[:, :-1]).any(dim=0).nonzero().flatten() + 1
    r = 0
    for j in changes.tolist():
        r = math.gcd(r, j)
    return r or c


def prepare(files: ModelFiles, problems: list[Problem], code_map: str | None = None,
            group_size: int | None = None, **_overrides) -> dict:
    qc = files.quantization_config
    stated_map = qc.get("code_map")
    state = {"code_map": None, "code_map_evidence": "", "group_size_override": group_size,
             "stated_group_size": qc.get("group_size") or None}
    m.config_ok(files, m.skip_list_problems(qc), problems)
    for label, value in (("code_map override", code_map), ("quantization_config.code_map",
                                                           stated_map)):
        if value is not None and value not in CODE_MAPS:
            problems.append(m.problem(files, None, f"{label} is {value!r}; expected one of "
                                      f"{list(CODE_MAPS)}", "pass --code-map with one of them"))
            return state
    override_bad = group_size is not None and (isinstance(group_size, bool) or not isinstance(
        group_size, int) or group_size <= 0)
    if override_bad:
        problems.append(m.problem(files, None, f"group_size override is {group_size!r}; expected "
                                  "a positive integer", "pass --group-size G with G > 0"))
        state["group_size_override"] = None
    stated = qc.get("group_size")
    if isinstance(stated, int) and not isinstance(stated, bool) and stated <= 0:
        # GPTQ / AWQ-style configs write -1 or 0 for "no groups": not stated; the scale
        # columns tell (ternary inspect reports it)
        state["stated_group_size"] = None
    elif stated is not None and (isinstance(stated, bool) or not isinstance(stated, int)):
        state["stated_group_size"] = None
        if group_size is None or override_bad:
            problems.append(m.problem(files, None, f"quantization_config.group_size is "
                                      f"{stated!r}; expected an integer",
                                      "fix config.json, or pass --group-size G to use G instead"))
    if code_map is not None:
        state["code_map"], state["code_map_evidence"] = code_map, "override"
        return state
    counts = [0, 0, 0, 0]
    for name in module_names(files):
        t = f"{name}.weight"
        if t in files and files.dtype(t) == "I8":
            w = files.get(t).view(torch.uint8) & 3
            for i, c in enumerate(torch.bincount(w.reshape(-1).to(torch.int64),
                                                 minlength=4).tolist()):
                counts[i] += c
    detected, evidence = detect_code_map(counts)
    if detected is None and stated_map is None:
        problems.append(m.problem(files, None, "cannot tell the vendor-int8 code map from the "
                                  f"data ({evidence})", "pass --code-map neg-zero-pos (0/1/2 "
                                  "-> -1/0/+1) or --code-map zero-pos-neg (0/1/2 -> 0/+1/-1); "
                                  "in Python code_map=..."))
    elif detected is None:
        state["code_map"] = stated_map
        state["code_map_evidence"] = f"stated by config.json; the data cannot tell ({evidence})"
    elif stated_map is not None and stated_map != detected:
        problems.append(m.problem(files, None, f"quantization_config.code_map says "
                                  f"{stated_map!r} but the codes say {detected!r} ({evidence})",
                                  f"pass --code-map {stated_map} or --code-map {detected} to "
                                  "settle it"))
    else:
        state["code_map"], state["code_map_evidence"] = detected, f"detected: {evidence}"
    return state


def module_names(files: ModelFiles) -> list[str]:
    return m.quantized_module_names(files, "I8")


def _group(files, st, scale, n, k, state, problems) -> tuple[torch.Tensor, int, str] | None:
    """The scale in canonical layout, its group size (0 = channel/tensor) and the evidence."""
    stated = state["stated_group_size"]
    override = state["group_size_override"]
    if scale.dim() == 1 and scale.shape[0] in (1, n):
        note = "per channel" if scale.shape[0] == n else "per tensor"
        if stated and stated < k:
            note += f" (config.json states group_size {stated}, but the scale is {note})"
        return scale, 0, note
    if scale.dim() != 2 or scale.shape[0] != n:
        problems.append(m.problem(files, st, f"scale shape {list(scale.shape)} fits neither "
                                  f"[N]={[n]} nor [N, groups] for the weight [N={n}, K={k}]",
                                  "the scale and the weight disagree about N"))
        return None
    c = scale.shape[1]
    if c == 0:
        problems.append(m.problem(files, st, f"scale shape {list(scale.shape)} has no columns "
                                  f"for the weight [N={n}, K={k}]", "re-export the module"))
        return None
    if override is not None:
        if -(-k // override) != c:
            problems.append(m.problem(files, st, f"group_size override {override} needs "
                                      f"{-(-k // override)} scale columns for K={k}; the scale "
                                      f"has {c}", "pass the group size the scale columns have"))
            return None
        width, why = override, f"override group_size {override}"
    else:
        width, why = column_width(k, c, stated)
        if width is None:
            problems.append(m.problem(files, st, f"cannot tell the group size: {why}",
                                      "pass --group-size G (in Python group_size=G)"))
            return None
    r = runs(scale)
    if r == c:
        return scale[:, 0].contiguous(), 0, f"per channel: {why}, and all {c} columns of " \
            "every row are equal"
    g = width * r
    if r > 1:
        why += f"; scales repeat in runs of {r} columns, so the real group size is {g}"
    if stated and stated != g:
        why += f" (config.json states {stated})"
    starts = torch.arange(-(-k // g)) * g // width
    return scale[:, starts].contiguous(), g, why


def read(files: ModelFiles, name: str, state: dict,
         problems: list[Problem]) -> m.TernaryModule | None:
    wt, st = f"{name}.weight", f"{name}.weight_scale"
    start = len(problems)
    found = m.weight_and_scale(
        files, name, "[N, K]", ("weight (int8 [N, K])", ("I8",), "a vendor-int8 weight"),
        ("float32 scale (weight_scale)", ("F32",), "a vendor-int8 scale"), problems)
    if found is None:
        return None
    shape, ok = found
    n, k = shape
    ok = m.check_config_shape(files, wt, n, k, expected_shape(files.config, name),
                              problems) and ok
    if not ok:
        return None
    raw, scale = files.get(wt).view(torch.uint8), files.get(st)
    ok = m.check_scale_values(files, st, scale, problems)
    high = raw > 3
    if high.any():
        first = high.nonzero()[0].tolist()
        problems.append(m.problem(files, wt, f"{int(high.sum())} bytes have bits above the low "
                                  f"two set (first at [n, k] = {first}: "
                                  f"{raw[tuple(first)].view(torch.int8).item()}); vendor-int8 "
                                  "keeps one code per byte in the low two bits",
                                  "this is not a vendor-int8 weight, or it is corrupt"))
        ok = False
    ok = m.report_code3(files, wt, raw, "one code per byte", problems) and ok
    grouped = _group(files, st, scale, n, k, state, problems) if ok else None
    if grouped is None or len(problems) > start or state["code_map"] is None:
        return None
    canon_scale, g, why = grouped
    lut = torch.tensor(CODE_MAPS[state["code_map"]], dtype=torch.int8)
    return m.TernaryModule(name, n, k, canon_scale, g, str(files.file_of(wt)),
                           codes_=lut[raw.to(torch.int64)],
                           info={"stored": f"I8 {shape}",
                                 "packing": f"1 code/byte, {state['code_map']}",
                                 "scale": f"{'group' if g else 'channel'} x, "
                                 f"F32 {list(scale.shape)}",
                                 "group_size": g or None, "note": why})

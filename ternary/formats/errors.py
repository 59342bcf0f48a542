"""The one error every malformed checkpoint raises, and the problem records `inspect` lists."""

from __future__ import annotations

import dataclasses
from pathlib import Path


@dataclasses.dataclass(frozen=True)
class Problem:
    """One thing wrong with a checkpoint: where (file, tensor), what, and what to do."""

    file: str
    tensor: str | None
    problem: str
    hint: str = ""

    def __str__(self) -> str:
        where = f"{self.file}: tensor {self.tensor!r}" if self.tensor else self.file
        return f"{where}: {self.problem}" + (f". {self.hint}" if self.hint else "")


class FormatError(ValueError):
    """A checkpoint that does not match its format. Carries the file, the tensor (None for
    file-level problems such as config.json or a truncated shard), the problem and a hint."""

    def __init__(self, file: str | Path, tensor: str | None, problem: str, hint: str = ""):
        self.record = Problem(str(file), tensor, problem, hint)
        self.records = [self.record]  # more where one failure stopped several checks
        super().__init__(str(self.record))

    @property
    def file(self) -> str:
        return self.record.file

    @property
    def tensor(self) -> str | None:
        return self.record.tensor

    @property
    def problem(self) -> str:
        return self.record.problem

    @classmethod
    def of(cls, p: Problem) -> "FormatError":
        return cls(p.file, p.tensor, p.problem, p.hint)

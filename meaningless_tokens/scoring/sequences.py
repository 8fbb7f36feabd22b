"""The scored sequences: prompt + context + scored tokens, every part tokenized as a separate segment, as the prompt's
parts are, so the scored ids are the same in every condition (`check_alignment`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from meaningless_tokens.config import ANSWER_MARK, Likelihood
from meaningless_tokens.errors import DatasetError
from meaningless_tokens.prompts import Problem


@dataclass(frozen=True)
class Seq:
    index: int                  # problem index (line of test.jsonl, 0-based)
    condition: str
    continuation: str
    input_ids: tuple[int, ...]  # prompt + context + scored
    prompt_len: int             # the condition's prompt (ARM's step 0)
    start: int                  # first scored position

    @property
    def scored(self) -> tuple[int, ...]:
        return self.input_ids[self.start:]


class Continuations:
    """The context and scored token ids of each continuation of a problem, tokenized as separate segments."""

    def __init__(self, cfg: Likelihood, builder, dataset: Path):
        """`cfg`: params' likelihood (its separator, answer frame and solution_tokens); `builder`: the prompts'."""
        self.builder, self.cfg = builder, cfg
        self.dataset = dataset  # the dataset file, named when a continuation is empty
        sep = cfg.separator if builder.template == "raw" else ""
        self.sep = builder.encode(sep) if sep else []
        head, self.tail = cfg.answer_frame.split(ANSWER_MARK)
        self.head = builder.encode(head) if head else []

    def build(self, problem: Problem) -> dict[str, tuple[list[int], list[int]]]:
        """{continuation: (context ids, scored ids)}."""
        solution = self.builder.encode(problem.solution)[:self.cfg.solution_tokens]
        answer = self.builder.encode(problem.answer + self.tail)
        for key, ids in (("solution", solution), ("answer", answer)):
            if not ids or not getattr(problem, key).strip():
                raise DatasetError(f"{self.dataset}:{problem.index + 1}: key '{key}' is empty (nothing to score)")
        return {"solution": (self.sep, solution), "answer": (self.sep + self.head, answer)}

    def sequences(self, problem: Problem, prompts: dict, continuations=("solution", "answer")) -> list[Seq]:
        """One problem's sequences, per condition (`prompts`: condition -> its prompt's ids) each continuation in
        turn: the prompt, the continuation's context, its scored ids."""
        parts = self.build(problem)
        seqs = []
        for condition, prompt_ids in prompts.items():
            ids = list(prompt_ids)
            for k in continuations:
                ctx, scored = parts[k]
                seqs.append(Seq(problem.index, condition, k, tuple(ids + ctx + scored), len(ids), len(ids) + len(ctx)))
        return seqs


def check_alignment(seqs: list[Seq]) -> None:
    """The scored tokens (and the context before them) of a problem's continuation are the same ids in every
    condition, and sit right after the condition's prompt."""
    ref: dict[tuple[int, str], tuple] = {}
    for s in seqs:
        tail = s.input_ids[s.prompt_len:]
        if not s.prompt_len <= s.start < len(s.input_ids):
            raise AssertionError(f"problem {s.index} {s.condition}/{s.continuation}: scored part not after the prompt")
        if ref.setdefault((s.index, s.continuation), (tail, s.start - s.prompt_len)) != (tail, s.start - s.prompt_len):
            raise AssertionError(f"problem {s.index}: the {s.continuation} tokens under {s.condition} differ from "
                                 "those under the other conditions (continuations not aligned)")

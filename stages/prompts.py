"""MATH-500 loading (sha256-checked) and prompt conditions."""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass

import numpy as np

from stages.config import ConfigError, Params, StageError, model_spec
from stages.store import put

MATH500_KEYS = ("problem", "solution", "answer", "subject", "level", "unique_id")


class DatasetError(StageError):
    """The dataset file is missing, altered or malformed; the message names the file."""


@dataclass(frozen=True)
class Problem:
    index: int          # 0-based line number in test.jsonl: the stable prompt id
    unique_id: str
    problem: str
    solution: str
    answer: str
    subject: str
    level: int


def load_math500(params: Params) -> tuple[list[Problem], str]:
    """All 500 problems and the file's sha256, refusing a file that differs from params' sha256."""
    path = params.resolve(params.dataset.path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise DatasetError(f"{path}: dataset file not found ({params.file}: dataset.path)") from None
    digest = hashlib.sha256(data).hexdigest()
    if digest != params.dataset.sha256:
        raise DatasetError(
            f"{path}: sha256 {digest} != expected {params.dataset.sha256} ({params.file}: dataset.sha256); "
            "the vendored MATH-500 must be byte-identical to the canonical copy (see data/math500/SOURCE.md)"
        )
    problems = []
    for i, line in enumerate(data.decode("utf-8").splitlines()):
        try:
            row = json.loads(line)
            problems.append(Problem(index=i, **{k: row[k] for k in MATH500_KEYS}))
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise DatasetError(f"{path}:{i + 1}: malformed row ({type(e).__name__}: {e})") from None
    return problems, digest


def select_problems(problems: list[Problem], n: int | None, seed: int) -> list[Problem]:
    """A seeded subset of `n` problems, stratified by level (largest-remainder allocation), in
    dataset order; all problems when `n` is None."""
    if n is None or n >= len(problems):
        if n is not None and n > len(problems):
            raise DatasetError(f"asked for {n} problems; the dataset has {len(problems)}")
        return list(problems)
    rng = np.random.default_rng(seed)
    levels = sorted({p.level for p in problems})
    by_level = {lv: [p for p in problems if p.level == lv] for lv in levels}
    quota = {lv: n * len(by_level[lv]) / len(problems) for lv in levels}
    take = {lv: int(q) for lv, q in quota.items()}
    for lv in sorted(levels, key=lambda lv: (take[lv] - quota[lv], lv))[: n - sum(take.values())]:
        take[lv] += 1
    chosen = [p for lv in levels for p in rng.permutation(np.array(by_level[lv], dtype=object))[: take[lv]]]
    return sorted(chosen, key=lambda p: p.index)


# ---- prompt conditions ------------------------------------------------------------------------

class PromptError(StageError):
    """A prompt cannot be built as configured (no chat template, span text too short, ...)."""


@dataclass(frozen=True)
class PromptIds:
    """One prompt of one condition, built from separately tokenized segments."""

    condition: str
    input_ids: tuple[int, ...]
    span: tuple[int, int]               # [start, end) of the inserted span; (0, 0) for `none`
    original_pos: tuple[int, ...]       # position in this prompt of each `none` token
    span_text: str
    joint_match: bool                   # tokenizing the glued text gives the same ids


CHAT_MARK = "\u2063MLESS_CONTENT\u2063"  # invisible separator: cannot occur in a problem statement


def _sentences(text: str) -> list[str]:
    return [s for s in re.split(r"(?<=[.!?])\s+", " ".join(text.split())) if s]


class PromptBuilder:
    """Token ids of the `none` / `mless` / `mful` prompts (and `arm`: the `none` ids) for one tokenizer.

    Segments are tokenized separately (`add_special_tokens=False`) and concatenated, with the
    tokenizer's own special prefix/suffix (raw template) or the chat template's text around the
    content, so the `none` tokens are identical in every condition.
    """

    def __init__(self, params: Params, tokenizer, template: str):
        self.tok = tokenizer
        self.prompt = params.prompt
        self.template = template
        self.before = self.prompt.mless.placement == "before_instruction"
        if template == "chat":
            if not getattr(tokenizer, "chat_template", None):
                raise PromptError("the tokenizer has no chat template (use template: raw for this model)")
            rendered = tokenizer.apply_chat_template(
                [{"role": "user", "content": CHAT_MARK}], tokenize=False, add_generation_prompt=True)
            pre, post = rendered.split(CHAT_MARK)
            self.prefix, self.suffix = self.encode(pre), self.encode(post)
        else:
            bare = self.encode("x")
            full = list(tokenizer("x", add_special_tokens=True).input_ids)
            at = next(i for i in range(len(full) - len(bare) + 1) if full[i:i + len(bare)] == bare)
            self.prefix, self.suffix = full[:at], full[at + len(bare):]
        self.instruction = self.encode(self.prompt.instruction)
        m = self.prompt.mless
        self.mless_text = ("" if not m.count else (m.token + f" {m.token}" * (m.count - 1)) if self.before
                           else f" {m.token}" * m.count)
        self.mless = self.encode(self.mless_text)
        self.span_len = len(self.mless)
        self._mful_candidates = self._mful_windows(params) if "mful" in self.prompt.conditions else []

    def describe(self, params: Params) -> dict:
        """Provenance of the prompts: tokenizer, template, instruction and span texts."""
        text_file = params.resolve(self.prompt.mful.text_file)
        return {
            "tokenizer": {"class": type(self.tok).__name__, "vocab_size": len(self.tok),
                          "prefix_ids": self.prefix, "suffix_ids": self.suffix},
            "prompt": {"template": self.template, "instruction": self.prompt.instruction,
                       "mless_span_text": self.mless_text, "span_tokens": self.span_len,
                       "mful_text_sha256": hashlib.sha256(text_file.read_bytes()).hexdigest()
                       if "mful" in self.prompt.conditions else None,
                       "layout": ("prefix + span + instruction + ' ' + question + suffix" if self.before
                                  else "prefix + instruction + span + ' ' + question + suffix")},
        }

    def encode(self, text: str) -> list[int]:
        return list(self.tok(text, add_special_tokens=False).input_ids)

    def _mful_windows(self, params: Params) -> list[list[int]]:
        """Every sentence start of the shipped text that leaves at least span_len tokens after it."""
        path = params.resolve(self.prompt.mful.text_file)
        try:
            sentences = _sentences(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise PromptError(f"{path}: meaningful-span text not found ({params.file}: prompt.mful.text_file)") from None
        lead = "" if self.before else " "
        windows = []
        for k in range(len(sentences)):
            ids = self.encode(lead + " ".join(sentences[k:]))
            if len(ids) < self.span_len:
                break
            windows.append(ids[: self.span_len])
        if not windows:
            raise PromptError(f"{path}: text too short for a meaningful span of {self.span_len} tokens "
                              f"({params.file}: prompt.mful.text_file)")
        return windows

    def mful_ids(self, problem: Problem) -> list[int]:
        rng = np.random.default_rng([self.prompt.mful.seed, problem.index])
        return self._mful_candidates[int(rng.integers(len(self._mful_candidates)))]

    def build(self, problem: Problem) -> dict[str, PromptIds]:
        question = self.encode(" " + problem.problem)
        none_ids = self.prefix + self.instruction + question + self.suffix
        out = {}
        for cond in self.prompt.conditions:
            # arm is the none prompt: ARM edits layer 0's MLP activations instead (stages/arm.py)
            span = self.mless if cond == "mless" else self.mful_ids(problem) if cond == "mful" else []
            head = self.prefix if self.before else self.prefix + self.instruction
            tail = (self.instruction if self.before else []) + question + self.suffix
            ids = head + span + tail
            start, end = len(head), len(head) + len(span)
            original_pos = list(range(start)) + list(range(end, len(ids)))
            if [ids[i] for i in original_pos] != none_ids:
                raise AssertionError(f"problem {problem.index}: {cond} tokens not aligned with none")
            span_text = self.tok.decode(span) if span else ""
            glued = (span_text + self.prompt.instruction) if self.before else (self.prompt.instruction + span_text)
            joint = self.prefix + self.encode(glued + " " + problem.problem) + self.suffix
            out[cond] = PromptIds(cond, tuple(ids), (start, end) if span else (0, 0), tuple(original_pos),
                                  span_text, joint == ids)
        return out


def builder_for(params: Params, name: str, tokenizer) -> PromptBuilder:
    """The prompt builder of model `name`: its own template, else `prompt.template`."""
    template = model_spec(params, name).template or params.prompt.template
    try:
        return PromptBuilder(params, tokenizer, template)
    except PromptError as e:
        raise ConfigError(f"{params.file}: models.{name}: {e}") from None


def put_problems(f, chosen: list[Problem], with_answer: bool = False) -> None:
    """The `/problems` group of an artifact: which problems its samples are, in sample order."""
    p = f.create_group("problems")
    put(p, "index", np.array([q.index for q in chosen], dtype=np.int32))
    put(p, "unique_id", np.array([q.unique_id for q in chosen], dtype=object), compress=False)
    put(p, "level", np.array([q.level for q in chosen], dtype=np.int8))
    put(p, "subject", np.array([q.subject for q in chosen], dtype=object), compress=False)
    if with_answer:
        put(p, "answer", np.array([q.answer for q in chosen], dtype=object), compress=False)

"""The prompt conditions: the token ids of the `none` / `mless` / `mful` (and `arm`) prompts of one problem for one
tokenizer, and the context check every model stage runs before the model sees a sequence."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from meaningless_tokens.config import Prompt, resolve_path
from meaningless_tokens.dataset import Problem
from meaningless_tokens.errors import ConfigError, PromptError


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

    def __init__(self, prompt: Prompt, tokenizer, template: str, params_file: Path):
        self.tok = tokenizer
        self.prompt = prompt
        self.template = template
        self.params_file = params_file  # relative paths in params are relative to it; errors name it
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
        self._mful_candidates = self._mful_windows() if "mful" in self.prompt.conditions else []

    def describe(self) -> dict:
        """Provenance of the prompts: tokenizer, template, instruction and span texts."""
        mful = "mful" in self.prompt.conditions  # prompt.mful is read only where the condition is built
        return {
            "tokenizer": {"class": type(self.tok).__name__, "vocab_size": len(self.tok),
                          "prefix_ids": self.prefix, "suffix_ids": self.suffix},
            "prompt": {"template": self.template, "instruction": self.prompt.instruction,
                       "mless_span_text": self.mless_text, "span_tokens": self.span_len,
                       "mful_text_sha256": hashlib.sha256(resolve_path(self.params_file, self.prompt.mful.text_file)
                                                          .read_bytes()).hexdigest() if mful else None,
                       "layout": ("prefix + span + instruction + ' ' + question + suffix" if self.before
                                  else "prefix + instruction + span + ' ' + question + suffix")},
        }

    def encode(self, text: str) -> list[int]:
        return list(self.tok(text, add_special_tokens=False).input_ids)

    def _mful_windows(self) -> list[list[int]]:
        """Every sentence start of the shipped text that leaves at least span_len tokens after it."""
        path = resolve_path(self.params_file, self.prompt.mful.text_file)
        try:
            sentences = _sentences(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise PromptError(f"{path}: meaningful-span text not found ({self.params_file}: prompt.mful.text_file)") from None
        lead = "" if self.before else " "
        windows = []
        for k in range(len(sentences)):
            ids = self.encode(lead + " ".join(sentences[k:]))
            if len(ids) < self.span_len:
                break
            windows.append(ids[: self.span_len])
        if not windows:
            raise PromptError(f"{path}: text too short for a meaningful span of {self.span_len} tokens "
                              f"({self.params_file}: prompt.mful.text_file)")
        return windows

    def mful_ids(self, problem: Problem) -> list[int]:
        rng = np.random.default_rng([self.prompt.mful.seed, problem.index])
        return self._mful_candidates[int(rng.integers(len(self._mful_candidates)))]

    def build(self, problem: Problem) -> dict[str, PromptIds]:
        question = self.encode(" " + problem.problem)
        none_ids = self.prefix + self.instruction + question + self.suffix
        out = {}
        for cond in self.prompt.conditions:
            # arm is the none prompt: ARM edits layer 0's MLP activations instead (meaningless_tokens/arm/)
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


def check_context(setup, key: str, what: str, tokens: int) -> None:
    """Refuse, before the model runs on it, a sequence longer than the model's context (its config's
    max_position_embeddings; none: no limit): one line naming the params key that made it that long."""
    context = setup.facts["max_position_embeddings"]
    if context and tokens > context:
        raise ConfigError(f"{setup.params_file}: {key}: {what} has {tokens} tokens, more than the context of model "
                          f"'{setup.name}' ({context} positions)")


def builder_for(prompt: Prompt, setup, tokenizer) -> PromptBuilder:
    """The prompt builder of a stage's model (a models.ModelSetup): its own template, else `prompt.template`."""
    try:
        return PromptBuilder(prompt, tokenizer, setup.spec.template or prompt.template, setup.params_file)
    except PromptError as e:
        raise ConfigError(f"{setup.where}: {e}") from None

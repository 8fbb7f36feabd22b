"""evaluate@<model>: accuracy on the benchmark (`dataset`, MATH-500 by default) under the none / mless / mful
prompts, and `arm`; with `evaluate.sampling.n` > 0 also n sampled outputs per problem and condition (pass@k, maj@n,
distinct-n: stages/sampling.py).

`arm` is the none prompt with the paper's activation redistribution on layer 0's MLP (stages/arm.py):
a forward hook edits only the arm rows of a batch (`arm.pool: row` keeps each row's statistics to its own
tokens), so arm rows share batches, static cache and journal with the other conditions.

Greedy generation (`do_sample=False`, set explicitly: instruct checkpoints would otherwise sample by
their generation_config), batched with left padding and a KV cache, prompts sorted by length;
SDPA attention and a static cache sized per batch (a dynamic cache re-concatenates every layer's
keys and values at each step: half of the CPU time at batch 12; outputs were identical);
optionally stopping a row once it has written a complete \\boxed{...}. Outputs are graded by
math-verify and, beside it, by the paper's rule (stages/grading.py): on prompt + output for greedy outputs, on the
output alone for sampled ones, as the paper's code does.

Each finished batch is appended to a journal (`artifacts/eval/.journal/<model>.jsonl`); an
interrupted run resumes from it with the same batches, so the final artifact equals an
uninterrupted run's. Outputs:

  artifacts/eval/<model>.h5              per problem and condition: output, extracted answer, grades
  metrics/accuracy/<model>.json          accuracy, paired differences, McNemar p, bootstrap intervals
  metrics/timing/evaluate-<model>.json   seconds and tokens per second (kept apart: never deterministic)
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
from pydantic import ValidationError

from stages import arm, cli, grading, models, progress, sampling, vllm_engine
from stages.config import CONDITIONS, ConfigError, Params, Shard, model_spec
from stages.grading import grade, has_complete_box
from stages.intervals import bootstrap_mean_ci, mcnemar_exact
from stages.prompts import builder_for, dataset_spec, load_problems, put_problems, select_problems
from stages.store import ArtifactError, provenance, put, put_json_attr, write_h5, write_json_atomic, write_timing

JOURNAL_VERSION = 1
# the per-model params keys evaluation reads (dvc.yaml lists exactly these, so changing a model's
# layers or heads, which only extraction reads, or its display_name, which only charts and the
# report show, does not rerun its evaluation)
MODEL_KEYS = ("family", "source", "template", "trust_remote_code", "arm")


@dataclass(frozen=True)
class Item:
    index: int              # problem index (row of the dataset file)
    condition: str
    input_ids: tuple[int, ...]
    sample: int = -1        # -1: the greedy output; 0..n-1: a sampled one (evaluate.sampling)

    @property
    def key(self) -> tuple:
        return (self.index, self.condition) if self.sample < 0 else (self.index, self.condition, self.sample)


@dataclass
class Record:
    index: int
    condition: str
    output: str
    n_tokens: int           # generated tokens, end-of-text excluded
    stop: str               # eos | boxed | length
    extracted: str
    correct: bool
    paper_extracted: str | None
    paper_correct: bool
    seconds: float          # wall time of its batch, shared equally by the batch's rows
    sample: int = -1        # as Item.sample; graded on the output alone when >= 0 (the paper's pass@3)

    @property
    def key(self) -> tuple:
        return (self.index, self.condition) if self.sample < 0 else (self.index, self.condition, self.sample)


def paths(name: str) -> dict[str, Path]:
    return {"out": Path("artifacts/eval") / f"{name}.h5",
            "metrics": Path("metrics/accuracy") / f"{name}.json",
            "timing": Path("metrics/timing") / f"evaluate-{name}.json",
            "journal": Path("artifacts/eval/.journal") / f"{name}.jsonl"}


def make_batches(items: list[Item], batch_size: int) -> list[list[Item]]:
    """Items sorted by prompt length (least padding), cut into fixed batches: a resumed run
    regenerates exactly the batches an uninterrupted run would."""
    order = {c: k for k, c in enumerate(CONDITIONS)}
    ranked = sorted(items, key=lambda it: (len(it.input_ids), it.index, order[it.condition], it.sample))
    return [ranked[i:i + batch_size] for i in range(0, len(ranked), batch_size)]


# ---- generation -----------------------------------------------------------------------------

class _BoxedStop:
    """Stopping criterion: a row is done once its generated text holds a complete \\boxed{...}."""

    def __init__(self, tokenizer, prompt_len: int):
        self.tok, self.prompt_len = tokenizer, prompt_len

    def __call__(self, input_ids, scores, **kwargs):
        import torch

        texts = self.tok.batch_decode(input_ids[:, self.prompt_len:], skip_special_tokens=True)
        return torch.tensor([has_complete_box(t) for t in texts], dtype=torch.bool, device=input_ids.device)


def stop_ids(generation_config, tokenizer) -> list[int]:
    """End-of-text ids: the generation config's and the tokenizer's eos, plus the pad token (Qwen's
    `<|endoftext|>` ends raw-prompt generations)."""
    eos = generation_config.eos_token_id
    ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    ids |= {i for i in (tokenizer.eos_token_id, tokenizer.pad_token_id) if i is not None}
    if not ids:
        raise ConfigError("the model defines no end-of-text token (generation_config.eos_token_id)")
    return sorted(ids)


ATTENTION = "sdpa"  # generation only; extraction needs eager attention's probabilities


def load_for_generation(params: Params, prepared) -> tuple:
    """(model, tokenizer, attention) with SDPA, or eager for a family that has no SDPA path (Gemma 2:
    its logit softcapping)."""
    try:
        return (*models.load(params, prepared, attn_implementation=ATTENTION), ATTENTION)
    except ValueError as e:
        if "does not support an attention implementation through torch.nn.functional.scaled_dot_product" not in str(e):
            raise
    return (*models.load(params, prepared, attn_implementation="eager"), "eager")


@functools.cache
def _cache_kwarg() -> str:
    """generate()'s name for a cache passed in: `cache` from the transformers releases that renamed it
    (they warn on `past_key_values` at every run), `past_key_values` before (the vLLM environment's)."""
    from transformers.utils import generic

    return "cache" if hasattr(generic, "_rename_kwargs_for_bc") else "past_key_values"



def generate(model, tokenizer, batch: list[Item], max_new_tokens: int, stop_at_boxed: bool,
             eos: list[int], arm_hook: arm.ArmHook | None = None,
             sampler: sampling.RowSampler | None = None) -> list[tuple[str, int, str]]:
    """Greedy continuations of a batch of prompts: [(text, n_tokens, stop reason)]; `arm_hook` (installed on
    the model) edits the rows whose condition is `arm`; `sampler` draws each sampled row's tokens with its own seed
    (greedy search then takes the one token it leaves)."""
    import torch
    from transformers import LogitsProcessorList, StaticCache, StoppingCriteriaList

    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos[0]
    width = max(len(it.input_ids) for it in batch)
    ids = torch.full((len(batch), width), pad, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for r, it in enumerate(batch):  # left padding: every prompt ends where generation starts
        ids[r, width - len(it.input_ids):] = torch.tensor(it.input_ids)
        mask[r, width - len(it.input_ids):] = 1
    criteria = StoppingCriteriaList([_BoxedStop(tokenizer, width)] if stop_at_boxed else [])
    # sized by this batch alone: generate's own static cache grows to the longest of all earlier
    # calls, which would make a batch's arithmetic depend on what ran before it (and on resuming)
    cache = StaticCache(config=model.config.get_text_config(decoder=True), max_cache_len=width + max_new_tokens)
    # a sampled arm row's ARM draws are seeded with its sample index too
    rows = [(it.index if it.sample < 0 else (it.index, it.sample)) if it.condition == "arm" else None for it in batch]
    if arm_hook is not None:
        arm_hook.begin(rows, mask.bool())
    elif any(r is not None for r in rows):
        raise ValueError("a batch with arm rows needs the ARM hook (arm_hook)")
    with torch.no_grad():
        out = model.generate(
            input_ids=ids.to(model.device), attention_mask=mask.to(model.device),
            max_new_tokens=max_new_tokens, do_sample=False, temperature=None, top_p=None, top_k=None,
            num_beams=1, eos_token_id=eos, pad_token_id=pad, stopping_criteria=criteria, use_cache=True,
            logits_processor=LogitsProcessorList([sampler] if sampler else []), **{_cache_kwarg(): cache},
        )
    if arm_hook is not None:
        arm_hook.begin([])  # disarmed: a later forward pass of this model is left alone
    results = []
    ends = set(eos) | {pad}
    for row in out[:, width:].tolist():
        n = next((k for k, t in enumerate(row) if t in ends), len(row))
        text = tokenizer.decode(row[:n], skip_special_tokens=True)
        if stop_at_boxed and has_complete_box(text):
            reason = "boxed"
        elif n < max_new_tokens:
            reason = "eos"
        else:
            reason = "length"
        results.append((text, n, reason))
    return results


# ---- journal ------------------------------------------------------------------------------------

class Journal:
    """Append-only record of finished batches; bound to one configuration by `key`."""

    def __init__(self, path: Path, key: str, foreign: str = "restart"):
        self.path, self.key, self.foreign = path, key, foreign
        self.records: dict[tuple, Record] = {}  # by Record.key
        if path.is_file():
            self._load()

    def _load(self) -> None:
        lines = self.path.read_text(encoding="utf-8").split("\n")
        try:
            header = json.loads(lines[0])
        except json.JSONDecodeError:
            header = {}
        if header.get("key") != self.key or header.get("version") != JOURNAL_VERSION:
            if self.foreign == "refuse":
                raise ArtifactError(f"{self.path}: made for other inputs (params, code, model or engine differ from "
                                    f"this run's); rerun that shard with these, or delete the file")
            print(f"{self.path}: made for other inputs; starting afresh", file=sys.stderr)
            self.path.unlink()
            return
        for k, line in enumerate(lines[1:], start=2):
            if not line:
                continue
            try:
                rec = Record(**json.loads(line))
            except (json.JSONDecodeError, TypeError) as e:
                if k == len(lines) or (k == len(lines) - 1 and not lines[-1]):
                    break  # the run was killed while writing its last line: that batch is redone
                raise ArtifactError(f"{self.path}:{k}: damaged journal line ({e}); delete the file to start over") from None
            self.records[rec.key] = rec

    def append(self, records: list[Record]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fresh = not self.path.is_file()
        with open(self.path, "a", encoding="utf-8") as f:
            if fresh:
                f.write(json.dumps({"version": JOURNAL_VERSION, "key": self.key}) + "\n")
            for rec in records:
                f.write(json.dumps(asdict(rec), ensure_ascii=False) + "\n")
            f.flush()
            os.fsync(f.fileno())
        for rec in records:
            self.records[rec.key] = rec


def part_path(journal: Path, index: int, count: int) -> Path:
    return journal.with_name(f"{journal.stem}.part-{index}-of-{count}.jsonl")


def merge_parts(journal: Journal, journal_path: Path) -> dict[Path, int]:
    """Copy the generations of every shard's part (evaluate.shard) into `journal`: {part: generations}. A part
    made for other inputs is refused (it names the file): shards of one evaluation share every input."""
    merged = {}
    for part in sorted(journal_path.parent.glob(f"{journal_path.stem}.part-*-of-*.jsonl")):
        recs = Journal(part, journal.key, foreign="refuse").records
        journal.append([r for k, r in sorted(recs.items()) if k not in journal.records])
        merged[part] = len(recs)
    if merged:
        print(f"merged {sum(merged.values())} generations from {len(merged)} shard parts in {journal_path.parent}",
              file=sys.stderr)
    return merged


# ---- engines ------------------------------------------------------------------------------------

Generated = tuple[Item, str, int, str, float]  # item, text, n_tokens, stop reason, seconds


class TransformersEngine:
    """transformers.generate over the static batches; `arm` rows are edited by the ARM hook."""

    def __init__(self, params: Params, prepared, arm_settings: arm.ArmSettings | None = None):
        self.params = params
        self.model, self.tokenizer, attn = load_for_generation(params, prepared)
        self.arm_hook = arm.ArmHook(arm.layer0_mlp(self.model, params, prepared.name), arm_settings) if arm_settings else None
        self.eos = stop_ids(self.model.generation_config, self.tokenizer)
        cfg = params.evaluate
        self.sampling = sampling.resolve(params, self.model.generation_config) if cfg.sampling.n else None
        self.settings = {"engine": "transformers", **_common_settings(params, self.eos, str(self.model.device)),
                         "batch_size": cfg.batch_size, "attn_implementation": attn, "cache": "static"}
        self.stats: dict = {}

    def run(self, batches: list[list[Item]], done: set) -> Iterator[list[Generated]]:
        cfg = self.params.evaluate
        for batch in batches:  # a batch is regenerated whole: its rows' arithmetic depends on each other
            t0 = time.perf_counter()
            sampler, limit = None, cfg.max_new_tokens
            if any(it.sample >= 0 for it in batch):
                s = self.sampling
                sampler = sampling.RowSampler([sampling.sample_seed(s["seed"], it.index, it.condition, it.sample)
                                               if it.sample >= 0 else None for it in batch],
                                              s["temperature"], s["top_p"], s["top_k"])
                limit = s["max_new_tokens"]
            outs = generate(self.model, self.tokenizer, batch, limit, cfg.stop_at_boxed, self.eos,
                            self.arm_hook, sampler)
            share = (time.perf_counter() - t0) / len(batch)
            yield [(it, text, n, reason, share) for it, (text, n, reason) in zip(batch, outs)]


class VllmEngine:
    """vLLM in worker processes (stages/vllm_engine.py); only the tokenizer is loaded here."""

    def __init__(self, params: Params, prepared):
        from transformers import AutoConfig, AutoTokenizer, GenerationConfig

        self.params, self.prepared = params, prepared
        self.device = models.torch_device(params)
        self.trust = model_spec(params, prepared.name).trust_remote_code
        self.tokenizer = AutoTokenizer.from_pretrained(prepared.path, local_files_only=True, trust_remote_code=self.trust)
        try:
            gen = GenerationConfig.from_pretrained(prepared.path, local_files_only=True)
        except OSError:  # no generation_config.json: the model config's, as from_pretrained builds it
            gen = GenerationConfig.from_model_config(
                AutoConfig.from_pretrained(prepared.path, local_files_only=True, trust_remote_code=self.trust))
        self.eos = stop_ids(gen, self.tokenizer)
        self.sampling = sampling.resolve(params, gen) if params.evaluate.sampling.n else None
        self.settings = {**_common_settings(params, self.eos, self.device), **vllm_engine.settings(params, self.device)}
        self.stats: dict = {}

    def run(self, batches: list[list[Item]], done: set) -> Iterator[list[Generated]]:
        cfg = self.params.evaluate
        items = {":".join(map(str, it.key)): it for b in batches for it in b if it.key not in done}
        s = self.sampling
        # a sampled job carries its own seed (vLLM's per-request seed) and sampling values
        jobs = [(k, list(it.input_ids)) if it.sample < 0 else
                (k, list(it.input_ids), {"temperature": s["temperature"], "top_p": s["top_p"], "top_k": s["top_k"] or -1,
                                         "max_tokens": s["max_new_tokens"],
                                         "seed": vllm_engine.request_seed(sampling.sample_seed(
                                             s["seed"], it.index, it.condition, it.sample))})
                for k, it in items.items()]
        if not jobs:  # every generation is journaled or merged from shards: no engine to start
            return
        for job, ids, seconds in vllm_engine.generate(self.params, self.prepared.path, self.device, self.settings,
                                                       jobs, self.eos, self.trust, self.stats):
            limit = cfg.max_new_tokens if items[job].sample < 0 else self.sampling["max_new_tokens"]
            text, n, reason = vllm_engine.cut(self.tokenizer, ids, self.eos, limit, cfg.stop_at_boxed)
            yield [(items[job], text, n, reason, seconds)]


def _common_settings(params: Params, eos: list[int], device: str) -> dict:
    cfg = params.evaluate
    return {"max_new_tokens": cfg.max_new_tokens, "stop_at_boxed": cfg.stop_at_boxed, "greedy": True,
            "eos_token_ids": eos, "device": device, "dtype": params.runtime.dtype}


def check_engine(params: Params) -> None:
    """The engine's own bad input (vLLM missing, more devices than there are, arm on vLLM), before any work."""
    if params.evaluate.engine == "vllm":
        vllm_engine.check(params, models.torch_device(params))


def open_engine(params: Params, prepared, arm_settings: arm.ArmSettings | None = None):
    """The engine `evaluate.engine` names, loaded: `.tokenizer`, `.eos`, `.settings` (what the outputs depend on
    beyond prompts and weights: provenance and journal key), `.run(batches, done)`."""
    if params.evaluate.engine == "vllm":
        return VllmEngine(params, prepared)
    return TransformersEngine(params, prepared, arm_settings)


# ---- journaled generation (evaluate and the sweep's accuracy) -------------------------------------

def run_journaled(engine, batches: list[list[Item]], journal: "Journal", gold: dict[int, str], desc: str, name: str,
                  conditions: list[str] | None = None) -> int:
    """Generate and grade every item the journal does not hold yet, appending each as it is done, so an
    interrupted run resumes with the same batches; `conditions` adds a running score per condition to the bar.
    Returns how many generations the journal already held."""
    total = sum(len(b) for b in batches)
    todo = [b for b in batches if any(it.key not in journal.records for it in b)]
    done = sum(it.key in journal.records for b in batches for it in b)
    if done:
        print(f"{name}: resuming from {journal.path} ({done} of {total} generations done)", file=sys.stderr)
    bar = progress.bar(total=total, initial=done, desc=desc, unit="gen")
    tok = engine.tokenizer
    generations = engine.run(todo, set(journal.records))
    try:
        for outs in generations:
            recs = []
            for it, text, n, reason, seconds in outs:
                # the paper grades greedy outputs with the prompt before them, sampled ones alone (its pass@3)
                prompt = "" if it.sample >= 0 else tok.decode(list(it.input_ids), skip_special_tokens=True)
                g = grade(text, gold[it.index], prompt)
                recs.append(Record(it.index, it.condition, text, n, reason, g.extracted, g.correct,
                                   g.paper_extracted, g.paper_correct, round(seconds, 4), it.sample))
            fresh = sum(r.key not in journal.records for r in recs)
            journal.append(recs)
            bar.update(fresh)
            if conditions:
                bar.set_postfix_str(" ".join(
                    f"{c}={sum(r.correct for r in journal.records.values() if r.condition == c and r.sample < 0)}"
                    f"/{sum(r.condition == c and r.sample < 0 for r in journal.records.values())}" for c in conditions),
                    refresh=False)
    except KeyboardInterrupt:
        bar.close()
        print(f"\n{name}: interrupted; {len(journal.records)} of {total} generations kept in "
              f"{journal.path}; rerun to resume", file=sys.stderr)
        raise
    finally:
        generations.close()  # the vLLM engine's workers stop here, not when the generator is collected
    bar.close()
    return done


# ---- metrics --------------------------------------------------------------------------------------

def paired(treat: np.ndarray, base: np.ndarray, seed: int) -> dict:
    """Paired comparison of two conditions' per-problem correctness."""
    diff = treat.astype(np.float64) - base.astype(np.float64)
    lo, hi = bootstrap_mean_ci(diff, seed)
    b, c = int((treat & ~base).sum()), int((~treat & base).sum())
    return {"delta": float(diff.mean()), "ci95_low": float(lo), "ci95_high": float(hi),
            "mcnemar_p": mcnemar_exact(b, c), "only_this_right": b, "only_none_right": c}


def summarize(records: dict[str, list[Record]], seed: int) -> dict:
    conditions = list(records)
    correct = {c: np.array([r.correct for r in records[c]]) for c in conditions}
    paper = {c: np.array([r.paper_correct for r in records[c]]) for c in conditions}
    m = {
        "n_problems": len(records["none"]),
        "accuracy": {c: float(correct[c].mean()) for c in conditions},
        "correct": {c: int(correct[c].sum()) for c in conditions},
        "paper_accuracy": {c: float(paper[c].mean()) for c in conditions},
        "boxed_rate": {c: float(np.mean([has_complete_box(r.output) for r in records[c]])) for c in conditions},
        "mean_tokens": {c: float(np.mean([r.n_tokens for r in records[c]])) for c in conditions},
        "stopped_at_length": {c: int(sum(r.stop == "length" for r in records[c])) for c in conditions},
    }
    for c in conditions:
        if c != "none":
            m[f"{c}-none"] = paired(correct[c], correct["none"], seed)
            m[f"{c}-none_paper"] = paired(paper[c], paper["none"], seed)
    return m


# ---- the stage ------------------------------------------------------------------------------------

def run(params: Params, name: str, root: Path | None = None) -> Path:
    spec = model_spec(params, name)
    cfg = params.evaluate
    where = {k: (root / v if root else params.resolve(str(v))) for k, v in paths(name).items()}
    problems, data_sha = load_problems(params)
    chosen = select_problems(problems, cfg.n_samples, cfg.seed, "evaluate.n_samples")
    check_engine(params)
    if cfg.shard is not None and os.environ.get("DVC_STAGE"):
        raise ConfigError(f"{params.file}: evaluate.shard: a shard writes a part, not the stage's outputs: run each "
                          f"with `python -m stages.evaluate --model {name} --shard I/N`, then `dvc repro` with "
                          f"evaluate.shard null merges the parts")
    if name not in params.evaluated:
        raise ConfigError(f"{params.file}: evaluate.models: model '{name}' is not among the models evaluated "
                          f"{params.evaluated}; add it there to evaluate it")
    prepared = models.prepare(params, name)
    conditions = params.prompt.conditions
    # ARM's values are checked before the model is loaded (its variant needs only the model_type)
    arm_settings = arm.resolve(params, name, arm.model_type(prepared.facts)) if "arm" in conditions else None
    engine = open_engine(params, prepared, arm_settings)
    builder = builder_for(params, name, engine.tokenizer)
    built = {p.index: builder.build(p) for p in chosen}
    items = [Item(p.index, c, built[p.index][c].input_ids) for p in chosen for c in conditions]
    n_sampled = cfg.sampling.n
    sampled = [Item(p.index, c, built[p.index][c].input_ids, j) for p in chosen for c in conditions
               for j in range(n_sampled)]
    longest = max(len(it.input_ids) for it in items)
    context = prepared.facts["max_position_embeddings"]
    for key_name, limit in (("evaluate.max_new_tokens", cfg.max_new_tokens),
                            ("evaluate.sampling.max_new_tokens", (cfg.sampling.max_new_tokens or 0) if n_sampled else 0)):
        if context and longest + limit > context:
            raise ConfigError(f"{params.file}: {key_name}: a prompt of {longest} tokens plus "
                              f"{limit} new tokens exceeds the context of model '{name}' ({context})")
    # `.sampling` (resolved values and their origin) is evaluate's alone: the sweep shares the engine, not its samples
    settings = {**engine.settings, **({"arm": arm_settings.describe()} if arm_settings else {}),
                **({"sampling": engine.sampling} if n_sampled else {})}
    key = hashlib.sha256(json.dumps({
        "weights": prepared.manifest().get("weights_sha256"), "settings": settings,
        "items": [(it.index, it.condition, it.input_ids) for it in items],
        **({"sampled": n_sampled} if n_sampled else {})}).encode()).hexdigest()
    gold = {p.index: p.answer for p in chosen}
    # sampled rows in batches of their own (their own max_new_tokens), after the greedy ones
    batches = make_batches(items, cfg.batch_size) + make_batches(sampled, cfg.batch_size)

    if cfg.shard is not None:  # one job's part: its batches, journaled to the part file the merge reads
        part = part_path(where["journal"], cfg.shard.index, cfg.shard.count)
        mine = [b for j, b in enumerate(batches) if j % cfg.shard.count == cfg.shard.index]
        run_journaled(engine, mine, Journal(part, key, foreign="refuse"), gold,
                      f"evaluate {name} shard {cfg.shard.index}/{cfg.shard.count}", name, conditions)
        print(f"{name}: shard {cfg.shard.index} of {cfg.shard.count} ({sum(map(len, mine))} generations) -> {part}; "
              f"with every part in {part.parent}, a run without evaluate.shard (dvc repro) merges them")
        return part

    journal = Journal(where["journal"], key)
    merged = merge_parts(journal, where["journal"])
    started = time.perf_counter()
    done = run_journaled(engine, batches, journal, gold, f"evaluate {name}", name, conditions)
    seconds = time.perf_counter() - started

    by_cond = {c: [journal.records[(p.index, c)] for p in chosen] for c in conditions}
    metrics = {"dataset": dataset_spec(params).label, **summarize(by_cond, cfg.seed)}
    samples = {c: [[journal.records[(p.index, c, j)] for j in range(n_sampled)] for p in chosen]
               for c in conditions} if n_sampled else None
    if samples:
        metrics["sampling"] = sampling.summarize(
            {c: [[r.output for r in row] for row in samples[c]] for c in conditions},
            {c: [[r.extracted for r in row] for row in samples[c]] for c in conditions},
            {c: np.array([[r.correct for r in row] for row in samples[c]], dtype=bool) for c in conditions},
            {c: np.array([[r.paper_correct for r in row] for row in samples[c]], dtype=bool) for c in conditions},
            cfg.seed)
    prov = {
        **provenance("evaluate"),
        "model": {"name": name, **prepared.manifest()},
        **builder.describe(params),
        "generation": settings,
        **({"arm": {**arm_settings.describe(), "differences_from_paper": arm.DIFFERENCES}} if arm_settings else {}),
        "grader": {"library": "math-verify", "paper_rule": grading.PAPER_RULE + " Applied to prompt + output, "
                   "as the paper's greedy runs do."},
        "params": {"models": {name: spec.model_dump(include=set(MODEL_KEYS))}, "prompt": params.prompt.model_dump(),
                   "evaluate": cfg.model_dump(exclude={"models"}), **({"arm": params.arm.model_dump()} if arm_settings else {}),
                   "dataset": params.dataset.model_dump(),
                   "runtime": params.runtime.model_dump(include={"device", "dtype"})},
        "dataset_sha256": data_sha,
        "dataset_file": dataset_spec(params).describe(),
    }
    with write_h5(where["out"]) as f:
        f.attrs["kind"] = "eval"
        f.attrs["model"] = name
        f.attrs["conditions"] = list(conditions)
        put_json_attr(f, "provenance", prov)
        put_json_attr(f, "metrics", metrics)
        put_problems(f, chosen, with_answer=True)
        for c in conditions:
            g, recs = f.create_group(c), by_cond[c]
            put(g, "prompt_tokens", np.array([len(built[q.index][c].input_ids) for q in chosen], dtype=np.int32))
            put(g, "output", np.array([r.output for r in recs], dtype=object), compress=False)
            put(g, "n_tokens", np.array([r.n_tokens for r in recs], dtype=np.int32))
            put(g, "stop", np.array([r.stop for r in recs], dtype=object), compress=False)
            put(g, "extracted", np.array([r.extracted for r in recs], dtype=object), compress=False)
            put(g, "correct", np.array([r.correct for r in recs], dtype=bool))
            put(g, "paper_extracted", np.array([r.paper_extracted or "" for r in recs], dtype=object),
                compress=False, note="'' where prompt + output hold no complete box")
            put(g, "paper_correct", np.array([r.paper_correct for r in recs], dtype=bool))
            if samples:  # [problems, samples]; graded on the output alone, as the paper's pass@3
                sg, rows = g.create_group("sampled"), samples[c]
                put(sg, "output", np.array([[r.output for r in row] for row in rows], dtype=object), compress=False)
                put(sg, "n_tokens", np.array([[r.n_tokens for r in row] for row in rows], dtype=np.int32))
                put(sg, "stop", np.array([[r.stop for r in row] for row in rows], dtype=object), compress=False)
                put(sg, "extracted", np.array([[r.extracted for r in row] for row in rows], dtype=object), compress=False)
                put(sg, "correct", np.array([[r.correct for r in row] for row in rows], dtype=bool))
                put(sg, "paper_correct", np.array([[r.paper_correct for r in row] for row in rows], dtype=bool),
                    note="the paper's rule on the output alone (its pass@3)")
    write_json_atomic(where["metrics"], metrics)
    tokens = {c: sum(r.n_tokens for r in by_cond[c]) for c in conditions}
    gen_seconds = {c: sum(r.seconds for r in by_cond[c]) for c in conditions}
    write_timing(where["timing"], {
        "seconds_this_run": round(seconds, 2),
        "generation_seconds": {c: round(s, 2) for c, s in gen_seconds.items()},
        "tokens_per_second": {c: round(tokens[c] / gen_seconds[c], 2) if gen_seconds[c] else None
                              for c in conditions},
        **({"sampled_generation_seconds": {c: round(sum(r.seconds for row in samples[c] for r in row), 2)
                                           for c in conditions}} if samples else {}),
        "resumed_generations": done, "merged_parts": {p.name: n for p, n in merged.items()},
        "engine": cfg.engine, **engine.stats, "batch_size": cfg.batch_size, "device": settings["device"],
    })
    where["journal"].unlink(missing_ok=True)
    for p in merged:
        p.unlink(missing_ok=True)
    acc = ", ".join(f"{c} {metrics['accuracy'][c]:.3f}" for c in conditions)
    if samples:
        k = min(3, n_sampled)
        acc += f"; pass@{k} " + ", ".join(f"{c} {metrics['sampling'][f'pass@{k}'][c]:.3f}" for c in conditions)
    print(f"{name}: {len(chosen)} problems x {len(conditions)} conditions in {seconds:.1f} s; accuracy {acc} "
          f"-> {where['out']}")
    return where["out"]


def with_shard(params: Params, shard: str) -> Params:
    """params with evaluate.shard from the command line's `I/N` (0-based I)."""
    try:
        index, count = (int(x) for x in shard.split("/"))
        chosen = Shard(index=index, count=count)
    except (ValueError, ValidationError) as e:
        reason = e.errors()[0]["msg"].removeprefix("Value error, ") if isinstance(e, ValidationError) else "expected I/N"
        raise ConfigError(f"--shard {shard}: {reason} (evaluate.shard: index I of count N, 0 <= I < N)") from None
    return params.model_copy(update={"evaluate": params.evaluate.model_copy(update={"shard": chosen})})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(add_help=False)
    ap.add_argument("--shard", help="I/N: run shard I (0-based) of N, as evaluate.shard does")
    known, rest = ap.parse_known_args(argv)
    stage = (lambda params, name: run(with_shard(params, known.shard), name)) if known.shard else run
    return cli.main("evaluate", __doc__, stage, rest)


if __name__ == "__main__":
    sys.exit(main())

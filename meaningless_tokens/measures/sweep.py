"""The effect against the span's length and character (the paper's dose-response): for every span token and count,
layer sweep.layer's attention drop and span mass, and optionally greedy accuracy and the reference solution's
likelihood, each against count 0 (the none prompt). stages/sweep.py's DEFINITIONS says what each one is.

    s = span_sweep.measure(params, functools.partial(models.setup_for, params, name), problems, journal_path)
"""

from __future__ import annotations

import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from meaningless_tokens import arm, generations, models, noise, progress, scoring
from meaningless_tokens.measures.extract import QUERY_VECTOR, reduce, sample_stats
from meaningless_tokens.capture import attention, compare
from meaningless_tokens.config import Params, Prompt, Shard, Stats, Sweep
from meaningless_tokens.dataset import dataset_spec, select_problems
from meaningless_tokens.engines import (Item, Journal, check_engine, journal_key, make_batches, merge_parts, open_engine,
                                        open_scorer, part_path, run_journaled)
from meaningless_tokens.errors import BadParam, CaptureError, ConfigError, PromptError, UnsupportedModel
from meaningless_tokens.intervals import bootstrap_mean_ci, bootstrap_ratio_ci, paired, wilcoxon_p
from meaningless_tokens.prompts import PromptBuilder, check_context

# How `make verify` compares this measure's outputs (meaningless_tokens/verify/kinds.py assembles KINDS from every
# measure's): (artifact kind of store.PATHS, key glob, kind of quantity of verify's TOLERANCES), first match wins
QUANTITIES = (
    ("sweep", "*likelihood_p", "rank-p"),  # Wilcoxon signed-rank vs count 0
    ("sweep", "*likelihood*", "loglik"),
    ("metrics/sweep", "*_pct*", "percent"),
    ("metrics/sweep", "*", "attention"),  # span mass and lambda (fractions)
)

JOURNAL_VERSION = 1


CONDITIONS = ["none", "mless"]  # the prompts a sweep builds; `mless` with each (token, count) as its span


def span_prompt(prompt: Prompt, token: str, count: int) -> Prompt:
    """params' prompt with the mless span set to `count` x `token` and only the none and mless conditions."""
    mless = prompt.mless.model_copy(update={"token": token, "count": count})
    return prompt.model_copy(update={"mless": mless, "conditions": list(CONDITIONS)})


def builders(prompt: Prompt, cfg: Sweep, setup: models.ModelSetup, tokenizer) -> dict[tuple[str, int], PromptBuilder]:
    """A prompt builder per (token, count) of `cfg` (params' sweep) from `prompt` (params' prompt), checked before any
    model runs."""
    template = setup.spec.template or prompt.template
    out = {}
    for k, token in enumerate(cfg.tokens):
        for count in cfg.counts:
            try:
                out[(token, count)] = PromptBuilder(span_prompt(prompt, token, count), tokenizer, template,
                                                    setup.params_file)
            except PromptError as e:
                raise ConfigError(f"{setup.where}: {e}") from None
    return out


def repetition(builder: PromptBuilder, token: str) -> dict:
    """How the tokenizer splits the span: tokens of one repetition, and whether n repetitions give n
    times as many (a merge across repetitions, e.g. '//' as one token, breaks that)."""
    one = len(builder.encode(f" {token}"))
    count = builder.prompt.mless.count
    return {"pieces_per_repetition": one, "span_tokens": builder.span_len,
            "linear": builder.span_len == one * count}


def _build(bs: dict, name: str, problems) -> dict:
    """(token, count) -> list of PromptIds of the mless prompt per problem; plus 'none'."""
    out = {}
    for (token, count), b in bs.items():
        try:
            out[(token, count)] = [b.build(p)["mless"] for p in problems]
        except AssertionError as e:  # the span's tokens changed the original tokens: no alignment
            raise BadParam(f"sweep.tokens: '{token}' x {count} breaks the alignment of the "
                           f"original tokens for model '{name}' ({e})") from None
    first = next(iter(bs.values()))
    out["none"] = [first.build(p)["none"] for p in problems]
    return out


# ---- attention -------------------------------------------------------------------------------------

def attention_sweep(cfg: Sweep, st: Stats, name: str, model, prompts: dict, heads: list[int]) -> dict:
    """Per (token, count): per-sample orig_mean [S, H] and span_mass [S, H]; and none's orig_mean (`cfg`: params'
    sweep, its layer; `st`: params' stats, the query set and the first key left out)."""
    first = 1 if st.exclude_first else 0
    keys = ["none"] + [k for k in prompts if k != "none" and k[1] > 0]
    total = sum(len(prompts[k]) for k in keys)
    bar = progress.bar(total=total, desc=f"sweep {name}", unit="prompt")
    per = {}
    for key in keys:
        orig, span = [], []
        for pr in prompts[key]:
            probs = attention(model, pr.input_ids, [cfg.layer])[cfg.layer][heads].cpu().numpy()[None]  # [1, H, T, T]
            v = reduce(probs, pr.span, pr.original_pos)
            o, _, m = sample_stats(v[QUERY_VECTOR[st.query_set]], v["recv_all"], v["mass_span"],
                                   np.asarray(pr.original_pos), pr.span, st.query_set)
            orig.append(o[0, :, first:].mean(axis=1))
            span.append(m[0])
            bar.update()
        per[key] = (np.stack(orig), np.stack(span))
    bar.close()
    for key in prompts:  # count 0: the none prompt itself
        if key != "none" and key[1] == 0:
            per[key] = (per["none"][0], np.zeros_like(per["none"][1]))
    return per


def summarize_attention(cfg: Sweep, per: dict) -> dict:
    """Drops and span mass per token and count of `cfg` (params' sweep), with intervals; the top heads fixed at the
    reference count."""
    base = per["none"][0]  # [S, H]
    ref = cfg.reference_count
    out = {}
    for token in cfg.tokens:
        ref_drop = (base - per[(token, ref)][0]).mean(axis=0)
        top = np.argsort(-ref_drop, kind="stable")[:cfg.top_heads]
        rows = {}
        for count in cfg.counts:
            orig, span = per[(token, count)]
            delta = base - orig                                            # [S, H]
            r = {}
            for tag, d, b in (("", delta, base), ("_heads", delta.mean(axis=1), base.mean(axis=1)),
                              ("_top", delta[:, top].mean(axis=1), base[:, top].mean(axis=1))):
                lo, hi = bootstrap_mean_ci(d, cfg.seed, n_boot=cfg.n_boot)
                plo, phi = bootstrap_ratio_ci(d, b, cfg.seed, n_boot=cfg.n_boot)
                r[f"drop{tag}"] = d.mean(axis=0)
                r[f"drop{tag}_ci"] = np.stack([lo, hi])
                r[f"drop{tag}_pct"] = 100 * d.mean(axis=0) / b.mean(axis=0)
                r[f"drop{tag}_pct_ci"] = 100 * np.stack([plo, phi])
            for tag, m in (("", span), ("_heads", span.mean(axis=1))):
                lo, hi = bootstrap_mean_ci(m, cfg.seed, n_boot=cfg.n_boot)
                r[f"span_mass{tag}"] = m.mean(axis=0)
                r[f"span_mass{tag}_ci"] = np.stack([lo, hi])
            rows[count] = r
        out[token] = {"top_heads": top.astype(np.int32), "rows": rows}
    return out


# ---- accuracy --------------------------------------------------------------------------------------

@dataclass
class AccuracyPlan:
    """What the accuracy sweep generates, in which batches, under which journal key (one for a run and its shards)."""
    engine: object
    prompts: dict        # `_build`
    cond: dict           # (token, count) -> the condition's name `<token>x<count>` (count > 0)
    batches: list        # fixed: a shard takes every N-th of them
    key: str
    settings: dict       # the engine's generation settings (in the journal's header: a refused part names them)
    gold: dict


@contextmanager
def accuracy_plan(params: Params, setup: models.ModelSetup, problems, kept_path: Path | None = None):
    """The engine open, the prompts built and the batches cut, as the sweep and each of its shards must agree on.

    The engine is opened as evaluate's is (its ARM hook where prompt.conditions holds arm: idle here, as no sweep row
    is an arm row), so that under the plan's one shape its compiled step is evaluate's, and takes evaluate's shape and
    rows where they fit and their key is its own (meaningless_tokens/generations.py)."""
    ev, name = params.evaluate, setup.name
    arm_settings = arm.hook_settings(params.arm, params.dataset.benchmark, setup, params.prompt.conditions)
    kept = generations.read(kept_path) if kept_path is not None else None
    with open_engine(ev, CONDITIONS, setup, arm_settings, sampled=False) as engine:
        prompts = _build(builders(params.prompt, params.sweep, setup, engine.tokenizer), name, problems)
        cond = {key: f"{key[0]}x{key[1]}" for key in prompts if key != "none" and key[1] > 0}
        items = [Item(p.index, "none", pr.input_ids) for p, pr in zip(problems, prompts["none"])]
        items += [Item(p.index, c, pr.input_ids) for key, c in cond.items() for p, pr in zip(problems, prompts[key])]
        longest = max(len(it.input_ids) for it in items)
        check_context(setup, "sweep.counts", f"a prompt of {longest} tokens plus evaluate.max_new_tokens {ev.max_new_tokens}",
                      longest + ev.max_new_tokens)
        # the plan's batch size (evaluate.batch_size: auto) and, compiled, its one shape: before the key, which records both
        batch_size = engine.fit([(items, ev.max_new_tokens)], like=kept.shape if kept else None)
        engine.take(kept)
        settings = engine.settings
        key = journal_key(setup.prepared.weights_sha256, settings, items, version=JOURNAL_VERSION)
        # equal lengths by problem, then by the condition's name (`<token>x<count>`): the batches this stage has always run
        batches = make_batches(items, batch_size, condition_rank=str)
        yield AccuracyPlan(engine, prompts, cond, batches, key, settings, {p.index: p.answer for p in problems})


def accuracy_sweep(params: Params, setup: models.ModelSetup, problems, journal_path: Path,
                   kept_path: Path | None = None) -> tuple[dict, dict, dict]:
    """Per (token, count): per-problem correctness (count 0 is the none prompt, generated once); the generation
    settings; the engine's stats (rows taken from evaluate's file `kept_path`, rows generated, shard parts merged).
    Journaled like evaluation: an interrupted run resumes, and the parts of `accuracy_shard` beside the journal are
    merged into it first."""
    name = setup.name
    with accuracy_plan(params, setup, problems, kept_path) as plan:
        journal = Journal(journal_path, plan.key, settings=plan.settings)
        merged = merge_parts(journal, journal_path)
        run_journaled(plan.engine, plan.batches, journal, plan.gold, f"sweep accuracy {name}", name)
        cond = {key: "none" if key == "none" or key[1] == 0 else plan.cond[key] for key in plan.prompts}
        correct = {key: np.array([journal.records[(p.index, c)].correct for p in problems]) for key, c in cond.items()}
        journal_path.unlink(missing_ok=True)
        for part in merged:
            part.unlink(missing_ok=True)
        stats = {k: plan.engine.stats[k] for k in ("reused", "generated", "shape", "warmup_seconds")
                 if k in plan.engine.stats}
        return correct, plan.settings, stats | ({"merged_parts": {p.name: n for p, n in merged.items()}} if merged else {})


def accuracy_shard(params: Params, setup: models.ModelSetup, problems, journal_path: Path, shard: Shard,
                   kept_path: Path | None = None) -> Path:
    """Shard `shard.index` of `shard.count`: the accuracy sweep's batches j with j % count == index, journaled to the
    part beside the journal that `accuracy_sweep` merges (a part made for other inputs is refused there, naming the
    setting that differs)."""
    name = setup.name
    part = part_path(journal_path, shard.index, shard.count)
    with accuracy_plan(params, setup, problems, kept_path) as plan:
        mine = [b for j, b in enumerate(plan.batches) if j % shard.count == shard.index]
        run_journaled(plan.engine, mine, Journal(part, plan.key, foreign="refuse", settings=plan.settings), plan.gold,
                      f"sweep accuracy {name} shard {shard.index}/{shard.count}", name)
    print(f"{name}: sweep shard {shard.index} of {shard.count} ({sum(map(len, mine))} generations) -> {part}; "
          f"with every part in {part.parent}, the stage's run (dvc repro) merges them")
    return part


# ---- likelihood ------------------------------------------------------------------------------------

def likelihood_sweep(params: Params, setup: models.ModelSetup, problems) -> dict:
    """Per (token, count): each problem's mean log-prob per token of the reference solution (count 0: the none
    prompt, scored once), from one load of the whole model."""
    name = setup.name
    engine = open_scorer(setup)
    bs = builders(params.prompt, params.sweep, setup, engine.tokenizer)
    prompts = _build(bs, name, problems)
    conts = scoring.Continuations(params.likelihood, next(iter(bs.values())),
                                  dataset_spec(params.dataset, params.file).path)
    keys = ["none"] + [k for k in prompts if k != "none" and k[1] > 0]
    seqs, at = [], {}
    for key in keys:
        for p, pr in zip(problems, prompts[key]):
            at[(key, p.index)] = len(seqs)
            seqs += conts.sequences(p, {"none" if key == "none" else "mless": pr.input_ids}, ("solution",))
    check_context(setup, "likelihood.solution_tokens", "a sweep prompt plus its solution",
                  max(len(s.input_ids) for s in seqs))
    with engine:
        lps, _, _ = engine.loglikelihood(seqs, params.likelihood.batch_tokens, shown=True,
                                         desc=f"sweep likelihood {name}", name=name)
    mean = {key: np.array([lps[at[(key, p.index)]].mean() for p in problems]) for key in keys}
    return {key: mean["none" if key == "none" or key[1] == 0 else key] for key in prompts}


@dataclass
class AttentionSweep:
    problems: list           # the attention problems
    heads: list[int]
    builders: dict           # (token, count) -> PromptBuilder
    probe: dict              # capture == the model's eager attention, on the longest span's prompt
    tokenization: dict       # token -> count -> how the tokenizer splits the span (`repetition`)
    per: dict                # `attention_sweep`
    summary: dict            # `summarize_attention`
    prompts: int             # prompts run
    seconds: float
    manifest: dict           # the prepared model's


@dataclass
class AccuracySweep:
    problems: list = field(default_factory=list)  # none: the accuracy sweep is off
    correct: dict = field(default_factory=dict)   # (token, count) and "none" -> [problem]
    settings: dict | None = None                  # the engine's generation settings
    rows: dict = field(default_factory=dict)      # (token, count) -> accuracy, paired difference to count 0
    stats: dict = field(default_factory=dict)     # the engine's: rows taken from evaluate's and generated (sidecar)


@dataclass
class LikelihoodSweep:
    problems: list = field(default_factory=list)  # none: the likelihood sweep is off
    mean: dict = field(default_factory=dict)      # (token, count) and "none" -> [problem], nats/token
    rows: dict = field(default_factory=dict)      # (token, count) -> paired difference to count 0


@dataclass
class SpanSweep:
    attention: AttentionSweep
    accuracy: AccuracySweep
    likelihood: LikelihoodSweep


def measure(params: Params, setup: Callable[..., models.ModelSetup], problems, journal: Path,
            kept: Path | None = None) -> SpanSweep:
    """The attention sweep on the layers up to sweep.layer, then, where configured, the accuracy and likelihood sweeps on
    the whole model; `setup(layers=...)` gives the model (None: the whole model), `journal` the accuracy sweep's
    resumable journal (removed once it completes), `kept` evaluate's file of kept generations for this model."""
    cfg = params.sweep
    att = measure_attention(params, setup(layers=[cfg.layer]), problems)
    if cfg.accuracy_samples:
        # before the whole model is prepared; CONDITIONS: the prompts the sweep generates (the engine's too)
        check_engine(params.evaluate, CONDITIONS, params.runtime, params.file)
    # generation and scoring run the whole model: a GGUF source is converted in full (once) for them
    whole = setup() if cfg.accuracy_samples or cfg.likelihood_samples else None
    acc = measure_accuracy(params, whole, problems, journal, kept) if cfg.accuracy_samples else AccuracySweep()
    lik = measure_likelihood(params, whole, problems) if cfg.likelihood_samples else LikelihoodSweep()
    return SpanSweep(att, acc, lik)


def measure_shard(params: Params, setup: Callable[..., models.ModelSetup], problems, journal: Path, shard: Shard,
                  kept: Path | None = None) -> Path:
    """One shard of the accuracy sweep, the one part of the stage that generates (`accuracy_shard`); the attention and
    likelihood sweeps are left to the stage's run, which merges the parts."""
    cfg = params.sweep
    if not cfg.accuracy_samples:
        raise BadParam("sweep.accuracy_samples: 0: the sweep generates nothing, so it has no shards (--shard); "
                       "run the stage whole")
    check_engine(params.evaluate, CONDITIONS, params.runtime, params.file)
    chosen = select_problems(problems, cfg.accuracy_samples, cfg.seed, "sweep.accuracy_samples")
    return accuracy_shard(params, setup(), chosen, journal, shard, kept)


def measure_attention(params: Params, setup: models.ModelSetup, problems) -> AttentionSweep:
    """Layer sweep.layer's attention at every (token, count) on the attention problems, probed, reduced and summarized;
    only the embeddings and layers 0..sweep.layer run (the capture stops after that layer's attention)."""
    cfg, name, facts = params.sweep, setup.name, setup.facts
    chosen = select_problems(problems, cfg.attention_samples, cfg.seed, "sweep.attention_samples")
    if cfg.layer >= facts["num_layers"]:
        raise BadParam(f"sweep.layer: {cfg.layer} out of range; model '{name}' has "
                       f"{facts['num_layers']} layers (allowed 0..{facts['num_layers'] - 1})")
    heads = list(range(facts["num_heads"])) if setup.spec.heads == "all" else list(setup.spec.heads)
    model, tokenizer = models.load(setup, layers=[cfg.layer])
    bs = builders(params.prompt, cfg, setup, tokenizer)
    prompts = _build(bs, name, chosen)
    check_context(setup, "sweep.counts", "a prompt", max(len(pr.input_ids) for key in prompts for pr in prompts[key]))
    try:  # the probe extraction runs: capture == the model's own eager attention on the longest span's prompt
        probe = compare(model, prompts[(cfg.tokens[0], cfg.counts[-1])][0].input_ids, [cfg.layer],
                        tolerance=models.probe_tolerance(setup.dtype))
    except CaptureError as e:
        raise UnsupportedModel(f"{params.file}: sweep.layer: model_type '{facts['model_type']}': {e}") from None
    tokenization = {t: {c: repetition(bs[(t, c)], t) for c in cfg.counts} for t in cfg.tokens}
    for t, rows in tokenization.items():
        if not all(r["linear"] for r in rows.values()):
            print(f"{name}: note: '{t}' repeated n times is not n x {rows[cfg.counts[-1]]['pieces_per_repetition']} "
                  f"tokens for this tokenizer (span tokens per count: "
                  f"{ {c: r['span_tokens'] for c, r in rows.items()} }); spans are measured in tokens", file=sys.stderr)
    t0 = time.perf_counter()
    per = attention_sweep(cfg, params.stats, name, model, prompts, heads)
    seconds = time.perf_counter() - t0
    return AttentionSweep(chosen, heads, bs, probe, tokenization, per, summarize_attention(cfg, per),
                          sum(len(prompts[k]) for k in prompts if k == "none" or k[1] > 0), seconds,
                          setup.prepared.manifest())


def measure_accuracy(params: Params, whole: models.ModelSetup, problems, journal: Path,
                     kept: Path | None = None) -> AccuracySweep:
    cfg = params.sweep
    chosen = select_problems(problems, cfg.accuracy_samples, cfg.seed, "sweep.accuracy_samples")
    correct, settings, stats = accuracy_sweep(params, whole, chosen, journal, kept)
    # each count against count 0 (the none prompt, generated whether or not 0 is listed)
    rows = {(t, c): {"accuracy": float(correct[(t, c)].mean()), "correct": int(correct[(t, c)].sum()),
                     **(paired(correct[(t, c)], correct["none"], cfg.seed) if c else {})}
            for t in cfg.tokens for c in cfg.counts}
    return AccuracySweep(chosen, correct, settings, rows, stats)


def measure_likelihood(params: Params, whole: models.ModelSetup, problems) -> LikelihoodSweep:
    cfg = params.sweep
    chosen = select_problems(problems, cfg.likelihood_samples, cfg.seed, "sweep.likelihood_samples")
    mean = likelihood_sweep(params, whole, chosen)
    rows = {}
    for t in cfg.tokens:
        for c in cfg.counts:
            d = mean[(t, c)] - mean["none"]
            lo, hi = bootstrap_mean_ci(d, cfg.seed, n_boot=cfg.n_boot)
            rows[(t, c)] = {"delta": float(d.mean()), "ci": (float(lo), float(hi)), "p": wilcoxon_p(d),
                            "p_noise": noise.wilcoxon(d, "loglik")}  # QUANTITIES' kind of the likelihoods
    return LikelihoodSweep(chosen, mean, rows)


def metrics_summary(cfg: Sweep, summary: dict, tokenization: dict, accuracy: dict, n: int, n_acc: int,
                    lik_rows: dict | None = None, n_lik: int = 0) -> dict:
    """The summary `dvc metrics` and `dvc exp show` read: per token and count of `cfg` (params' sweep) the drop, span
    mass and lambda, and where measured the accuracy and likelihood against count 0."""
    lik_rows = lik_rows or {}
    out = {"layer": cfg.layer, "n_samples": n, "accuracy_samples": n_acc, "reference_count": cfg.reference_count,
           "likelihood_samples": n_lik, "tokens": {}}
    for token in cfg.tokens:
        rows = summary[token]["rows"]
        t = {"top_heads": [int(h) for h in summary[token]["top_heads"]], "counts": {}}
        for c in cfg.counts:
            r = rows[c]
            row = {"span_tokens": tokenization[token][c]["span_tokens"],
                   "drop_pct": round(float(r["drop_heads_pct"]), 4),
                   "drop_pct_ci95": [round(float(x), 4) for x in r["drop_heads_pct_ci"]],
                   "drop_top_pct": round(float(r["drop_top_pct"]), 4),
                   "span_mass": round(float(r["span_mass_heads"]), 6),
                   "lambda": round(1 - float(r["span_mass_heads"]), 6)}
            if (token, c) in accuracy:
                a = accuracy[(token, c)]
                row["accuracy"] = a["accuracy"]
                if "delta" in a:
                    row["accuracy_delta"] = a["delta"]
                    row["mcnemar_p"] = a["mcnemar_p"]
            if (token, c) in lik_rows:
                row["likelihood_delta"] = round(lik_rows[(token, c)]["delta"], 6)
            t["counts"][str(c)] = row
        out["tokens"][token] = t
    return out


def table(cfg: Sweep, summary: dict, tokenization: dict, accuracy: dict,
          lik_rows: dict | None = None) -> tuple[list[str], list[list]]:
    """The columns and one row per token and count of `cfg` (params' sweep), fixed columns, for dvc.yaml's `plots`
    (accuracy, likelihood `nan` when off)."""
    rows = []
    for token in cfg.tokens:
        for c in cfg.counts:
            r, a = summary[token]["rows"][c], accuracy.get((token, c), {})
            lk = (lik_rows or {}).get((token, c))
            rows.append([token, c, tokenization[token][c]["span_tokens"], f"{r['drop_heads_pct']:.6g}",
                         f"{r['drop_heads_pct_ci'][0]:.6g}", f"{r['drop_heads_pct_ci'][1]:.6g}",
                         f"{r['drop_top_pct']:.6g}", f"{100 * r['span_mass_heads']:.6g}",
                         f"{1 - r['span_mass_heads']:.6g}", f"{a['accuracy']:.6g}" if a else "nan",
                         f"{a['delta']:.6g}" if "delta" in a else "nan", f"{lk['delta']:.6g}" if lk else "nan"])
    return ["token", "count", "span_tokens", "drop_pct", "drop_pct_low", "drop_pct_high", "drop_top_pct", "span_mass_pct",
            "lambda", "accuracy", "accuracy_delta", "likelihood_delta"], rows

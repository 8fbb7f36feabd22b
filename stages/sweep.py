"""sweep@<model>: the effect against the span's length and character (the paper's dose-response): attention, and
optionally accuracy and likelihood, at every (token, count) (DEFINITIONS: each dataset).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from meaningless_tokens import cli, models, progress, scoring, store
from meaningless_tokens.attention import QUERY_VECTOR, reduce, sample_stats
from meaningless_tokens.capture import attention, compare
from meaningless_tokens.config import Params, Prompt
from meaningless_tokens.engines import Item, Journal, check_engine, journal_key, make_batches, open_engine, run_journaled
from meaningless_tokens.errors import CaptureError, ConfigError, PromptError, UnsupportedModel
from meaningless_tokens.intervals import bootstrap_mean_ci, bootstrap_ratio_ci, paired, wilcoxon_p
from meaningless_tokens.prompts import PromptBuilder, check_context, dataset_spec, load_problems, put_problems, select_problems
from meaningless_tokens.stage import INDEXING, header, stage_context
from meaningless_tokens.store import (put, put_json_attr, write_csv_atomic, write_h5, write_json_atomic,
                                      write_timing)

# what the artifact's `definitions` attribute says, and `--help`: a constant, not the docstring, so that an edit of the
# docstring leaves the attribute as it is (the file's code hash, in provenance, still changes: the stage reruns)
DEFINITIONS = """sweep@<model>: the effect against the span's length and character (the paper's dose-response).

For every span token of `sweep.tokens` and count of `sweep.counts` (the paper's 0, 10, 25, 40, 55, 70)
the `mless` prompt is rebuilt with that span (meaningless_tokens/prompts.py; count 0 is the `none` prompt) and,
on `sweep.attention_samples` problems, layer `sweep.layer`'s attention is captured and reduced exactly
as extraction does (meaningless_tokens/capture.py: `attention`; attention.py: `reduce`) and summarized exactly as
the statistics do (meaningless_tokens/attention.py: `sample_stats`), so the value at count 55 is the main pipeline's number:

  drop[k, h]           mean over samples of orig_mean[none] - orig_mean[count k], head h (attention
                       an original token receives, mean over original tokens; stats.query_set and
                       stats.exclude_first apply), with bootstrap 95 % intervals; drop_pct in percent
                       of the none mean
  drop_heads[k]        the same for the mean over heads; drop_top[k] for the mean over the `sweep.top_heads`
                       heads with the largest drop at `sweep.reference_count` (55, the paper's): one
                       fixed head set for every count
  span_mass[k, h]      attention original queries after the span give to it (0 at count 0); lambda =
                       1 - span_mass, the mass they keep on original keys
  span_tokens[k]       the span's length in this model's tokens (what a count of characters becomes)

With `sweep.accuracy_samples` > 0, MATH-500 accuracy too: greedy generation as evaluation does
(meaningless_tokens/engines.py: `generate`, `grade`, the resumable journal), count 0 once (= none), each other
(token, count) against it with the paired difference, its bootstrap interval and McNemar p.

With `sweep.likelihood_samples` > 0, the likelihood of the reference solution too (meaningless_tokens/scoring.py: the
same continuation, likelihood.solution_tokens and likelihood.separator, scored the same way on the whole model):
per (token, count) the mean log-prob per token of each problem, and its paired difference to count 0 with a
bootstrap interval and the Wilcoxon p: the dose-response with a continuous, paired outcome.

Outputs: artifacts/sweep/<model>.h5, metrics/sweep/<model>.json (the summary `dvc metrics` and
`dvc exp show` read), artifacts/plots/sweep/<model>.csv (for `dvc plots`), and the run's sidecar
metrics/timing/sweep-<model>.json.
"""

JOURNAL_VERSION = 1


# the stage's outputs (and its journal): role -> artifact kind (store.PATHS)
OUTPUTS = {"out": "sweep", "metrics": "metrics/sweep", "table": "plots/sweep", "timing": "timing/sweep",
           "journal": "journal/sweep"}


CONDITIONS = ["none", "mless"]  # the prompts a sweep builds; `mless` with each (token, count) as its span


def span_prompt(prompt: Prompt, token: str, count: int) -> Prompt:
    """params' prompt with the mless span set to `count` x `token` and only the none and mless conditions."""
    mless = prompt.mless.model_copy(update={"token": token, "count": count})
    return prompt.model_copy(update={"mless": mless, "conditions": list(CONDITIONS)})


def builders(params: Params, setup: models.ModelSetup, tokenizer) -> dict[tuple[str, int], PromptBuilder]:
    """A prompt builder per (token, count), checked before any model runs."""
    template = setup.spec.template or params.prompt.template
    out = {}
    for k, token in enumerate(params.sweep.tokens):
        for count in params.sweep.counts:
            try:
                out[(token, count)] = PromptBuilder(span_prompt(params.prompt, token, count), tokenizer, template,
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


def _build(bs: dict, params: Params, name: str, problems) -> dict:
    """(token, count) -> list of PromptIds of the mless prompt per problem; plus 'none'."""
    out = {}
    for (token, count), b in bs.items():
        try:
            out[(token, count)] = [b.build(p)["mless"] for p in problems]
        except AssertionError as e:  # the span's tokens changed the original tokens: no alignment
            raise ConfigError(f"{params.file}: sweep.tokens: '{token}' x {count} breaks the alignment of the "
                              f"original tokens for model '{name}' ({e})") from None
    first = next(iter(bs.values()))
    out["none"] = [first.build(p)["none"] for p in problems]
    return out


# ---- attention -------------------------------------------------------------------------------------

def attention_sweep(params: Params, name: str, model, prompts: dict, heads: list[int]) -> dict:
    """Per (token, count): per-sample orig_mean [S, H] and span_mass [S, H]; and none's orig_mean."""
    cfg, st = params.sweep, params.stats
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


def summarize_attention(params: Params, per: dict) -> dict:
    """Drops and span mass per token and count, with intervals; the top heads fixed at the reference count."""
    cfg = params.sweep
    base = per["none"][0]  # [S, H]
    ref = params.sweep.reference_count
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

def accuracy_sweep(params: Params, setup: models.ModelSetup, problems, where: dict) -> tuple[dict, dict]:
    """Per (token, count): per-problem correctness (count 0 is the none prompt, generated once);
    and the generation settings. Journaled like evaluation: an interrupted run resumes."""
    ev, name = params.evaluate, setup.name
    with open_engine(ev, CONDITIONS, setup, sampled=False) as engine:
        prompts = _build(builders(params, setup, engine.tokenizer), params, name, problems)
        cond = {key: f"{key[0]}x{key[1]}" for key in prompts if key != "none" and key[1] > 0}
        items = [Item(p.index, "none", pr.input_ids) for p, pr in zip(problems, prompts["none"])]
        items += [Item(p.index, c, pr.input_ids) for key, c in cond.items() for p, pr in zip(problems, prompts[key])]
        longest = max(len(it.input_ids) for it in items)
        check_context(setup, "sweep.counts", f"a prompt of {longest} tokens plus evaluate.max_new_tokens {ev.max_new_tokens}",
                      longest + ev.max_new_tokens)
        # the plan's batch size (evaluate.batch_size: auto) and, compiled, its one shape: before the key, which records both
        batch_size = engine.fit([(items, ev.max_new_tokens)])
        settings = engine.settings
        journal = Journal(where["journal"], journal_key(setup.prepared.weights_sha256, settings, items,
                                                        version=JOURNAL_VERSION))
        # equal lengths by problem, then by the condition's name (`<token>x<count>`): the batches this stage has always run
        batches = make_batches(items, batch_size, condition_rank=str)
        run_journaled(engine, batches, journal, {p.index: p.answer for p in problems},
                      f"sweep accuracy {name}", name)
        correct = {key: np.array([journal.records[(p.index, "none" if key == "none" or key[1] == 0 else cond[key])].correct
                                  for p in problems]) for key in prompts}
        where["journal"].unlink(missing_ok=True)
        return correct, settings


# ---- likelihood ------------------------------------------------------------------------------------

def likelihood_sweep(params: Params, setup: models.ModelSetup, problems) -> dict:
    """Per (token, count): each problem's mean log-prob per token of the reference solution (count 0: the none
    prompt, scored once), from one load of the whole model."""
    name = setup.name
    model, tokenizer, _ = scoring.load(setup)
    bs = builders(params, setup, tokenizer)
    prompts = _build(bs, params, name, problems)
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
    lps, _, _ = scoring.score_shown(model, seqs, params.likelihood.batch_tokens, scoring.pad_id(tokenizer),
                                    desc=f"sweep likelihood {name}", name=name)
    mean = {key: np.array([lps[at[(key, p.index)]].mean() for p in problems]) for key in keys}
    return {key: mean["none" if key == "none" or key[1] == 0 else key] for key in prompts}


# ---- the stage -------------------------------------------------------------------------------------

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


@dataclass
class LikelihoodSweep:
    problems: list = field(default_factory=list)  # none: the likelihood sweep is off
    mean: dict = field(default_factory=dict)      # (token, count) and "none" -> [problem], nats/token
    rows: dict = field(default_factory=dict)      # (token, count) -> paired difference to count 0


def run(params: Params, name: str, root: Path | None = None) -> Path:
    ctx = stage_context(params, "sweep", name, root, **OUTPUTS)
    params, where = ctx.params, ctx.where
    cfg = params.sweep
    problems, data_sha = load_problems(dataset_spec(params.dataset, params.file))
    att = measure_attention(params, ctx.setup(layers=[cfg.layer]), problems)
    if cfg.accuracy_samples:
        # before the whole model is prepared; CONDITIONS: the prompts the sweep generates (the engine's too)
        check_engine(params.evaluate, CONDITIONS, params.runtime, params.file)
    # generation and scoring run the whole model: a GGUF source is converted in full (once) for them
    whole = ctx.setup() if cfg.accuracy_samples or cfg.likelihood_samples else None
    acc = measure_accuracy(params, whole, problems, where) if cfg.accuracy_samples else AccuracySweep()
    lik = measure_likelihood(params, whole, problems) if cfg.likelihood_samples else LikelihoodSweep()

    write_artifact(where["out"], params, name, att, acc, lik, data_sha)
    write_json_atomic(where["metrics"], metrics_summary(params, att.summary, att.tokenization, acc.rows,
                                                        len(att.problems), len(acc.problems), lik.rows, len(lik.problems)))
    write_table(where["table"], params, att.summary, att.tokenization, acc.rows, lik.rows)
    write_timing(where["timing"], {"seconds": ctx.seconds(),
                                   "attention_seconds": round(att.seconds, 2), "attention_prompts": att.prompts})
    print(f"{name}: span sweep of {len(cfg.tokens)} token(s) x {len(cfg.counts)} counts on {len(att.problems)} problems"
          + (f", accuracy on {len(acc.problems)}" if acc.problems else "")
          + (f", likelihood on {len(lik.problems)}" if lik.problems else "") + f" -> {where['out']}")
    return where["out"]


def measure_attention(params: Params, setup: models.ModelSetup, problems) -> AttentionSweep:
    """Layer sweep.layer's attention at every (token, count) on the attention problems, probed, reduced and summarized;
    only the embeddings and layers 0..sweep.layer run (the capture stops after that layer's attention)."""
    cfg, name, facts = params.sweep, setup.name, setup.facts
    chosen = select_problems(problems, cfg.attention_samples, cfg.seed, "sweep.attention_samples")
    if cfg.layer >= facts["num_layers"]:
        raise ConfigError(f"{params.file}: sweep.layer: {cfg.layer} out of range; model '{name}' has "
                          f"{facts['num_layers']} layers (allowed 0..{facts['num_layers'] - 1})")
    heads = list(range(facts["num_heads"])) if setup.spec.heads == "all" else list(setup.spec.heads)
    model, tokenizer = models.load(setup, layers=[cfg.layer])
    bs = builders(params, setup, tokenizer)
    prompts = _build(bs, params, name, chosen)
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
    per = attention_sweep(params, name, model, prompts, heads)
    seconds = time.perf_counter() - t0
    return AttentionSweep(chosen, heads, bs, probe, tokenization, per, summarize_attention(params, per),
                          sum(len(prompts[k]) for k in prompts if k == "none" or k[1] > 0), seconds,
                          setup.prepared.manifest())


def measure_accuracy(params: Params, whole: models.ModelSetup, problems, where: dict) -> AccuracySweep:
    cfg = params.sweep
    chosen = select_problems(problems, cfg.accuracy_samples, cfg.seed, "sweep.accuracy_samples")
    correct, settings = accuracy_sweep(params, whole, chosen, where)
    # each count against count 0 (the none prompt, generated whether or not 0 is listed)
    rows = {(t, c): {"accuracy": float(correct[(t, c)].mean()), "correct": int(correct[(t, c)].sum()),
                     **(paired(correct[(t, c)], correct["none"], cfg.seed) if c else {})}
            for t in cfg.tokens for c in cfg.counts}
    return AccuracySweep(chosen, correct, settings, rows)


def measure_likelihood(params: Params, whole: models.ModelSetup, problems) -> LikelihoodSweep:
    cfg = params.sweep
    chosen = select_problems(problems, cfg.likelihood_samples, cfg.seed, "sweep.likelihood_samples")
    mean = likelihood_sweep(params, whole, chosen)
    rows = {}
    for t in cfg.tokens:
        for c in cfg.counts:
            d = mean[(t, c)] - mean["none"]
            lo, hi = bootstrap_mean_ci(d, cfg.seed, n_boot=cfg.n_boot)
            rows[(t, c)] = {"delta": float(d.mean()), "ci": (float(lo), float(hi)), "p": wilcoxon_p(d)}
    return LikelihoodSweep(chosen, mean, rows)


def write_artifact(out: Path, params: Params, name: str, att: AttentionSweep, acc: AccuracySweep,
                   lik: LikelihoodSweep, data_sha: str) -> None:
    """artifacts/sweep/<model>.h5: the layout DEFINITIONS describes, its provenance at the root."""
    cfg, bs, per, summary, tokenization = params.sweep, att.builders, att.per, att.summary, att.tokenization
    prov = {
        **store.model_provenance("sweep", params, name, att.manifest),
        "layers_probe": att.probe,
        **bs[(cfg.tokens[0], cfg.counts[-1])].describe(),
        # evaluate and likelihood are read only when those sweeps run: otherwise not part of what made this file
        "params": {**store.stage_params(params, "sweep", name), **({"evaluate": None} if not cfg.accuracy_samples else {}),
                   **({"likelihood": None} if not cfg.likelihood_samples else {})},
        "generation": acc.settings,
        "dataset_sha256": data_sha,
        "dataset_file": dataset_spec(params.dataset, params.file).describe(),
    }
    ref = cfg.reference_count
    with write_h5(out) as f:
        header(f, OUTPUTS["out"], name, layer=cfg.layer, heads=np.array(att.heads, dtype=np.int32),
               counts=np.array(cfg.counts, dtype=np.int32), tokens=list(cfg.tokens), reference_count=ref,
               n_samples=len(att.problems), accuracy_samples=len(acc.problems), likelihood_samples=len(lik.problems),
               indexing=INDEXING, definitions=DEFINITIONS)
        put_json_attr(f, "provenance", prov)
        put_problems(f, att.problems)
        if acc.problems:
            put(f, "accuracy_problem_index", np.array([p.index for p in acc.problems], dtype=np.int32))
        if lik.problems:
            put(f, "likelihood_problem_index", np.array([p.index for p in lik.problems], dtype=np.int32))
            put(f, "likelihood_none", lik.mean["none"], note="count 0: mean log-prob per token of the solution, per problem")
        put(f, "orig_mean_none", per["none"][0], shape="[sample, head]")
        for k, token in enumerate(cfg.tokens):
            g = f.create_group(f"token_{k}")
            g.attrs["token"] = token
            g.attrs["span_text"] = [bs[(token, c)].mless_text for c in cfg.counts]
            put(g, "top_heads", summary[token]["top_heads"], note=f"largest drop at count {ref}")
            put(g, "span_tokens", np.array([tokenization[token][c]["span_tokens"] for c in cfg.counts], dtype=np.int32))
            put(g, "pieces_per_repetition", np.int32(tokenization[token][cfg.counts[-1]]["pieces_per_repetition"]))
            rows = summary[token]["rows"]
            for fld in rows[cfg.counts[0]]:
                put(g, fld, np.stack([rows[c][fld] for c in cfg.counts]).astype(np.float64),
                    shape="[count, ...]; intervals [count, low/high, ...]")
            put(g, "orig_mean", np.stack([per[(token, c)][0] for c in cfg.counts]), shape="[count, sample, head]")
            put(g, "span_mass_per_sample", np.stack([per[(token, c)][1] for c in cfg.counts]),
                shape="[count, sample, head]")
            if acc.correct:
                put(g, "correct", np.stack([acc.correct[(token, c)] for c in cfg.counts]), shape="[count, problem]")
                a = [acc.rows[(token, c)] for c in cfg.counts]
                put(g, "accuracy", np.array([r["accuracy"] for r in a]))
                put(g, "accuracy_delta", np.array([r.get("delta", 0.0) for r in a]), note="vs count 0 (none)")
                put(g, "accuracy_delta_ci", np.array([[r.get("ci95_low", 0.0), r.get("ci95_high", 0.0)] for r in a]),
                    shape="[count, low/high]", note="paired bootstrap 95 % interval over problems")
                put(g, "mcnemar_p", np.array([r.get("mcnemar_p", 1.0) for r in a]), note="exact McNemar vs count 0")
            if lik.mean:
                put(g, "likelihood", np.stack([lik.mean[(token, c)] for c in cfg.counts]), shape="[count, problem]",
                    note="mean log-prob per token of the reference solution, nats/token")
                rows_l = [lik.rows[(token, c)] for c in cfg.counts]
                put(g, "likelihood_delta", np.array([r["delta"] for r in rows_l]), note="vs count 0 (none), nats/token")
                put(g, "likelihood_delta_ci", np.array([r["ci"] for r in rows_l]), shape="[count, low/high]")
                put(g, "likelihood_p", np.array([r["p"] for r in rows_l]), note="Wilcoxon signed-rank vs count 0")
        if acc.correct:
            put(f, "correct_none", acc.correct["none"], note="count 0: the none prompt, per accuracy problem")


def metrics_summary(params: Params, summary: dict, tokenization: dict, accuracy: dict, n: int, n_acc: int,
                    lik_rows: dict | None = None, n_lik: int = 0) -> dict:
    cfg = params.sweep
    lik_rows = lik_rows or {}
    out = {"layer": cfg.layer, "n_samples": n, "accuracy_samples": n_acc, "reference_count": params.sweep.reference_count,
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


def write_table(path: Path, params: Params, summary: dict, tokenization: dict, accuracy: dict,
                lik_rows: dict | None = None) -> None:
    """One row per token and count, fixed columns, for dvc.yaml's `plots` (accuracy, likelihood `nan` when off)."""
    rows = []
    for token in params.sweep.tokens:
        for c in params.sweep.counts:
            r, a = summary[token]["rows"][c], accuracy.get((token, c), {})
            lk = (lik_rows or {}).get((token, c))
            rows.append([token, c, tokenization[token][c]["span_tokens"], f"{r['drop_heads_pct']:.6g}",
                         f"{r['drop_heads_pct_ci'][0]:.6g}", f"{r['drop_heads_pct_ci'][1]:.6g}",
                         f"{r['drop_top_pct']:.6g}", f"{100 * r['span_mass_heads']:.6g}",
                         f"{1 - r['span_mass_heads']:.6g}", f"{a['accuracy']:.6g}" if a else "nan",
                         f"{a['delta']:.6g}" if "delta" in a else "nan", f"{lk['delta']:.6g}" if lk else "nan"])
    write_csv_atomic(path, ["token", "count", "span_tokens", "drop_pct", "drop_pct_low", "drop_pct_high",
                            "drop_top_pct", "span_mass_pct", "lambda", "accuracy", "accuracy_delta",
                            "likelihood_delta"], rows)


def main(argv: list[str] | None = None) -> int:
    return cli.main("sweep", DEFINITIONS, run, argv)


if __name__ == "__main__":
    sys.exit(main())

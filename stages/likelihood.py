"""likelihood@<model>: teacher-forced log-probabilities of the reference solution and of the gold answer.

A paired, continuous outcome that needs one forward pass per (problem, condition) and no generation. For each
problem of the subset (likelihood.n_samples, likelihood.seed: seeded and stratified by level as extraction is,
so equal seeds give nested subsets) and each condition of likelihood.conditions, two continuations are appended
to that condition's prompt and scored token by token:

  solution   the reference solution (MATH-500 `solution`), its first likelihood.solution_tokens tokens
  answer     likelihood.answer_frame with <answer> replaced by the gold answer (`answer`): the text before
             <answer> is context, the answer and the rest of the frame are scored, i.e.
             log P(answer + "}$." | prompt + "The final answer is $\\boxed{")

Layout: prompt + context + scored. The context is likelihood.separator (raw template; the chat template's
assistant turn separates by itself) plus, for `answer`, the frame's head. Every part is tokenized as a
separate segment, as the prompt's parts are, so the scored token ids are the same in every condition
(asserted: `check_alignment`).

`arm` is the none prompt with the paper's ARM on layer 0's act_fn (stages/arm.py's edit), in the same forward
pass. Teacher forcing is a prefill of prompt + continuation; ARM is applied as generation would have applied
it, had the model generated exactly these tokens: the prompt's positions are edited together as step 0 (one
pool, the draws seeded by (arm.seed, problem index, 0)), and with arm.apply: all each continuation position j
is edited alone as decode step j + 1 (its own channels, seeded by (arm.seed, problem index, j + 1)), which is
what the hook does at each decode step; with arm.apply: prefill only the prompt's positions are edited. The
statistics are each sequence's own (arm.pool: row); batch pooling has no counterpart in scoring one sequence.

The whole model runs (no early exit); the LM head runs only at the positions that predict a scored token, in
chunks (never a [T, vocab] tensor for the whole prompt); sequences are sorted by length and batched up to
likelihood.batch_tokens padded tokens (right padding: causal attention keeps the pads out of every real token).

Outputs:
  artifacts/likelihood/<model>.h5    per condition and continuation: sum, mean (nats/token) and tokens per
                                     problem; per contrast (c - none): the paired statistics below; per-token
                                     log-probs of the first likelihood.showcase problems
  metrics/likelihood/<model>.json    the summary `dvc metrics show` and `dvc exp show` read
  artifacts/plots/likelihood/<model>.csv   one row per contrast and outcome, for `dvc plots`
  metrics/timing/likelihood-<model>.json   the run's sidecar (seconds, tokens per second)

Paired statistics of each contrast c - none, for the OUTCOMES (solution: mean log-prob per token; answer: the
answer's summed log-prob): mean difference with a seeded bootstrap 95 % interval, two-sided Wilcoxon
signed-rank p, the share of problems that improved, and the same per MATH level and per subject.

An interrupted run restarts from the beginning (the outputs are written only at the end, atomically).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from stages import arm, cli, models, progress
from stages.config import ANSWER_MARK, ConfigError, Params, model_spec
from stages.intervals import bootstrap_mean_ci, wilcoxon_p
from stages.prompts import DatasetError, Problem, builder_for, dataset_spec, load_problems, put_problems, require_field, select_problems
from stages.store import provenance, put, put_json_attr, write_csv_atomic, write_h5, write_json_atomic, write_timing

CONTINUATIONS = ("solution", "answer")
# what each continuation's contrasts compare: the solution's mean log-prob per token (nats/token), the
# answer's summed log-prob (nats: log P(the whole answer))
OUTCOMES = {"solution": "mean", "answer": "sum"}
UNITS = {"solution": "nats/token", "answer": "nats"}
# the per-model params keys this stage reads (dvc.yaml lists exactly these)
MODEL_KEYS = ("family", "source", "template", "trust_remote_code", "arm")
HEAD_CHUNK = 1 << 23  # logits per chunk of the LM head (32 positions of a 262k vocabulary: 32 MiB in float32)


def paths(name: str) -> dict[str, Path]:
    return {"out": Path("artifacts/likelihood") / f"{name}.h5",
            "metrics": Path("metrics/likelihood") / f"{name}.json",
            "table": Path("artifacts/plots/likelihood") / f"{name}.csv",
            "timing": Path("metrics/timing") / f"likelihood-{name}.json"}


def scoring_params(params: Params) -> Params:
    """params whose prompt conditions are likelihood.conditions (the prompt builder builds those)."""
    prompt = params.prompt.model_copy(update={"conditions": list(params.likelihood.conditions)})
    return params.model_copy(update={"prompt": prompt})


# ---- sequences ------------------------------------------------------------------------------------

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

    def __init__(self, params: Params, builder):
        cfg = params.likelihood
        self.builder, self.cfg = builder, cfg
        self.dataset = dataset_spec(params).path
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


def build_sequences(params: Params, name: str, builder, chosen: list[Problem], context: int | None) -> list[Seq]:
    """Every (problem, condition, continuation) sequence, alignment asserted, refusing one longer than the context."""
    conts = Continuations(params, builder)
    seqs = []
    for p in chosen:
        prompts = builder.build(p)
        parts = conts.build(p)
        for c in params.likelihood.conditions:
            ids = list(prompts[c].input_ids)
            for k in CONTINUATIONS:
                ctx, scored = parts[k]
                seqs.append(Seq(p.index, c, k, tuple(ids + ctx + scored), len(ids), len(ids) + len(ctx)))
    check_alignment(seqs)
    if context:
        for s in seqs:
            if len(s.input_ids) > context:
                key = "likelihood.solution_tokens" if s.continuation == "solution" else "likelihood.answer_frame"
                raise ConfigError(
                    f"{params.file}: {key}: problem {s.index} ({s.condition}): the prompt ({s.prompt_len} tokens) plus "
                    f"the {s.continuation} ({len(s.input_ids) - s.prompt_len} tokens) exceed the context of model "
                    f"'{name}' ({context} positions)")
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


# ---- scoring ---------------------------------------------------------------------------------------

class TeacherForcedArm:
    """ARM on layer 0's act_fn for the rows `begin` marks, mapped onto teacher forcing (see the module text).

    begin(rows): rows[r] = (problem index, prompt length, sequence length) of an arm row, or None."""

    def __init__(self, mlp, settings: arm.ArmSettings):
        self.settings = settings
        self.rows: list = []
        self.handle = mlp.act_fn.register_forward_hook(self)

    def begin(self, rows: list) -> None:
        self.rows = list(rows)

    def remove(self) -> None:
        self.handle.remove()

    def __call__(self, module, inputs, a):
        import torch

        if not any(r is not None for r in self.rows):
            return None
        if len(self.rows) != a.shape[0]:
            raise RuntimeError(f"ARM hook: {len(self.rows)} rows marked, the batch has {a.shape[0]}")
        s = self.settings
        out = a.clone()
        for r, row in enumerate(self.rows):
            if row is None:
                continue
            index, p, n = row
            g = torch.Generator(device=a.device).manual_seed(arm.row_seed(s.seed, index, 0))
            out[r, :p] = arm.edit(a[r, :p], s, g)
            if s.apply == "all" and n > p:
                gens = [torch.Generator(device=a.device).manual_seed(arm.row_seed(s.seed, index, step))
                        for step in range(1, n - p + 1)]
                out[r, p:n] = arm.edit_rows(a[r, p:n], s, gens)
        return out


def head_logprobs(model, hidden, targets):
    """log P(target) from final hidden states [N, D] (after the final norm): the LM head in chunks, with the
    family's final logit transformations (Gemma's softcapping, Granite's scaling, Cohere's scale); float64 [N]."""
    import torch

    text = model.config.get_text_config()
    head = model.get_output_embeddings()
    cap = getattr(text, "final_logit_softcapping", None)
    scaling = getattr(text, "logits_scaling", None)
    scale = getattr(text, "logit_scale", None)
    step = max(1, HEAD_CHUNK // head.weight.shape[0])
    out = []
    for i in range(0, hidden.shape[0], step):
        logits = head(hidden[i:i + step]).float()
        if scale is not None:
            logits = logits * scale
        if scaling is not None:
            logits = logits / scaling
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        t = targets[i:i + step, None]
        out.append((logits.gather(1, t) - torch.logsumexp(logits, dim=-1, keepdim=True))[:, 0])
    return torch.cat(out).double().cpu().numpy() if out else np.zeros(0)


def batches(seqs: list[Seq], batch_tokens: int) -> list[list[int]]:
    """Indices of `seqs` sorted by length, cut so that rows x longest row stays within batch_tokens."""
    order = sorted(range(len(seqs)), key=lambda k: (len(seqs[k].input_ids), k))
    out, cur = [], []
    for k in order:
        if cur and (len(cur) + 1) * len(seqs[k].input_ids) > batch_tokens:
            out.append(cur)
            cur = []
        cur.append(k)
    return out + ([cur] if cur else [])


def score(model, seqs: list[Seq], batch_tokens: int, pad: int, arm_hook: TeacherForcedArm | None = None,
          bar=None) -> list[np.ndarray]:
    """Per sequence, the log-prob of each scored token given everything before it (float64)."""
    import torch

    device = model.get_output_embeddings().weight.device
    decoder = model.get_decoder()
    result: list = [None] * len(seqs)
    for batch in batches(seqs, batch_tokens):
        rows = [seqs[k] for k in batch]
        width = max(len(s.input_ids) for s in rows)
        ids = torch.full((len(rows), width), pad, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for r, s in enumerate(rows):
            ids[r, :len(s.input_ids)] = torch.tensor(s.input_ids)
            mask[r, :len(s.input_ids)] = 1
        if arm_hook is not None:
            arm_hook.begin([(s.index, s.prompt_len, len(s.input_ids)) if s.condition == "arm" else None for s in rows])
        elif any(s.condition == "arm" for s in rows):
            raise ValueError("arm rows need the ARM hook")
        try:
            with torch.no_grad():
                hidden = decoder(input_ids=ids.to(device), attention_mask=mask.to(device), use_cache=False)[0]
                r_idx = torch.cat([torch.full((len(s.scored),), r) for r, s in enumerate(rows)])
                pos = torch.cat([torch.arange(s.start - 1, len(s.input_ids) - 1) for s in rows])
                lp = head_logprobs(model, hidden[r_idx.to(device), pos.to(device)], ids[r_idx, pos + 1].to(device))
        finally:
            if arm_hook is not None:
                arm_hook.begin([])
        at = 0
        for k, s in zip(batch, rows):
            result[k] = lp[at:at + len(s.scored)]
            at += len(s.scored)
        if bar is not None:
            bar.update(len(rows))
    return result


def check_head(model, seq: Seq, pad: int) -> float:
    """The max abs difference between `score` and the model's own logits + log_softmax on one sequence;
    refuses a family whose final logits this stage does not reproduce."""
    import torch

    with torch.no_grad():
        logits = model(input_ids=torch.tensor([seq.input_ids], device=model.get_output_embeddings().weight.device),
                       use_cache=False).logits[0].float()
        ref = torch.log_softmax(logits, -1)[torch.arange(seq.start - 1, len(seq.input_ids) - 1),
                                            torch.tensor(seq.scored)].double().cpu().numpy()
    got = score(model, [seq], len(seq.input_ids), pad)[0]
    diff = float(np.max(np.abs(got - ref)))
    if not diff < 1e-3:
        raise models.UnsupportedModel(
            f"model_type '{model.config.model_type}': the LM head applied at the scored positions differs from the "
            f"model's own logits by {diff:.3g} nats (a final-logit transformation this stage does not know)")
    return diff


def load(params: Params, prepared) -> tuple:
    """(model, tokenizer, attention implementation): the whole model, SDPA where the family has it."""
    try:
        return (*models.load(params, prepared, attn_implementation="sdpa"), "sdpa")
    except ValueError as e:
        if "scaled_dot_product" not in str(e):
            raise
    return (*models.load(params, prepared, attn_implementation="eager"), "eager")


def pad_id(tokenizer) -> int:
    for t in (tokenizer.pad_token_id, tokenizer.eos_token_id, 0):
        if t is not None:
            return int(t)
    return 0


# ---- statistics -----------------------------------------------------------------------------------

def paired_stats(diff: np.ndarray, seed: int, n_boot: int) -> dict:
    """Mean paired difference, its seeded bootstrap 95 % interval, the Wilcoxon signed-rank p and the share of
    problems that improved (difference > 0)."""
    diff = np.asarray(diff, dtype=np.float64)
    lo, hi = bootstrap_mean_ci(diff, seed, n_boot=n_boot)
    return {"n": len(diff), "mean": float(diff.mean()), "ci": (float(lo), float(hi)),
            "p": wilcoxon_p(diff), "improved": float(np.mean(diff > 0))}


def groups(values: list, diff: np.ndarray, seed: int, n_boot: int) -> tuple[list, list[dict]]:
    """The paired statistics per value (level, subject); none when the dataset lacks the field (AIME: no level)."""
    if any(v is None for v in values):
        return [], []
    keys = sorted(set(values))
    return keys, [paired_stats(diff[[v == k for v in values]], seed, n_boot) for k in keys]


def summarize(per: dict, conditions: list[str], chosen: list[Problem], seed: int, n_boot: int) -> dict:
    """{(contrast, continuation): {"diff", "all", "level": (keys, stats), "subject": (keys, stats)}}."""
    out = {}
    levels, subjects = [p.level for p in chosen], [p.subject for p in chosen]
    for c in conditions:
        if c == "none":
            continue
        for k in CONTINUATIONS:
            m = OUTCOMES[k]
            diff = per[(c, k)][m] - per[("none", k)][m]
            out[(f"{c}-none", k)] = {"diff": diff, "all": paired_stats(diff, seed, n_boot),
                                     "level": groups(levels, diff, seed, n_boot),
                                     "subject": groups(subjects, diff, seed, n_boot)}
    return out


def _put_stats(g, prefix: str, stats: list[dict]) -> None:
    put(g, f"{prefix}n", np.array([s["n"] for s in stats], dtype=np.int32))
    put(g, f"{prefix}mean", np.array([s["mean"] for s in stats]))
    put(g, f"{prefix}ci", np.array([s["ci"] for s in stats]), shape="[group, low/high]")
    put(g, f"{prefix}p", np.array([s["p"] for s in stats]), note="two-sided Wilcoxon signed-rank")
    put(g, f"{prefix}improved", np.array([s["improved"] for s in stats]), note="share of problems with diff > 0")


# ---- the stage ------------------------------------------------------------------------------------

def run(params: Params, name: str, root: Path | None = None) -> Path:
    started = time.perf_counter()
    spec = model_spec(params, name)
    cfg = params.likelihood
    where = {k: (root / v if root else params.resolve(str(v))) for k, v in paths(name).items()}
    sp = scoring_params(params)
    problems, data_sha = load_problems(params)
    chosen = select_problems(problems, cfg.n_samples, cfg.seed, "likelihood.n_samples")
    require_field(params, chosen, "solution", "the likelihood stage (its `solution` continuation)")
    if name not in params.scored:
        raise ConfigError(f"{params.file}: likelihood.models: model '{name}' is not among the models scored "
                          f"{params.scored}; add it there to score it")
    prepared = models.prepare(params, name)
    conditions = list(cfg.conditions)
    arm_settings = arm.resolve(params, name, arm.model_type(prepared.facts)) if "arm" in conditions else None
    model, tokenizer, attn = load(params, prepared)
    builder = builder_for(sp, name, tokenizer)
    seqs = build_sequences(sp, name, builder, chosen, prepared.facts["max_position_embeddings"])
    pad = pad_id(tokenizer)
    head_check = check_head(model, min(seqs, key=lambda s: len(s.input_ids)), pad)
    hook = TeacherForcedArm(arm.layer0_mlp(model, params, name), arm_settings) if arm_settings else None
    bar = progress.bar(total=len(seqs), desc=f"likelihood {name}", unit="seq")
    t0 = time.perf_counter()
    logprobs = score(model, seqs, cfg.batch_tokens, pad, hook, bar)
    seconds = time.perf_counter() - t0
    bar.close()
    if hook is not None:
        hook.remove()
    at = {(s.index, s.condition, s.continuation): k for k, s in enumerate(seqs)}
    per = {}
    for c in conditions:
        for k in CONTINUATIONS:
            lps = [logprobs[at[(p.index, c, k)]] for p in chosen]
            per[(c, k)] = {"sum": np.array([x.sum() for x in lps]), "mean": np.array([x.mean() for x in lps]),
                           "tokens": np.array([len(x) for x in lps], dtype=np.int32),
                           "prompt_tokens": np.array([seqs[at[(p.index, c, k)]].prompt_len for p in chosen],
                                                     dtype=np.int32)}
    summary = summarize(per, conditions, chosen, cfg.seed, cfg.n_boot)
    conts = Continuations(sp, builder)
    prov = {
        **provenance("likelihood"),
        "model": {"name": name, **prepared.manifest()},
        **builder.describe(sp),
        "scoring": {"attn_implementation": attn, "batch_tokens": cfg.batch_tokens, "pad_token_id": pad,
                    "head_check_max_abs_diff": head_check, "separator_ids": conts.sep, "frame_head_ids": conts.head,
                    "frame_tail": conts.tail},
        **({"arm": {**arm_settings.describe(), "teacher_forcing": "prompt = step 0 (one pool); continuation "
                    "position j = decode step j + 1 (its own channels) when apply is all; per-sequence statistics",
                    "differences_from_paper": arm.DIFFERENCES}} if arm_settings else {}),
        # exactly the params keys dvc.yaml lists for this stage
        "params": {"models": {name: spec.model_dump(include=set(MODEL_KEYS))},
                   "prompt": params.prompt.model_dump(include={"instruction", "template", "mless", "mful"}),
                   "likelihood": cfg.model_dump(exclude={"models"}),
                   **({"arm": params.arm.model_dump(include={"variant", "apply", "seed"})} if arm_settings else {}),
                   "dataset": params.dataset.model_dump(),
                   "runtime": params.runtime.model_dump(include={"device", "dtype"})},
        "dataset_sha256": data_sha,
    }
    import h5py

    with write_h5(where["out"]) as f:
        f.attrs["kind"] = "likelihood"
        f.attrs["model"] = name
        f.attrs["conditions"] = conditions
        f.attrs["continuations"] = list(CONTINUATIONS)
        f.attrs["n_samples"] = len(chosen)
        f.attrs["definitions"] = __doc__
        put_json_attr(f, "outcomes", {k: f"{OUTCOMES[k]} ({UNITS[k]})" for k in CONTINUATIONS})
        put_json_attr(f, "provenance", prov)
        put_problems(f, chosen)
        for c in conditions:
            for k in CONTINUATIONS:
                g = f.require_group(f"{c}/{k}")
                put(g, "sum", per[(c, k)]["sum"], note="summed log-prob of the scored tokens, nats")
                put(g, "mean", per[(c, k)]["mean"], note="mean log-prob per scored token, nats/token")
                put(g, "tokens", per[(c, k)]["tokens"])
                put(g, "prompt_tokens", per[(c, k)]["prompt_tokens"])
        for (contrast, k), r in summary.items():
            g = f.require_group(f"contrasts/{contrast}/{k}")
            g.attrs["outcome"] = f"{OUTCOMES[k]} ({UNITS[k]})"
            put(g, "diff", r["diff"], shape="[problem]")
            _put_stats(g, "", [r["all"]])
            for by in ("level", "subject"):
                keys, stats = r[by]
                dtype = np.int8 if by == "level" else (object if keys else h5py.string_dtype())  # none: no such field
                put(g, f"{by}s", np.array(keys, dtype=dtype), compress=False)
                _put_stats(g, f"{by}_", stats)
        sc = f.create_group("showcase")
        for p in chosen[:cfg.showcase]:
            for c in conditions:
                for k in CONTINUATIONS:
                    s = seqs[at[(p.index, c, k)]]
                    g = sc.require_group(f"{p.index:03d}/{c}/{k}")
                    put(g, "token_ids", np.array(s.scored, dtype=np.int32))
                    put(g, "logprob", logprobs[at[(p.index, c, k)]].astype(np.float32))
    write_json_atomic(where["metrics"], metrics_summary(per, summary, conditions, len(chosen)))
    write_table(where["table"], summary)
    tokens = sum(len(s.input_ids) for s in seqs)
    write_timing(where["timing"], {"seconds": round(time.perf_counter() - started, 2), "scoring_seconds": round(seconds, 2),
                                   "sequences": len(seqs), "tokens": tokens,
                                   "tokens_per_second": round(tokens / seconds, 1) if seconds else None})
    gains = ", ".join(f"{c}: {r['all']['mean']:+.4f}" for (c, k), r in summary.items() if k == "solution")
    print(f"{name}: likelihood of {len(chosen)} problems x {len(conditions)} conditions x 2 continuations in "
          f"{seconds:.1f} s; solution nats/token vs none {gains} -> {where['out']}")
    return where["out"]


def metrics_summary(per: dict, summary: dict, conditions: list[str], n: int) -> dict:
    def r(x: float) -> float:
        return round(float(x), 6)

    out = {"n_problems": n, "outcomes": {k: f"{OUTCOMES[k]} log-prob ({UNITS[k]})" for k in CONTINUATIONS},
           "logprob": {c: {k: r(per[(c, k)][OUTCOMES[k]].mean()) for k in CONTINUATIONS} for c in conditions},
           "scored_tokens_mean": {k: r(per[("none", k)]["tokens"].mean()) for k in CONTINUATIONS},
           "contrasts": {}}
    for (contrast, k), res in summary.items():
        a = res["all"]
        out["contrasts"].setdefault(contrast, {})[k] = {
            "delta": r(a["mean"]), "ci95": [r(x) for x in a["ci"]], "ci95_width": r(a["ci"][1] - a["ci"][0]),
            "wilcoxon_p": r(a["p"]), "improved": r(a["improved"])}
    return out


def write_table(path: Path, summary: dict) -> None:
    """One row per contrast and outcome, fixed columns, for dvc.yaml's `plots`."""
    rows = []
    for (contrast, k), res in summary.items():
        a = res["all"]
        rows.append([contrast, k, f"{contrast} / {k} ({UNITS[k]})", f"{a['mean']:.6g}", f"{a['ci'][0]:.6g}",
                     f"{a['ci'][1]:.6g}", f"{a['improved']:.6g}", a["n"]])
    write_csv_atomic(path, ["contrast", "continuation", "label", "delta", "low", "high", "improved", "n"], rows)


def main(argv: list[str] | None = None) -> int:
    return cli.main("likelihood", __doc__, run, argv)


if __name__ == "__main__":
    sys.exit(main())

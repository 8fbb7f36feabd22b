"""stats@<model>: averaged attention statistics from extract's `artifacts/attention/<model>.h5`, the drops of attention
on original tokens under each condition against `none`, with paired bootstrap intervals (DEFINITIONS: each dataset).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from meaningless_tokens import cli, store
from meaningless_tokens.attention import PROMPT_CONDITIONS, QUERY_VECTOR, VECTORS, sample_stats
from meaningless_tokens.config import Params
from meaningless_tokens.errors import ArtifactError
from meaningless_tokens.intervals import bootstrap_mean_ci, bootstrap_ratio_ci
from meaningless_tokens.stage import INDEXING, StageContext, header, stage_context
from meaningless_tokens.store import provenance, put, put_json_attr, write_csv_atomic, write_h5, write_timing

# what the artifact's `definitions` attribute says, and `--help`: a constant, not the docstring, so that an edit of the
# docstring leaves the attribute as it is (the file's code hash, in provenance, still changes: the stage reruns)
DEFINITIONS = """stats@<model>: averaged attention statistics from `artifacts/attention/<model>.h5`.

Definitions (j: original token index, i.e. position in the `none` prompt; pos(j): its position in
a condition's prompt; T: that prompt's length; N: the number of original tokens):

  original_avg[c][l, h, j]  attention original token j receives, averaged over the queries of the
                            query set (`stats.query_set`), then over samples that have token j:
                              original: the original tokens at or after j  (N - j queries; default)
                              all:      every token at or after pos(j), span tokens included (T - pos(j))
                              last:     the last prompt token (1 query)
  full_avg[c][l, h, p]      attention position p of the whole prompt receives from all queries at or
                            after p, averaged over those T - p queries, then over samples
  span_mass[c][l, h]        attention mass each original query after the span gives to the span,
                            averaged over those queries, then over samples (0 for none); the rest,
                            1 - span_mass, goes to original tokens
  orig_mean[c][s, l, h]     mean of original_avg over original tokens j >= 1 (j >= 0 when
                            stats.exclude_first is false: position 0 is the attention sink)
  drop[c][l, h]             mean over samples of orig_mean[none] - orig_mean[c]; drop_pct is it in
                            percent of mean orig_mean[none]; both with seeded bootstrap 95% intervals
                            over samples (paired)
  head_rank[c][l]           heads of layer l ordered by drop, largest first
  layer_drop_pct[c][l]      the drop of the layer as a whole: heads averaged before the ratio, in percent of
                            none, with layer_drop_pct_ci (paired bootstrap over samples); the report's verdict
  first_layer_lead_pct[c]   layer_drop_pct of the first analysed layer minus the largest of the later ones,
                            with its paired bootstrap interval (absent with one layer)
  mful_gap_pct[mless][l]    layer_drop_pct of mless minus that of mful (the meaningless span's extra drop),
                            with its paired bootstrap interval (only when mful was run)

Also writes `artifacts/plots/original/<model>.csv` and `artifacts/plots/full/<model>.csv` (the
tables `dvc plots` draws): original_avg and full_avg of the top-ranked head (mless drop) of the
first analysed layer, columns position, none, mless, mful (`nan` where a condition was not run or its
prompts are shorter: plots leave those points out), layer, head (0-based), and the run's sidecar
`metrics/timing/stats-<model>.json` (seconds, git commit of the code).
"""

# the stage's outputs, and its input (src: extract's artifact) relocated with them: role -> artifact kind (store.PATHS)
OUTPUTS = {"src": "attention", "out": "stats", "original": "plots/original", "full": "plots/full",
           "timing": "timing/stats"}


def _per_sample(f, cond: str, query_set: str, n_orig: np.ndarray):
    """Per sample: position-wise averages over original tokens, over the full prompt, span mass."""
    g = f[cond]
    offsets, span = g["offsets"][()], g["span"][()]
    recv, recv_all, mass_span = g[QUERY_VECTOR[query_set]][()], g["recv_all"][()], g["mass_span"][()]
    original_pos = g["original_pos"][()]
    orig_off = np.concatenate([[0], np.cumsum(n_orig)])
    out_orig, out_full, out_span = [], [], []
    for s in range(len(offsets) - 1):
        a, b = offsets[s], offsets[s + 1]
        pos = original_pos[orig_off[s]:orig_off[s + 1]]
        if len(pos) != n_orig[s] or (len(pos) and pos.max() >= b - a):
            raise ArtifactError(f"{f.filename}: {cond}/original_pos does not fit sample {s}")
        o, full, m = sample_stats(recv[:, :, a:b], recv_all[:, :, a:b], mass_span[:, :, a:b], pos, span[s], query_set)
        out_orig.append(o)
        out_full.append(full)
        out_span.append(m)
    return out_orig, out_full, np.stack(out_span)


def _pad_mean(rows: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Mean over samples of [L, H, P_s] arrays of different lengths, and the count per position."""
    width = max(r.shape[-1] for r in rows)
    stacked = np.full((len(rows),) + rows[0].shape[:2] + (width,), np.nan)
    for k, r in enumerate(rows):
        stacked[k, :, :, :r.shape[-1]] = r
    count = np.sum(~np.isnan(stacked[:, 0, 0, :]), axis=0)
    return np.nanmean(stacked, axis=0), count


@dataclass
class Attention:
    """What stats reads of one attention artifact: per condition the per-sample vectors (`_per_sample`)."""
    conditions: list[str]
    layers: np.ndarray
    heads: np.ndarray
    n_orig: np.ndarray       # original (question) tokens per sample
    per: dict                # condition -> (original rows, full rows, span mass)
    spans: dict              # condition -> [sample, 2] span start and end
    provenance: dict         # the extraction's
    problem_index: np.ndarray


def run(params: Params, name: str, root: Path | None = None) -> Path:
    ctx = stage_context(params, "stats", name, root, **OUTPUTS)
    params, out = ctx.params, ctx.where["out"]
    cfg = params.stats
    att = load_attention(ctx, cfg.query_set)
    results = averages(att, cfg)

    write_artifact(out, params, name, att, results)
    for kind in ("original", "full"):
        write_plot_table(ctx.where[kind], kind, results, att.layers)
    write_timing(ctx.where["timing"], {"seconds": ctx.seconds()})
    print(f"{name}: statistics of {len(att.n_orig)} samples ({cfg.query_set} queries) -> {out}")
    return out


def load_attention(ctx: StageContext, query_set: str) -> Attention:
    """The attention artifact's vectors (`ctx.where["src"]`), refused (one line naming the file) when a dataset is
    missing or the file was made for another model, by another stage or with other params than today's."""
    need = [f"{c}/{v}" for c in ("none",) for v in VECTORS] + ["none/offsets", "none/original_pos"]
    src = ctx.where["src"]
    with ctx.read_h5("src", "attention", tuple(need)) as f:
        conditions = [str(c) for c in f.attrs["conditions"]]
        for c in conditions:
            missing = [f"{c}/{v}" for v in VECTORS + ("offsets", "original_pos", "span") if f"{c}/{v}" not in f]
            if missing:
                raise ArtifactError(f"{src}: missing datasets {missing} (truncated or written by another version?)")
        n_orig = np.diff(f["none/offsets"][()])
        return Attention(conditions, f.attrs["layers"], f.attrs["heads"], n_orig,
                         {c: _per_sample(f, c, query_set, n_orig) for c in conditions},
                         {c: f[c]["span"][()] for c in conditions}, json.loads(f.attrs["provenance"]),
                         f["problems/index"][()])


def averages(att: Attention, cfg) -> dict[str, dict[str, np.ndarray]]:
    """Per condition: the averaged attention vectors, the span's mass, and against `none` the drops with their
    seeded bootstrap intervals (DEFINITIONS)."""
    first = 1 if cfg.exclude_first else 0
    per, conditions = att.per, att.conditions
    results: dict[str, dict[str, np.ndarray]] = {}
    orig_mean = {c: np.stack([r[:, :, first:].mean(axis=2) for r in per[c][0]]) for c in conditions}  # [S, L, H]
    for c in conditions:
        orig_avg, orig_count = _pad_mean(per[c][0])
        full_avg, full_count = _pad_mean(per[c][1])
        span_mass = per[c][2]
        lo, hi = bootstrap_mean_ci(span_mass, cfg.seed, n_boot=cfg.n_boot)
        results[c] = {"original_avg": orig_avg, "original_count": orig_count, "full_avg": full_avg,
                      "full_count": full_count, "orig_mean": orig_mean[c], "span_mass": span_mass.mean(axis=0),
                      "span_mass_ci": np.stack([lo, hi]), "span_mass_per_sample": span_mass}
        if c != "none":
            delta = orig_mean["none"] - orig_mean[c]
            dlo, dhi = bootstrap_mean_ci(delta, cfg.seed, n_boot=cfg.n_boot)
            plo, phi = bootstrap_ratio_ci(delta, orig_mean["none"], cfg.seed, n_boot=cfg.n_boot)
            drop = delta.mean(axis=0)
            results[c] |= {"drop": drop, "drop_ci": np.stack([dlo, dhi]),
                           "drop_pct": 100 * drop / orig_mean["none"].mean(axis=0),
                           "drop_pct_ci": 100 * np.stack([plo, phi]),
                           "head_rank": np.argsort(-drop, axis=1, kind="stable").astype(np.int32)}
            results[c] |= layer_drops(orig_mean, c, cfg.seed, cfg.n_boot)
    return results


def write_artifact(out: Path, params: Params, name: str, att: Attention, results: dict) -> None:
    """artifacts/stats/<model>.h5: the averages per condition, with the extraction's provenance inside."""
    cfg = params.stats
    with write_h5(out) as f:
        header(f, OUTPUTS["out"], name, layers=att.layers, heads=att.heads, conditions=att.conditions,
               query_set=cfg.query_set, exclude_first=cfg.exclude_first, n_samples=len(att.n_orig), indexing=INDEXING,
               definitions=DEFINITIONS)
        put_json_attr(f, "provenance", {**provenance("stats"), "source": str(store.path(OUTPUTS["src"], name)),
                                        "extract_provenance": att.provenance,
                                        "params": store.stage_params(params, "stats", name)})
        put(f, "problem_index", att.problem_index)
        for c in att.conditions:
            g = f.create_group(c)
            starts = np.array(sorted({tuple(s) for s in att.spans[c]}), dtype=np.int32)
            g.attrs["span"] = starts[0] if len(starts) == 1 else np.array([-1, -1], dtype=np.int32)
            for k, v in results[c].items():
                put(g, k, v.astype(np.float64) if v.dtype.kind == "f" else v)


def layer_drops(orig_mean: dict[str, np.ndarray], c: str, seed: int, n_boot: int) -> dict[str, np.ndarray]:
    """The verdict's per-layer numbers for condition `c` (see DEFINITIONS), each with a paired
    bootstrap interval that resamples problems jointly for every condition."""
    base = orig_mean["none"].mean(axis=2)  # [S, L]: heads averaged per problem
    arms = {k: orig_mean[k].mean(axis=2) for k in ("none", c, "mful") if k in orig_mean}
    n, n_layers = base.shape

    def stats(idx):
        b = base[idx].mean(axis=-2)
        pct = {k: 100 * (b - a[idx].mean(axis=-2)) / b for k, a in arms.items()}
        out = [pct[c]]
        out.append(pct[c][..., :1] - pct[c][..., 1:].max(axis=-1, keepdims=True) if n_layers > 1 else pct[c][..., :0])
        out.append(pct[c] - pct["mful"] if c == "mless" and "mful" in pct else pct[c][..., :0])
        return np.concatenate(out, axis=-1)

    point = stats(np.arange(n))
    rng = np.random.default_rng(seed)
    boots = np.concatenate([stats(rng.integers(0, n, size=(min(1000, n_boot - b), n)))
                            for b in range(0, n_boot, 1000)])
    lo, hi = np.quantile(boots, [0.025, 0.975], axis=0)
    out = {"layer_drop_pct": point[:n_layers], "layer_drop_pct_ci": np.stack([lo, hi])[:, :n_layers]}
    k = n_layers
    if n_layers > 1:
        out |= {"first_layer_lead_pct": point[k:k + 1], "first_layer_lead_pct_ci": np.stack([lo, hi])[:, k:k + 1]}
        k += 1
    if len(point) > k:
        out |= {"mful_gap_pct": point[k:], "mful_gap_pct_ci": np.stack([lo, hi])[:, k:]}
    return out


def write_plot_table(path: Path, kind: str, results: dict, layers) -> None:
    """`kind`_avg of the top mless-drop head of the first layer, one row per position, for `dvc plots`.

    Fixed columns (position, none, mless, mful, layer, head), whatever conditions ran, so that the
    plot definitions in dvc.yaml hold for every model and experiment."""
    conditions = list(results)
    ref = "mless" if "mless" in results else conditions[-1]
    head = int(results[ref]["head_rank"][0, 0]) if "head_rank" in results[ref] else 0
    avg = {c: results[c][f"{kind}_avg"][0, head] for c in conditions}
    rows = []
    for p in range(max(len(v) for v in avg.values())):
        cells = ["nan" if c not in avg or p >= len(avg[c]) or np.isnan(avg[c][p]) else f"{avg[c][p]:.6g}"
                 for c in PROMPT_CONDITIONS]
        rows.append([p, *cells, int(layers[0]), head])
    write_csv_atomic(path, ["position", *PROMPT_CONDITIONS, "layer", "head"], rows)


def main(argv: list[str] | None = None) -> int:
    return cli.main("stats", DEFINITIONS, run, argv)


if __name__ == "__main__":
    sys.exit(main())

"""What the report shows, gathered from the data (stages/report.py renders and writes it): every chart's
explanation, the verdict and its power, the ARM settings, an example per model, the provenance table.

`content(params)` returns the templates' context and the verdict's summary; reusable without DVC (`params`: the
report stage's params view or the whole params; charts read from the project's reports/figures/).
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from meaningless_tokens import arm, charts, grading, store
from meaningless_tokens.results.context import load_context
from meaningless_tokens.config import Params
from meaningless_tokens.errors import ArtifactError
from meaningless_tokens.report import claims, paper, power, verdict
from meaningless_tokens.results.phrases import label
from meaningless_tokens.results.trace import Num, Sources, Text, artifact
from meaningless_tokens.store import FIGURES_DIR, read_h5, read_texts

VERDICT = store.path("verdict")  # git-tracked (cache: false): docs/results.md is rendered from it alone
# the report's own sections, which no chart kind declares (charts/<kind>.py's SECTION does the others): each
# placed before the section named, or last
OWN_SECTIONS = (("ARM", "Likelihood"), ("Examples", None))
# the sections the report templates lay out by hand (tables, intros); any other (a new chart's SECTION) is rendered
# alike after Likelihood: its verdict sentences, then its charts
LAID_OUT = ("attention", "meaningless-vs-meaningful-span", "span-length", "activation-shift", "arm", "likelihood",
            "accuracy", "examples")


def sections() -> dict[str, str]:
    """The report's sections in page order, anchor -> title: the chart kinds' (their SECTION, in the charts'
    order) with the report's own (OWN_SECTIONS) among them. Every claim's evidence lies in one of them."""
    titles = list(dict.fromkeys(k.SECTION for k in charts.KINDS))
    for title, before in OWN_SECTIONS:
        titles.insert(titles.index(before) if before else len(titles), title)
    out = {charts.anchor(t): t for t in titles}
    unknown = {c[3] for c in claims.CLAIMS} - set(out)
    if unknown:
        raise ValueError(f"report/claims.py: CLAIMS: no report section {sorted(unknown)} (charts/<kind>.py's SECTION)")
    return out


@dataclass
class Content:
    context: dict              # the report templates' context (less `fig_rel`: where the page lies decides it)
    summary: dict              # metrics/verdict.json
    n_charts: int              # the charts explained


def content(params: Params) -> Content:
    """The report's content from the project's data and charts (reports/figures/*.png, embedded)."""
    project = params.project_path(".")
    fig_dir = project / FIGURES_DIR
    ctx = load_context(params)
    names = ctx.names
    views = [ctx.view(n) for n in names]
    # per-model charts only for the models each kind shows (figures.charts.<kind>.models); a model with none left out
    per_model = [{"model": ctx.disp(n), "name": n,
                  "charts": [k.explain(ctx, n) for k in charts.PER_MODEL if n in ctx.chart_models(k.KIND)]}
                 for n in names]
    study = {k.KIND: k.explain(ctx, None) for k in charts.STUDY}
    for k in charts.STUDY:
        study[k.KIND].extra["unavailable"] = charts.unavailable(k, ctx)
    # the paper beside this run: each seed chart's claims with this run's numbers (meaningless_tokens/report/paper.py)
    for m in per_model:
        for chart, kind in zip(m["charts"], [k for k in charts.PER_MODEL if m["name"] in ctx.chart_models(k.KIND)]):
            chart.extra["paper"] = paper.claims(ctx, kind.KIND, m["name"])
            chart.extra["explore"] = explorer_links(ctx, kind.KIND, [m["name"]])
            chart.extra["kind"] = kind.KIND
    study["cross-model"].extra["explore"] = explorer_links(ctx, "cross-model", ctx.chart_models("cross-model"))
    per_model = [m for m in per_model if m["charts"]]
    for kind, chart in study.items():
        chart.extra["paper"] = paper.claims(ctx, kind, None)
    evaluated = [n for n in names if n in ctx.metrics]  # evaluate.models
    for row, n in zip(study["accuracy"].extra["table"], evaluated):
        row["seed"] = paper.accuracy_column(ctx, n)
        row["boxed"] = boxed_grades(project, n)
    for chart in [c for m in per_model for c in m["charts"]] + list(study.values()):
        if chart.extra.get("unavailable"):
            continue
        png = fig_dir / f"{chart.stem}.png"
        if not png.is_file():
            raise ArtifactError(f"{png}: missing chart (run: dvc repro figures)")
        chart.png = base64.b64encode(png.read_bytes()).decode("ascii")
    cross, acc = study["cross-model"], study["accuracy"]
    page = sections()
    rows = claims.claims(ctx)
    pw = power.power(ctx)
    summary = verdict.summary(ctx, rows, pw)
    context = {
        "verdict": rows, "rule": verdict.RULE, "rules": verdict.RULES, "holm": summary["holm"],
        "pooled": len(names) > 1, "power": power_lines(ctx, pw),
        "sections": [{"id": k, "title": t} for k, t in page.items() if k != "arm" or arm_section(ctx, evaluated)],
        "section": {k: {"sentences": [verdict.sentence(r, ctx.disp) for r in rows if r.section == k]} for k in page},
        # each section's charts across models, in the charts' order (its per-model charts: per_model)
        "section_charts": {k: [study[c.KIND] for c in charts.STUDY if charts.section(c) == k] for k in page},
        "extra_sections": [{"id": k, "title": t} for k, t in page.items() if k not in LAID_OUT],
        "arm_run": any(c.word != "not run" for r in rows if r.key.startswith("f") for c in r.cells.values()),
        "models": [{"name": v.name, "disp": v.disp, "heads": v.heads} for v in views],
        "query_set": sorted({ctx.stats[n]["query_set"] for n in names}),
        "layer": params.figures.layer,
        "instructions": instructions(project, names),
        "spans": mless_spans(ctx, names),
        "paper_models": [ctx.disp(n) for n in names if paper.accuracy_column(ctx, n)],
        "per_model": per_model, "cross": cross, "accuracy": acc, "table": acc.extra["table"],
        "sampling_chart": study["pass-at-k"],
        "glance": cross.observations + study["activations"].interpretation[1:2] + acc.extra["glance"]
        + acc.extra["arm_glance"] + paper.shape_notes(ctx) + study["likelihood"].observations[:1],
        "arm": arm_section(ctx, evaluated),
        "examples": [example(params, project, n, ctx.disp(n)) for n in evaluated],
        "provenance": [provenance_rows(ctx.src, project, n, ctx.disp(n), n in ctx.metrics) for n in names],
        "names": names,
        "span_counts": sorted({c for n in names for c in ctx.sweep[n]["counts"]}),
    }
    return Content(context, summary, sum(len(m["charts"]) for m in per_model) + len(study))


# ---- examples and provenance -------------------------------------------------------------------------

def example(params: Params, root: Path, name: str, disp: str, limit: int = 700) -> dict:
    """One problem where the conditions' grades differ (else the first), with each condition's output."""
    from meaningless_tokens.dataset import dataset_spec, load_problems

    path = root / store.path("eval", name)
    with read_h5(path, "eval", ("problems/index", "problems/answer")) as f:
        conds = [str(c) for c in f.attrs["conditions"]]
        index = f["problems/index"][()]
        answers = read_texts(f["problems/answer"])
        correct = np.stack([f[c]["correct"][()] for c in conds])
        k = next((k for k in range(len(index)) if correct[:, k].min() != correct[:, k].max()), 0)
        rows = []
        for c in conds:
            out = read_texts(f[c]["output"])[k]
            rows.append({"condition": c, "correct": bool(f[c]["correct"][k]),
                         "extracted": read_texts(f[c]["extracted"])[k],
                         "n_tokens": int(f[c]["n_tokens"][k]), "stop": read_texts(f[c]["stop"])[k],
                         "output": out if len(out) <= limit else out[:limit] + " […]"})
    problems, _ = load_problems(dataset_spec(params.dataset, params.file))
    problem = next(p for p in problems if p.index == int(index[k]))  # index: the file's row (a filter skips rows)
    about = ", ".join(([problem.subject] if problem.subject else []) +
                      ([f"level {problem.level}"] if problem.level is not None else []))
    return {"model": disp, "index": int(index[k]), "about": about,
            "problem": problem.problem, "answer": answers[k], "rows": rows,
            "differs": bool(correct[:, k].min() != correct[:, k].max())}


def provenance_rows(src: Sources, root: Path, name: str, disp: str, evaluated: bool = True) -> dict:
    manifest = src.json(artifact("manifest", name))
    with read_h5(root / store.path("stats", name), "stats") as f:
        sp = json.loads(f.attrs["provenance"])
    ep = {}
    if evaluated:
        with read_h5(root / store.path("eval", name), "eval") as f:
            ep = json.loads(f.attrs["provenance"])
    xp = sp["extract_provenance"]
    source = manifest.get("source", {})
    timing, commits, machine = {}, {}, ""
    for stage, key in (("extract", "seconds"), ("evaluate", "seconds_this_run"), ("stats", None)):
        f = artifact(f"timing/{stage}", name)  # the run's sidecar: run time and the git commit that ran
        sidecar = src.json(f) if (root / f).is_file() else {}
        if key:
            timing[stage] = src.js(f, key, fmt=".0f") if sidecar else None
        commits[stage] = str(sidecar.get("git_commit", "?")) + ("-dirty" if sidecar.get("git_dirty") else "")
        if stage == "extract":  # the machine it ran on, where the sidecar records it
            machine = ", ".join(f"{k.replace('_', ' ')} {sidecar[k]}" for k in store.MACHINE_FACTS if sidecar.get(k) is not None)
    return {
        "model": disp, "name": name,
        "source": source.get("kind", "?") + ": " + ", ".join(
            str(x) for x in (source.get("packages") or [source.get("repo_id") or source.get("path") or ""]))
        + (f" @ {source['resolved_commit']}" if source.get("resolved_commit") else ""),  # hf: the commit resolved
        "source_sha256": source.get("gguf_sha256") or source.get("sha256") or "",
        "weights_sha256": manifest.get("weights_sha256", ""),
        "dataset_sha256": xp.get("dataset_sha256", ""),
        "dataset_same": not ep or xp.get("dataset_sha256") == ep.get("dataset_sha256"),
        "commits": commits,
        "libraries": ", ".join(f"{k} {v}" for k, v in sorted((ep or xp).get("libraries", {}).items())),
        "timing": timing, "machine": machine,
        "params": json.dumps({"extract": xp.get("params", {}), "evaluate": ep.get("params", {}).get("evaluate"),
                              "generation": ep.get("generation"), "stats": sp.get("params", {}).get("stats")},
                             indent=1, sort_keys=True, ensure_ascii=False),
    }


def boxed_grades(root: Path, name: str) -> dict[str, str]:
    """Per condition, the paper's rule on the outputs that wrote a complete box ("67 % of 3 boxed"), or "n/a"
    with the count when none did: on a boxless output the rule grades the instruction's own box."""
    out = {}
    with read_h5(root / store.path("eval", name), "eval") as f:
        for c in [str(c) for c in f.attrs["conditions"]]:
            texts = list(read_texts(f[c]["output"]))
            boxed = np.array([grading.has_complete_box(t) for t in texts], dtype=bool)
            right = f[c]["paper_correct"][()].astype(bool)
            k = int(boxed.sum())
            out[c] = (f"{100 * right[boxed].mean():.0f} % of {k} boxed" if k else
                      f"n/a (no box in {len(texts)} of {len(texts)})")
    return out


def instructions(root: Path, names: list[str]) -> list[dict]:
    """The instruction each model's extraction used (from its attention file's provenance, via the statistics
    file), and whether it is the paper code's literal text with doubled braces (`\\boxed{{}}`)."""
    seen = {}
    for name in names:
        with read_h5(root / store.path("stats", name), "stats") as f:
            text = json.loads(f.attrs["provenance"])["extract_provenance"].get("params", {}).get(
                "prompt", {}).get("instruction", "?")
        seen.setdefault(text, []).append(name)
    return [{"text": t, "literal": "{{}}" in t, "models": ms, "boxless": boxless(t)} for t, ms in seen.items()]


def mless_spans(ctx, names: list[str]) -> list[dict]:
    """The meaningless span each model's extraction inserted (read from its statistics file's provenance), one
    entry per distinct span with the models that used it."""
    seen = {}
    for name in names:
        span = ctx.stats[name]["mless_span"]
        seen.setdefault((span["token"], span["count"], span["placement"]), []).append(name)
    return [{"token": t, "count": c, "before": p == "before_instruction", "models": ms}
            for (t, c, p), ms in seen.items()]


def boxless(instruction: str) -> str:
    """What an output without a box scores under the paper's rule on prompt + output with this instruction."""
    pred = grading.paper_box(instruction)
    if pred is None:
        return "the instruction holds no complete box: such an output has no prediction and counts as wrong"
    if pred == "":
        return "the instruction's empty box gives the empty prediction, a substring of every answer: such an output counts as right"
    return (f"the instruction's box gives the prediction {pred}, right only for an answer that contains it "
            "(none in MATH-500 or AIME): such an output counts as wrong")


def arm_section(ctx, evaluated: list[str]) -> dict | None:
    """The ARM settings each stage ran with (the `arm` provenance of the evaluation and likelihood files), the
    tuning of arm_tuning.models (stages/arm_tuning.py) and the differences from the paper's code; None when no
    stage ran `arm`."""
    rows = []
    for name in evaluated:
        with read_h5(ctx.root / store.path("eval", name), "eval") as f:
            prov = json.loads(f.attrs["provenance"]).get("arm")
        if prov:
            rows.append({"model": ctx.disp(name), "stage": "evaluate", "file": store.path("eval", name).as_posix(), **prov})
    for name, lk in ctx.likelihood.items():
        if lk["arm"]:
            rows.append({"model": ctx.disp(name), "stage": "likelihood", "file": store.path("likelihood", name).as_posix(),
                         **{k: v for k, v in lk["arm"].items() if k != "differences_from_paper"}})
    tuning = [{"model": ctx.disp(n), "file": store.path("arm_tuning", n).as_posix(),
               "label": {k: claims.setting(t["variant"], t[k]["c"], t[k]["percentage"])
                         for k in ("chosen", "own", "best_in_sample")},
               "grid_text": "; ".join(claims.setting(t["variant"], g["c"], g["percentage"]) for g in t["grid"]), **t}
              for n, t in ctx.arm_tuning.items()]
    return {"models": rows, "tuning": tuning, "differences": arm.DIFFERENCES} if rows or tuning else None


def explorer_links(ctx, kind: str, names: list[str]) -> list[dict]:
    """Per model, the explorer's view (reports/explorer.html, stages/explorer.py) of the first head and layer
    chart `kind` shows, under mless: a single prompt where the chart shows averages."""
    links = []
    for n in names:
        v = ctx.view(n, kind)
        links.append({"model": ctx.disp(n), "label": label(v.layer, v.heads[0]),
                      "href": f"explorer.html#model={n}&layer={v.layer + 1}&head={v.heads[0] + 1}&cond=mless"})
    return links


def power_lines(ctx, power: dict) -> list[Text]:
    """Per outcome, the smallest effect this run could detect beside the paper's, and what detecting it takes."""
    lines = []
    src = VERDICT.as_posix()

    def num(key: str, fmt: str, scale: float = 1.0) -> Num:  # a number of metrics/verdict.json (written beside the report)
        value = {"power": power}
        for k in key.split("."):
            value = value[k]
        return Num(float(value) * scale, src, key, "value", scale, fmt)

    def hours(key: str) -> list:  # a duration of metrics/verdict.json (in hours there) in the unit that reads
        scale, fmt, unit = duration_unit(num(key, "g").value)
        return [num(key, fmt, scale), f" {unit}"]

    gains = ", ".join(f"{k} +{v:g}" for k, v in power["paper_gains"].items())
    gain = f"+{power['paper_gain_points']:g} points"  # the paper's smallest MATH-500 gain (report/power.py)
    for n, a in power["accuracy"].items():
        key = f"power.accuracy.{n}"
        head = [f"Accuracy, {ctx.disp(n)}: with ", num(f"{key}.n", "d"), " problems "]
        if a["mde_points"] is None:
            lines.append(Text(*head, "no problem changed its grade between none and mless, so the paired differences "
                              "have no spread and the run cannot estimate the smallest effect it could detect; the "
                              f"paper's gains are {gains} points (MATH-500, mless − none)."))
            continue
        parts = head + ["the smallest mless − none gain detectable at 80 % power is ",
                        num(f"{key}.mde_points", ".1f"), f" points; the paper reports {gains}. "]
        need = a["needed_for_paper_gain"]
        if need and need <= a["benchmark_limit"]:
            parts += [f"Detecting {gain} would take ", num(f"{key}.needed_for_paper_gain", "d"),
                      f" problems: dvc exp run -S evaluate.n_samples={need}"]
            if a["hours_needed"] is not None:
                parts += [", about ", *hours(f"{key}.hours_needed"),
                          " of evaluation at this run's speed (metrics/timing)"]
            parts.append(".")
        elif need:
            limit = a["benchmark_limit"]
            parts += [f"Detecting {gain} would take ", num(f"{key}.needed_for_paper_gain", "d"),
                      f" problems at this spread, more than MATH-500's {limit}: even dvc exp run -S "
                      f"evaluate.n_samples=null (all {limit}"]
            if a["hours_needed"] is not None:
                parts += [", about ", *hours(f"{key}.hours_needed"),
                          " for the problems needed at this run's speed"]
            parts.append(") cannot.")
        parts.append(" An inconclusive accuracy verdict here means too few problems, not no effect.")
        lines.append(Text(*parts))
    for n, lk in power["likelihood"].items():
        key = f"power.likelihood.{n}"
        if lk["mde_nats_per_token"] is None:
            continue
        parts = [f"Likelihood, {ctx.disp(n)}: with ", num(f"{key}.n", "d"), " problems the smallest "
                 "mless − none change of the solution's log-prob detectable at 80 % power is ",
                 num(f"{key}.mde_nats_per_token", ".2g"), " nats/token (the paper reports no "
                 "likelihood effect to set beside it); all 500 problems would bring it to ",
                 num(f"{key}.mde_at_500", ".2g")]
        if lk["hours_at_500"] is not None:
            parts += [" at about ", *hours(f"{key}.hours_at_500")]
        parts.append(" (dvc exp run -S likelihood.n_samples=null).")
        lines.append(Text(*parts))
    return lines


def duration_unit(hours: float) -> tuple[float, str, str]:
    """(scale from hours, format, unit) of a duration as a reader says it: minutes below an hour, hours with two
    figures above."""
    return (60, ".0f", "minutes") if hours < 1 else (1.0, ".2g", "hours")

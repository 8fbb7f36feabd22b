"""The artifacts the charts read, each loaded into plain dicts of arrays (`Context` loads them once per stage run)."""

from __future__ import annotations

import json
from pathlib import Path

from meaningless_tokens.errors import ArtifactError
from meaningless_tokens.store import read_h5, read_metrics


def load_stats(path: Path) -> dict:
    need = ("none/original_avg", "none/full_avg", "mless/head_rank")
    with read_h5(path, "stats", need) as f:
        conds = [str(c) for c in f.attrs["conditions"]]
        data = {"layers": [int(x) for x in f.attrs["layers"]], "heads": [int(x) for x in f.attrs["heads"]],
                "conditions": conds, "query_set": str(f.attrs["query_set"]), "span": {},
                # the problems its intervals are over (the verdict's MDE); None in a file written before it was kept
                "n_samples": int(f.attrs["n_samples"]) if "n_samples" in f.attrs else None,
                "mless_span": mless_span(path, f.attrs["provenance"])}
        for c in conds:
            data[c] = {k: f[c][k][()] for k in f[c]}
            data["span"][c] = tuple(int(x) for x in f[c].attrs["span"])
    return data


def mless_span(path: Path, provenance: str) -> dict:
    """The meaningless span the extraction inserted (its params' prompt.mless: token, count, placement), as the
    statistics file's provenance carries it: the report states it from there, never from a template."""
    try:
        span = json.loads(provenance)["extract_provenance"]["params"]["prompt"]["mless"]
        return {"token": str(span["token"]), "count": int(span["count"]), "placement": str(span["placement"])}
    except (KeyError, TypeError, ValueError):
        raise ArtifactError(f"{path}: provenance: extract_provenance.params.prompt.mless: missing or incomplete "
                            "(written by another version? run: dvc repro)") from None


def load_metrics(path: Path, name: str) -> dict:
    """Model `name`'s evaluation metrics (metrics/accuracy/<name>.json at `path`), refused when written by another
    stage or for another model, or holding a NaN (store.read_metrics)."""
    if not path.is_file():
        raise ArtifactError(f"{path}: missing evaluation metrics (run: dvc repro evaluate@{name})")
    return read_metrics(path)


def load_likelihood(file: Path) -> dict:
    """A likelihood file: problems, conditions, per contrast and continuation the per-problem differences and
    the summaries, and the seed / n_boot it was made with."""
    with read_h5(file, "likelihood", ("problems/index", "none/solution/mean")) as f:
        conds = [str(c) for c in f.attrs["conditions"]]
        prov = json.loads(f.attrs["provenance"])
        data = {"conditions": conds, "index": f["problems/index"][()], "level": f["problems/level"][()],
                "n": int(f.attrs["n_samples"]), "contrasts": {}, "params": prov["params"]["likelihood"],
                "arm": prov.get("arm"),  # the ARM setting and its origin, when arm ran
                "tokens": float(f["none/solution/tokens"][()].mean())}
        for c in conds:
            if c == "none":
                continue
            data["contrasts"][f"{c}-none"] = {k: {ds: g[ds][()] for ds in g} for k in ("solution", "answer")
                                              for g in [f[f"contrasts/{c}-none/{k}"]]}
    return data


def load_arm_tuning(path: Path) -> dict:
    """An ARM tuning file's summary (stages/arm_tuning.py): the grid, the choice and the gains."""
    with read_h5(path, "arm_tuning", ("grid", "out_of_sample/mean")) as f:
        return json.loads(f.attrs["summary"])


def load_activations(path: Path) -> dict:
    """An activations file (stages/activations.py) as nested dicts of arrays."""
    with read_h5(path, "activations", ("bin_edges", "none/hist_original", "none/original/l1_mean")) as f:
        conds = [str(c) for c in f.attrs["conditions"]]
        data = {"layers": [int(x) for x in f.attrs["layers"]], "conditions": conds,
                "n_samples": int(f.attrs["n_samples"]), "bin_edges": f["bin_edges"][()]}
        for c in conds:
            g = f[c]
            data[c] = {k: (g[k][()] if hasattr(g[k], "shape") else {m: g[k][m][()] for m in g[k]}) for k in g}
    return data


def load_sweep(path: Path) -> dict:
    """A sweep file (stages/sweep.py): per token group its per-count arrays, plus the grid."""
    with read_h5(path, "sweep", ("token_0/drop_heads_pct", "token_0/span_mass_heads")) as f:
        data = {"layer": int(f.attrs["layer"]), "counts": [int(c) for c in f.attrs["counts"]],
                "reference_count": int(f.attrs["reference_count"]), "n_samples": int(f.attrs["n_samples"]),
                "accuracy_samples": int(f.attrs["accuracy_samples"]),
                "likelihood_samples": int(f.attrs.get("likelihood_samples", 0)), "tokens": [],
                "correct_none": f["correct_none"][()] if "correct_none" in f else None}
        for k in range(len(f.attrs["tokens"])):
            g = f[f"token_{k}"]
            data["tokens"].append({"token": str(g.attrs["token"]), "group": f"token_{k}",
                                   **{ds: g[ds][()] for ds in g}})
    return data


def load_datasets(path: Path, kind: str) -> dict:
    """Any measure's file read whole: every dataset by its path ("none/drop") and the root attributes under "@attrs".
    What a new measure's chart reads before it needs a loader of its own."""
    import h5py

    with read_h5(path, kind) as f:
        data = {"@attrs": dict(f.attrs)}
        f.visititems(lambda key, obj: data.__setitem__(key, obj[()]) if isinstance(obj, h5py.Dataset) else None)
    return data

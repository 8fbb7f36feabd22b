"""The explorer's data (stages/explorer.py writes the page; its docstring states the encoding): per model the full
attention matrices of extract's showcase prompts, encoded one byte per weight (`encode`, `decode`, `quant_bound`),
their tokens decoded with the model's tokenizer (`Tokens`), the layer-0 MLP activation strips of activations'
showcase, and the heads the report's charts show.

`explore(params)` returns the page's data, `(entries, blobs)`; reusable without DVC (`params`: the explorer stage's
params view or the whole params).
"""

from __future__ import annotations

import base64
import json
import zlib
from pathlib import Path

import numpy as np

from meaningless_tokens import models, store
from meaningless_tokens.results.context import Context
from meaningless_tokens.results.load import load_stats
from meaningless_tokens.config import ONE_LAYER_KINDS, Params, figure_models
from meaningless_tokens.errors import ArtifactError
from meaningless_tokens.store import read_h5, read_texts

LEVELS = 255  # one byte per weight
# the chart kinds that show heads, and what the page calls them
HEAD_KINDS = {"layer-sweep": "layer sweep", "heads": "heads", "conditions": "conditions", "cross-model": "cross-model"}


def quant_bound(w: np.ndarray, s: np.ndarray) -> np.ndarray:
    """The largest |shown - stored| of a weight w in a row of maximum s (the square-root code above)."""
    return (2 * np.sqrt(w * s) + s / (2 * LEVELS)) / (2 * LEVELS)


def encode(probs: np.ndarray) -> bytes:
    """[L, H, T, T] attention -> zlib([L*H*T row maxima, float32 LE] + [L*H * T(T+1)/2 bytes, rows 0..T-1])."""
    probs = np.asarray(probs, dtype=np.float64)
    L, H, T, _ = probs.shape
    tril = np.tril_indices(T)
    rows = probs[:, :, tril[0], tril[1]]                     # [L, H, T(T+1)/2], row by row
    scale = probs.max(axis=3)                                # [L, H, T]; the diagonal is in every row
    s = scale[:, :, tril[0]]
    q = np.rint(LEVELS * np.sqrt(np.divide(np.clip(rows, 0, None), s, out=np.zeros_like(rows), where=s > 0)))
    payload = scale.astype("<f4").tobytes() + np.clip(q, 0, LEVELS).astype(np.uint8).tobytes()
    return zlib.compress(payload, 9)


def decode(blob: bytes, L: int, H: int, T: int) -> np.ndarray:
    """The weights the page shows, [L, H, T, T] (the inverse of `encode`, as the page's script computes it)."""
    raw = zlib.decompress(blob)
    n = L * H * T
    scale = np.frombuffer(raw[: 4 * n], dtype="<f4").reshape(L, H, T).astype(np.float64)
    q = np.frombuffer(raw[4 * n:], dtype=np.uint8).reshape(L, H, -1).astype(np.float64)
    tril = np.tril_indices(T)
    out = np.zeros((L, H, T, T))
    out[:, :, tril[0], tril[1]] = scale[:, :, tril[0]] * (q / LEVELS) ** 2
    return out


def _str(x) -> str:
    return x.decode() if isinstance(x, bytes) else str(x)


def _round(a, digits: int = 5) -> list[float]:
    return [float(f"{v:.{digits}g}") for v in np.asarray(a, dtype=np.float64)]


class Tokens:
    """Decodes token ids one by one with a model's tokenizer, read without converting or loading the model
    (`models.token_decoder`), checked against the vocabulary size the extraction recorded."""

    def __init__(self, params: Params, name: str, vocab_size: int):
        self.decode, size, where = models.token_decoder(models.ModelEntry.of(params, name), vocab_size)
        if size != vocab_size:
            raise ArtifactError(f"{store.path('attention', name)}: provenance tokenizer.vocab_size {vocab_size} != "
                                f"the tokenizer's {size} in {where} (rerun: dvc repro extract@{name})")

    def strings(self, ids) -> list[str]:
        """Each token as the text it stands for (special tokens by name)."""
        return [self.decode([i]) for i in ids]


def marked_heads(params: Params, name: str, stats: dict) -> dict[str, dict[str, list[str]]]:
    """{layer: {head: [chart kinds]}} (0-based, as strings) of the heads the report's charts show."""
    ctx = Context(params, {name: stats}, {})
    marks: dict[str, dict[str, list[str]]] = {}
    for kind, label in HEAD_KINDS.items():
        if name not in ctx.chart_models(kind):
            continue
        view = ctx.view(name, kind)
        for layer in view.layers[:1] if kind in ONE_LAYER_KINDS else view.layers:
            for head in view.heads:
                marks.setdefault(str(layer), {}).setdefault(str(head), []).append(label)
    return marks


def activation_strips(path: Path, index: int, conds: dict, params: Params | None = None) -> dict | None:
    """Per token of problem `index`'s prompts, under each condition of the activations file: the share of
    near-zero |a| (the paper's robust radius over the prompt's original tokens, and the fixed one) and the
    mean |a| (L1), for its first layer; None when the problem is not in its showcase."""
    with read_h5(path, "activations", ("showcase",), params=params) as f:
        keys = [k for k in f["showcase"] if int(f["showcase"][k].attrs["problem_index"]) == index]
        if not keys:
            return None
        prov = json.loads(f.attrs["provenance"])["params"]["activations"]
        layer = int(f.attrs["layers"][0])
        g = f["showcase"][keys[0]]
        out = {"layer": layer, "eps": prov["eps"], "mad_c": prov["mad_c"], "conds": {}}
        for c in [_str(c) for c in f.attrs["conditions"]]:
            if c not in g:
                continue
            a = np.abs(g[c]["a"][0].astype(np.float32))                 # [token, channel], the first layer
            ref = conds.get(c) or conds["none"]                           # arm: the none prompt
            if a.shape[0] != len(ref["tokens"]):
                raise ArtifactError(f"{path}: showcase/{keys[0]}/{c}/a has {a.shape[0]} tokens, the attention file's "
                                    f"prompt {len(ref['tokens'])}; rerun both stages (dvc repro)")
            orig = a[np.array(ref["original"])].astype(np.float64).ravel()
            med = np.median(orig)
            eps_r = 1.4826 * float(np.median(np.abs(orig - med))) * prov["mad_c"]
            out["conds"][c] = {"nz_robust": _round((a < np.float32(eps_r)).mean(axis=1)),
                               "nz_fixed": _round((a < np.float32(prov["eps"])).mean(axis=1)),
                               "l1": _round(a.astype(np.float64).mean(axis=1)), "eps_robust": float(f"{eps_r:.5g}")}
    return out


def collect(params: Params, name: str, blobs: list[str]) -> dict:
    """One model's entry of the page; appends its encoded matrices to `blobs` (their ids are indices)."""
    root = params.project_path(".")
    path = root / store.path("attention", name)
    with read_h5(path, "attention", ("showcase", "none/offsets", "problems/index"), params=params) as f:
        conditions = [_str(c) for c in f.attrs["conditions"]]
        layers, heads = [int(x) for x in f.attrs["layers"]], [int(x) for x in f.attrs["heads"]]
        prov = json.loads(f.attrs["provenance"])
        tok = Tokens(params, name, int(prov["tokenizer"]["vocab_size"]))
        offsets = {c: f[c]["offsets"][()] for c in conditions}
        index, subjects = f["problems/index"][()], read_texts(f["problems/subject"])
        prompts = []
        for key in sorted(f["showcase"]):
            k = int(key)
            g = f["showcase"][key]
            n0, n1 = offsets["none"][k], offsets["none"][k + 1]
            conds = {}
            for c in conditions:
                if c not in g:
                    continue
                ids = f[c]["input_ids"][offsets[c][k]:offsets[c][k + 1]]
                probs = g[c][()]
                if probs.shape != (len(layers), len(heads), len(ids), len(ids)):
                    raise ArtifactError(f"{path}: showcase/{key}/{c}: shape {probs.shape}, expected "
                                        f"{(len(layers), len(heads), len(ids), len(ids))}")
                blobs.append(base64.b64encode(encode(probs)).decode("ascii"))
                conds[c] = {"tokens": tok.strings(ids), "span": [int(x) for x in f[c]["span"][k]],
                            "original": [int(x) for x in f[c]["original_pos"][n0:n1]], "blob": len(blobs) - 1}
            problem = int(g.attrs["problem_index"])
            if problem != int(index[k]):
                raise ArtifactError(f"{path}: showcase/{key}: problem_index {problem} != problems/index[{k}] {index[k]}")
            prompts.append({"key": key, "index": problem, "level": int(f["problems/level"][k]),
                            "subject": subjects[k],
                            "text": tok.decode(f["none"]["input_ids"][n0:n1]), "conds": conds})
    act_path = root / store.path("activations", name)
    for pr in prompts:
        pr["act"] = activation_strips(act_path, pr["index"], pr["conds"], params) if act_path.is_file() else None
    stats = root / store.path("stats", name)
    marks = marked_heads(params, name, load_stats(stats)) if name in figure_models(params) else {}
    return {"name": name, "disp": params.models[name].display_name, "layers": layers, "heads": heads,
            "conditions": conditions, "marks": marks, "prompts": prompts,
            "sources": [store.path("attention", name).as_posix()] + ([store.path("activations", name).as_posix()]
                                                            if any(pr["act"] for pr in prompts) else [])}


def explore(params: Params) -> tuple[list[dict], list[str]]:
    """(one entry per model with a showcase prompt, the encoded matrices base64: an entry's `blob` is an index)."""
    blobs: list[str] = []
    # a model with no showcase prompt (extract.showcase: 0) has nothing to show; the page says so when none has any
    entries = [e for e in (collect(params, name, blobs) for name in params.models) if e["prompts"]]
    return entries, blobs

"""`mless add-model`: a causal LM added to the study in one command.

    mless add-model NAME --local DIR | --hf ORG/NAME --revision COMMIT | --gguf FILE [--outcomes]
                    [--display-name TEXT] [--trust-remote-code] [--params params.yaml]

Before anything is written the model is inspected as the stages will use it (meaningless_tokens/models: the
source resolved, a GGUF converted into the cache, the config read, the attention probe run on its first layers):
architecture and family, layers, query and key-value heads, whether layer 0's MLP is gated (ARM edits its
act_fn(gate_proj(x))), whether the tokenizer has a chat template, the parameter count. A model the study cannot
use is refused in one line that says why, and params.yaml is left as it was.

Then its complete `models.<NAME>` entry (every key dvc.yaml lists) is appended to params.yaml's `models` (the
file's comments kept), with `--outcomes` the name is added to `evaluate.models` and `likelihood.models` (a model
without a gated MLP only to `evaluate.models`: the likelihood scores `arm`), and the command prints what to run and
what the run will cost on this machine, scaled by parameter count from the throughput the last run measured
(metrics/timing/).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import yaml

from meaningless_tokens.config import PARAMS_FILE, Params, dvc_model_defaults, load_params
from meaningless_tokens.errors import ConfigError, StageError

TIMED = ("extract", "activations", "sweep", "evaluate", "likelihood")  # the stages whose time grows with the model


def as_given(path: str, params_file: Path) -> str:
    """A path as params.yaml holds it: relative to the project (the params file's folder) when inside it."""
    p, root = Path(path).resolve(), params_file.resolve().parent
    return p.relative_to(root).as_posix() if p.is_relative_to(root) else str(p)


def source_of(args) -> dict:
    if args.local:
        return {"kind": "local_dir", "path": as_given(args.local, Path(args.params))}
    if args.hf:
        if not args.revision:
            raise ConfigError("--hf needs --revision COMMIT (a full 40-hex commit: a branch or tag moves, and the "
                              "run would not be reproducible)")
        return {"kind": "hf", "repo_id": args.hf, "revision": args.revision}
    from meaningless_tokens.models.cache import sha256_file

    path = Path(args.gguf)
    if not path.is_file():
        raise ConfigError(f"{path}: no such GGUF file")
    return {"kind": "gguf_file", "path": as_given(args.gguf, Path(args.params)), "sha256": sha256_file(path)}


def with_model(params: Params, name: str, entry: dict) -> Params:
    """`params` with model `name` added (validated by the schema; nothing written)."""
    raw = params.model_dump(mode="json")
    raw["models"][name] = entry
    try:
        out = Params.model_validate(raw)
    except Exception as e:  # noqa: BLE001 - a pydantic error about the new entry
        raise ConfigError(f"{params.file}: models.{name}: {' '.join(str(e).split())[:400]}") from None
    out._file = params.file
    return out


def parameter_count(path: Path) -> int:
    """Parameters held in a model folder's safetensors (from their headers; no tensor is read)."""
    total = 0
    for f in sorted(path.glob("*.safetensors")):
        with f.open("rb") as fh:
            n = int.from_bytes(fh.read(8), "little")
            header = json.loads(fh.read(n))
        for k, v in header.items():
            if k != "__metadata__":
                count = 1
                for d in v["shape"]:
                    count *= d
                total += count
    return total


def gated_mlp(prepared, trust_remote_code: bool) -> bool:
    """Whether layer 0's MLP has its own gate_proj, up_proj, down_proj and act_fn (what ARM edits); builds layer 0
    only."""
    import torch

    from meaningless_tokens.models.partial import from_pretrained

    model = from_pretrained(prepared.name, prepared.path, torch.float32, "eager", trust_remote_code, 1)
    mlp = getattr(model.get_decoder().layers[0], "mlp", None)
    return all(hasattr(mlp, k) for k in ("gate_proj", "up_proj", "down_proj", "act_fn"))


def inspect(params: Params, name: str, entry: dict) -> dict:
    """The model as the stages will see it; raises (one line) where the study cannot use it."""
    from meaningless_tokens.models import prepare

    candidate = with_model(params, name, entry)
    prepared = prepare(candidate, name)
    facts = dict(prepared.facts)
    facts["parameters"] = parameter_count(prepared.path)
    facts["gated_mlp"] = gated_mlp(prepared, entry["trust_remote_code"])
    facts["path"] = str(prepared.path)
    return facts


def entry_text(name: str, entry: dict) -> str:
    """The YAML of one `models` entry, as params.yaml writes its models (two-space indent, flow-style lists)."""
    def flow(v):  # JSON is YAML: scalars quoted as needed, lists and mappings in flow style
        if isinstance(v, str) and re.fullmatch(r"[A-Za-z0-9][\w.+/-]*", v) and v not in ("null", "true", "false"):
            return v
        return json.dumps(v, ensure_ascii=False)

    lines = [f"  {name}:"]
    for k in ("display_name", "template", "family"):
        lines.append(f"    {k}: {flow(entry[k])}")
    lines.append("    source:")
    lines += [f"      {k}: {flow(v)}" for k, v in entry["source"].items()]
    for k in ("layers", "heads", "trust_remote_code"):
        lines.append(f"    {k}: {flow(entry[k])}")
    lines.append("    arm: {c: null, percentage: null, k: null, pmin: null, pmax: null}   # null: the paper's value "
                 "for this model, else the variant's fallback")
    return "\n".join(lines) + "\n"


def add_to_models(text: str, block: str) -> str:
    """params.yaml's text with `block` appended at the end of its top-level `models:` mapping."""
    lines = text.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if re.match(r"^models:\s*(#.*)?$", line)), None)
    if start is None:
        raise ConfigError("no top-level `models:` mapping to add the model to")
    end = next((i for i in range(start + 1, len(lines)) if re.match(r"^\S", lines[i])), len(lines))
    while end > start + 1 and not lines[end - 1].strip():
        end -= 1
    if lines[end - 1] and not lines[end - 1].endswith("\n"):
        lines[end - 1] += "\n"
    return "".join(lines[:end] + [block] + lines[end:])


def add_to_list(text: str, section: str, name: str) -> str:
    """`name` appended to the `models` list of top-level `section`: flow style (`models: [a, b]`) or block style
    (`models:` then `- a` lines, as yaml.safe_dump writes it)."""
    lines = text.splitlines(keepends=True)
    start = next((i for i, line in enumerate(lines) if re.match(rf"^{section}:", line)), None)
    if start is None:
        raise ConfigError(f"no top-level `{section}:` section")
    for i in range(start + 1, len(lines)):
        if re.match(r"^\S", lines[i]):
            break
        m = re.match(r"^(  models:\s*\[)([^\]]*)(\].*)$", lines[i], re.S)
        if m:
            items = [x.strip() for x in m[2].split(",") if x.strip()]
            if name not in items:
                items.append(name)
            lines[i] = f"{m[1]}{', '.join(items)}{m[3]}"
            return "".join(lines)
        if re.match(r"^  models:\s*(#.*)?$", lines[i]):
            items, last = [], i
            for j in range(i + 1, len(lines)):
                item = re.match(r"^(\s+)- (\S+)\s*(#.*)?$", lines[j])
                if not item or len(item[1]) < 2:
                    break
                items.append(item[2])
                last, indent = j, item[1]
            if items:
                if name not in items:
                    lines.insert(last + 1, f"{indent}- {name}\n")
                return "".join(lines)
    raise ConfigError(f"{section}.models: not a one-line list [a, b] that this command can extend; add '{name}' by hand")


def estimate(root: Path, params: Params, parameters: int, outcomes: bool, likelihood: bool) -> list[tuple[str, float, str]]:
    """(stage, seconds, from which run) per stage of the new model: the last run's time of the shipped model
    closest in size, scaled by the parameter ratio. Empty when the last run left no timing."""
    from meaningless_tokens.models.cache import cache_root

    out = []
    sizes = {}
    for n in params.models:
        manifest = root / "artifacts" / "models" / f"{n}.json"
        if manifest.is_file():
            timing = root / "metrics" / "timing" / f"prepare-{n}.json"
            folder = json.loads(timing.read_text()).get("folder") if timing.is_file() else None
            path = cache_root(params.runtime, params.file) / "converted" / folder if folder else None
            if path is not None and path.is_dir():
                sizes[n] = parameter_count(path)
    for stage in TIMED:
        if stage in ("evaluate", "likelihood") and not outcomes or stage == "likelihood" and not likelihood:
            continue
        measured = []
        for n, size in sizes.items():
            f = root / "metrics" / "timing" / f"{stage}-{n}.json"
            if f.is_file():
                t = json.loads(f.read_text())
                secs = t.get("seconds") or t.get("seconds_this_run")
                if secs:
                    measured.append((abs(size - parameters), n, secs, size, t.get("cpu_model", "?"), t.get("git_commit", "")))
        if measured:
            _, n, secs, size, cpu, commit = min(measured)
            out.append((stage, secs * parameters / size, f"{n} ({size / 1e6:.0f} M parameters) at {commit[:7]} on {cpu}"))
    return out


def run(args) -> int:
    params_path = Path(args.params)
    params = load_params(params_path)
    name = args.name
    if not re.match(r"^[a-z0-9][a-z0-9_-]*$", name) or len(name) > 64:
        raise ConfigError(f"{name!r}: a model name is lowercase letters, digits, '-' and '_' (it names files and "
                          "DVC stages)")
    if name in params.models:
        raise ConfigError(f"{params_path}: models.{name}: already configured; pick another name or remove it first")
    d = dvc_model_defaults()
    entry = {"display_name": args.display_name or name, "template": d["template"], "family": d["family"],
             "source": source_of(args), "layers": d["layers"], "heads": d["heads"],
             "trust_remote_code": args.trust_remote_code, "arm": d["arm"]}
    facts = inspect(params, name, entry)
    entry["family"] = facts["model_type"]
    entry["layers"] = [x for x in d["layers"] if x < facts["num_layers"]]
    # the model's own chat format where it has one (an instruction-tuned model answers a raw prompt badly); else raw
    entry["template"] = "chat" if facts["has_chat_template"] else "raw"
    with_model(params, name, entry)  # the final entry validates

    text = params_path.read_text(encoding="utf-8")
    new = add_to_models(text, entry_text(name, entry))
    likelihood = args.outcomes and facts["gated_mlp"]
    if args.outcomes:
        new = add_to_list(new, "evaluate", name)
        if likelihood:
            new = add_to_list(new, "likelihood", name)
    tmp = params_path.with_name(f".{params_path.name}.add-model")
    tmp.write_text(new, encoding="utf-8")
    try:
        load_params(tmp)  # the written file validates as a whole before it replaces params.yaml
        tmp.replace(params_path)
    finally:
        tmp.unlink(missing_ok=True)

    heads = f"{facts['num_heads']} query / {facts['num_kv_heads']} key-value heads"
    print(f"{name}: {facts['model_type']} ({', '.join(facts['architectures']) or 'no architectures listed'}), "
          f"{facts['parameters'] / 1e6:.0f} M parameters, {facts['num_layers']} layers, {heads}; "
          f"chat template: {'yes' if facts['has_chat_template'] else 'no'} (template: {entry['template']}); "
          f"gated MLP for ARM: {'yes' if facts['gated_mlp'] else 'no'}; attention probe: passed")
    print(f"added models.{name} to {params_path}" + (
        f"; to evaluate.models{' and likelihood.models' if likelihood else ''}" if args.outcomes else ""))
    if args.outcomes and not facts["gated_mlp"]:
        print(f"  not added to likelihood.models: its layer 0 MLP is not gated, and the likelihood scores `arm`")
    cost = estimate(params_path.parent, params, facts["parameters"], args.outcomes, likelihood)
    print("run it:  dvc repro        (its stages, then figures and the report; or: dvc exp run)")
    if cost:
        total = sum(s for _, s, _ in cost)
        print(f"expected cost on this machine: about {total / 60:.0f} min of stage time "
              f"({', '.join(f'{s} {sec:.0f} s' for s, sec, _ in cost)}), plus start-up and the figures and report; "
              f"scaled by parameter count from {cost[0][2]}")
    else:
        print("expected cost: unknown (no metrics/timing from an earlier run here to scale from)")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="mless", description="The meaningless-token study's commands.")
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("add-model", help="add a causal LM to params.yaml after inspecting it",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("name", help="the model's name in params.yaml (lowercase, digits, '-', '_')")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--local", metavar="DIR", help="a Hugging Face model folder (config.json, *.safetensors, tokenizer)")
    where.add_argument("--hf", metavar="ORG/NAME", help="a hub model, at --revision")
    where.add_argument("--gguf", metavar="FILE", help="a GGUF file (its sha256 is recorded)")
    p.add_argument("--revision", metavar="COMMIT", help="with --hf: the full 40-hex commit")
    p.add_argument("--display-name", help="the name on charts and in the report (default: NAME)")
    p.add_argument("--trust-remote-code", action="store_true", help="run the model's own code from its folder")
    p.add_argument("--outcomes", action="store_true", help="also add it to evaluate.models and likelihood.models")
    p.add_argument("--params", default=str(PARAMS_FILE))
    args = ap.parse_args(argv)
    try:
        return run(args)
    except StageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        from meaningless_tokens.store import os_error_line

        print(f"error: {os_error_line(e)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

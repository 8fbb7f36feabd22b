"""`mless add-model`: a causal LM added to the study in one command.

    mless add-model NAME --local DIR | --hf ORG/NAME --revision COMMIT | --gguf FILE [--outcomes]
                    [--display-name TEXT] [--trust-remote-code] [--params params.yaml]

Before anything is written the model is inspected as the stages will use it (meaningless_tokens/models: the
source resolved, a GGUF converted into the cache, the config read, the attention probe run on its first layers):
architecture and family, layers, query and key-value heads, whether layer 0's MLP is gated (ARM edits its
act_fn(gate_proj(x))), whether the tokenizer has a chat template, the parameter count. A model the study cannot
use is refused in one line that says why, and params.yaml is left as it was.

Then its complete `models.<NAME>` entry (every key dvc.yaml lists) is appended to params.yaml's `models` (every
other line kept as it was, whatever the file's layout), with `--outcomes` the name is added to `evaluate.models` and
`likelihood.models` (a model without a gated MLP only to `evaluate.models`: the likelihood scores `arm`), and the
command prints what to run and what the run will cost on this machine, scaled by parameter count from the
throughput the last run measured (metrics/timing/).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from meaningless_tokens.config import PARAMS_FILE, Params, dvc_model_defaults, load_params, yaml12
from meaningless_tokens.config.yaml12 import MappingNode, Node, ScalarNode, SequenceNode
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
    from meaningless_tokens.models.sources import safetensors_header

    total = 0
    for f in sorted(path.glob("*.safetensors")):
        header = safetensors_header(path.name, f)
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


def _get(node: Node, key: str) -> Node | None:
    """The value node of `key` in mapping `node` (None where absent or `node` is no mapping)."""
    if isinstance(node, MappingNode):
        for k, v in node.value:
            if isinstance(k, ScalarNode) and k.value == key:
                return v
    return None


def _after_line(text: str, node: Node) -> int:
    """The text's index just past the line `node` ends on (a block mapping or list: its last value's line; its own
    end lies at the next key, past any comments between)."""
    while isinstance(node, (MappingNode, SequenceNode)) and not node.flow_style and node.value:
        node = node.value[-1][1] if isinstance(node, MappingNode) else node.value[-1]
    end = node.end_mark.index
    if end > 0 and text[end - 1] == "\n":  # a block scalar ends past its own line break
        return end
    newline = text.find("\n", end)
    return len(text) if newline < 0 else newline + 1


def _insert(text: str, at: int, new: str) -> str:
    head = text[:at]
    if head and not head.endswith("\n") and new.endswith("\n"):  # the last line of a file without a final newline
        head += "\n"
    return head + new + text[at:]


def entry_text(name: str, entry: dict, indent: int = 2, step: int = 2) -> str:
    """The YAML of one `models` entry, its key at column `indent`, nested by `step`, lists and mappings in flow style
    as params.yaml writes its models."""
    pad = [" " * (indent + i * step) for i in range(3)]
    lines = [f"{pad[0]}{yaml12.flow(name)}:"]
    for k in ("display_name", "template", "family"):
        lines.append(f"{pad[1]}{k}: {yaml12.flow(entry[k])}")
    lines.append(f"{pad[1]}source:")
    lines += [f"{pad[2]}{k}: {yaml12.flow(v)}" for k, v in entry["source"].items()]
    for k in ("layers", "heads", "trust_remote_code"):
        lines.append(f"{pad[1]}{k}: {yaml12.flow(entry[k])}")
    lines.append(f"{pad[1]}arm: {yaml12.flow(entry['arm'])}   # null: the paper's value for this model, else the "
                 "variant's fallback")
    return "\n".join(lines) + "\n"


def add_to_models(text: str, name: str, entry: dict) -> str:
    """params.yaml's text with entry `name` written after the last of its `models`, at their indentation; every
    other line as it was. The places come from the YAML parser (ruamel.yaml's node marks), so any layout serves."""
    models = _get(yaml12.compose(text), "models")
    if not isinstance(models, MappingNode) or not models.value:
        raise ConfigError("models: not a mapping of model entries to add the model to")
    if models.flow_style:  # `models: {a: {...}}`: written again in flow style, on one line
        data = yaml12.load(text)["models"]
        return text[:models.start_mark.index] + yaml12.flow({**data, name: entry}) + text[models.end_mark.index:]
    first_key, first = models.value[0]
    indent = first_key.start_mark.column
    inner = first.value[0][0].start_mark.column if isinstance(first, MappingNode) and first.value else 0
    step = inner - indent if inner > indent else 2
    return _insert(text, _after_line(text, models), entry_text(name, entry, indent, step))


def add_to_list(text: str, section: str, name: str) -> str:
    """`name` appended to the `models` list of top-level `section`, in the list's own style: after its last item in a
    flow list (`[a, b]`, on one line or several), a `- name` line under the last item in a block list."""
    models = _get(_get(yaml12.compose(text), section), "models")
    if not isinstance(models, SequenceNode):
        raise ConfigError(f"{section}.models: not a list in the file (the schema's default applies); write it out, "
                          "as DVC needs it spelled out too")
    if name in yaml12.load(text)[section]["models"]:
        return text
    item = yaml12.flow(name)
    if models.flow_style:
        if not models.value:
            return _insert(text, models.end_mark.index - 1, item)  # before the `]` of `[]`
        return _insert(text, models.value[-1].end_mark.index, f", {item}")
    dash = models.start_mark.column  # a block list's node starts at its first `-`
    return _insert(text, _after_line(text, models), f"{' ' * dash}- {item}\n")


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
    new = add_to_models(text, name, entry)
    expected = yaml12.load(text)
    expected["models"][name] = entry
    likelihood = args.outcomes and facts["gated_mlp"]
    for section in ("evaluate", "likelihood") if args.outcomes else ():
        if section == "evaluate" or likelihood:
            new = add_to_list(new, section, name)
            if name not in expected[section]["models"]:
                expected[section]["models"].append(name)
    # what the file will say is exactly what was there plus the model: an edit of the text can only add, never alter
    if yaml12.load(new) != expected:
        raise ConfigError(f"{params_path}: models.{name}: editing the file would change more than the model's "
                          "entry and lists; nothing written")
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
    from meaningless_tokens.cluster import cli as cluster_cli

    cluster_cli.add_parser(sub)
    args = ap.parse_args(argv)
    try:
        return cluster_cli.run(args) if args.command == "repro" else run(args)
    except StageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        from meaningless_tokens.store import os_error_line

        print(f"error: {os_error_line(e)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

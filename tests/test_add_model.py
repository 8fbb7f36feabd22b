"""`mless add-model`: a model folder of every supported family added by one command, with its complete entry
(every key dvc.yaml lists), the file's comments kept, the outcome lists extended; the refusals in one line with
params.yaml untouched; a hub id resolved through the offline cache."""

from __future__ import annotations

import difflib
import json
import shutil
from pathlib import Path

import pytest
import yaml

from meaningless_tokens import add_model, store
from meaningless_tokens.config import load_params, yaml12
from tests import shared, tiny

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory):
    return shared.family_models(tmp_path_factory)  # built once for the run (tests/test_families.py's too)


@pytest.fixture
def project(tmp_path, cache_dir):
    """A copy of the project's params.yaml (offline, as the default profile is) in a folder of its own."""
    shutil.copy(ROOT / "params.yaml", tmp_path / "params.yaml")
    return tmp_path / "params.yaml"


def add(params: Path, *args: str) -> int:
    return add_model.main(["add-model", *args, "--params", str(params)])


@pytest.mark.parametrize("family", tiny.FAMILIES)
def test_a_folder_of_each_family_is_added_complete(family, family_dirs, project, capsys):
    before = project.read_text()
    assert add(project, "mine", "--local", str(family_dirs[family]), "--display-name", "Mine", "--outcomes") == 0
    out = capsys.readouterr().out
    after = project.read_text()
    # params.yaml's text (comments included) is kept but for the outcome lists; the entry ends `models`
    changed = [line for line in before.splitlines() if line not in set(after.splitlines())]
    assert changed and all(line.startswith("  models: [") for line in changed), changed
    params = load_params(project)
    spec = params.models["mine"]
    assert list(params.models)[-1] == "mine" and spec.display_name == "Mine"
    raw = yaml.safe_load(after)["models"]["mine"]
    # every key a stage's dvc.yaml entry lists is spelled out, so DVC finds them all
    for stage in ("prepare", "extract", "activations", "sweep", "stats", "evaluate", "likelihood"):
        for key in store.params_keys(stage, "mine"):
            if key.startswith("models.mine."):
                assert key.split(".")[2] in raw, (stage, key)
    assert spec.family == json.loads((family_dirs[family] / "config.json").read_text())["model_type"]
    assert spec.source.kind == "local_dir" and Path(spec.source.path) == family_dirs[family].resolve()
    assert spec.template == "raw"  # the tiny tokenizers have no chat template
    gated = family != "phi3"  # phi3's MLP is fused (gate_up_proj): ARM cannot edit it
    assert "mine" in params.evaluate.models and ("mine" in params.likelihood.models) == gated
    assert f"gated MLP for ARM: {'yes' if gated else 'no'}" in out and "attention probe: passed" in out
    assert "dvc repro" in out and "expected cost" in out


def test_refusals_are_one_line_and_leave_params_untouched(family_dirs, project, tmp_path, capsys):
    before = project.read_text()

    def refused(*args: str) -> str:
        assert add(project, *args) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: ") and "\n" not in err, err
        assert project.read_text() == before
        return err

    assert "already configured" in refused("smollm2-135m", "--local", str(family_dirs["llama"]))
    assert "lowercase letters" in refused("Mine!", "--local", str(family_dirs["llama"]))
    assert "--revision" in refused("mine", "--hf", "acme/tiny")
    bins = tmp_path / "bin-only"
    shutil.copytree(family_dirs["llama"], bins)
    for f in bins.glob("*.safetensors"):
        f.unlink()
    (bins / "pytorch_model.bin").write_bytes(b"")
    assert "no *.safetensors weights" in refused("mine", "--local", str(bins))
    remote = tmp_path / "remote"
    shutil.copytree(family_dirs["llama"], remote)
    cfg = json.loads((remote / "config.json").read_text())
    cfg.update(model_type="acme_custom", auto_map={"AutoModelForCausalLM": "modeling_acme.AcmeForCausalLM"})
    (remote / "config.json").write_text(json.dumps(cfg))
    assert "model_type 'acme_custom' is not supported" in refused("mine", "--local", str(remote))
    assert "no such GGUF file" in refused("mine", "--gguf", str(tmp_path / "missing.gguf"))


def test_a_hub_id_resolves_through_the_offline_cache(family_dirs, project, cache_dir):
    """The real huggingface_hub path (params.yaml is offline), against a hub cache laid out as the library does."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    tiny.hub_snapshot(cache_dir, "acme/tiny-qwen", commit, family_dirs["qwen2"])
    assert add(project, "hub-qwen", "--hf", "acme/tiny-qwen", "--revision", commit) == 0
    spec = load_params(project).models["hub-qwen"]
    assert (spec.source.kind, spec.source.repo_id, spec.source.revision) == ("hf", "acme/tiny-qwen", commit)
    assert spec.family == "qwen2" and "hub-qwen" not in load_params(project).likelihood.models  # no --outcomes


def test_the_outcome_lists_are_extended_in_flow_or_block_style():
    from meaningless_tokens.add_model import add_to_list

    text = "evaluate:\n  n_samples: 3\n  models:\n  - a\n  - b\n  seed: 0\nlikelihood:\n  models: [a]  # kept\n"
    assert add_to_list(add_to_list(text, "evaluate", "c"), "likelihood", "c") == (
        "evaluate:\n  n_samples: 3\n  models:\n  - a\n  - b\n  - c\n  seed: 0\nlikelihood:\n  models: [a, c]  # kept\n")
    assert add_to_list(text, "evaluate", "a") == text  # listed already
    assert add_to_list("evaluate:\n  models:\n    - a   # x\n", "evaluate", "c") == "evaluate:\n  models:\n    - a   # x\n    - c\n"


# a layout the old line expressions refused: 4-space indentation, a flow list spread over lines, block lists indented
# under their key, comments between keys and after the last model, a file without a final newline
LAYOUT = """\
evaluate:
    n_samples: 5    # problems
    # the models evaluated
    models: [a,
             b]     # one stage each
    seed: 0
likelihood:
    models:
        - a         # first
        # between items
        - b
    # after the list
models:
    a:
        source:
            kind: hf    # the hub
        arm: {c: null}
    # between models
    b:
        note: |
            kept
    # after the last model
figures:
    models: all     # last line"""


def test_an_entry_and_the_lists_are_added_in_any_layout_keeping_every_other_line():
    entry = {"display_name": "on", "template": "raw", "family": "llama",
             "source": {"kind": "local_dir", "path": "models/my model"}, "layers": [0, 1], "heads": "all",
             "trust_remote_code": False, "arm": {"c": None, "percentage": None, "k": None, "pmin": None, "pmax": None}}
    new = add_model.add_to_models(LAYOUT, "mine", entry)
    new = add_model.add_to_list(add_model.add_to_list(new, "evaluate", "mine"), "likelihood", "mine")
    before, after = LAYOUT.splitlines(), new.splitlines()
    # every line kept, in order (only the flow list's last line gains the name), the additions in the file's indentation
    diff = list(difflib.unified_diff(before, after, lineterm="", n=0))[2:]
    assert [line[1:] for line in diff if line.startswith("-")] == ["             b]     # one stage each"]
    assert [line[1:] for line in diff if line.startswith("+")] == [
        "             b, mine]     # one stage each",
        "        - mine",
        "    mine:", "        display_name: on", "        template: raw", "        family: llama", "        source:",
        "            kind: local_dir", "            path: models/my model", "        layers: [0, 1]", "        heads: all",
        "        trust_remote_code: false",
        "        arm: {c: null, percentage: null, k: null, pmin: null, pmax: null}   # null: the paper's value for this "
        "model, else the variant's fallback"]
    assert after.index("        - mine") == after.index("        - b") + 1
    assert after.index("    mine:") == after.index("            kept") + 1  # right after the last model's last value
    data = yaml12.load(LAYOUT)
    data["models"]["mine"] = entry
    data["evaluate"]["models"].append("mine")
    data["likelihood"]["models"].append("mine")
    assert yaml12.load(new) == data  # nothing else read differently (display_name "on" a string: YAML 1.2)
    assert add_model.add_to_list(new, "evaluate", "mine") == new  # listed already


def test_add_model_edits_a_file_the_line_expressions_refused(family_dirs, project, capsys):
    """The shipped params.yaml re-laid out: 4-space indentation, the outcome lists spread over lines, a comment
    between every two keys; the command adds the model and keeps every comment."""
    lines = []
    for line in project.read_text().splitlines():
        stripped = line.lstrip()
        depth = (len(line) - len(stripped)) // 2
        if stripped.startswith("models: [") and depth == 1:
            items = stripped.removeprefix("models: [").split("]")[0].split(", ")
            stripped = "models: [" + f",\n{' ' * (4 * depth + 9)}".join(items) + "]"
        if depth == 1 and stripped and not stripped.startswith("#"):
            lines.append(f"    # a comment before {stripped.split(':')[0]}")
        lines.append(" " * (4 * depth) + stripped if line.strip() else "")
    project.write_text("\n".join(lines) + "\n")
    before = project.read_text()
    old = load_params(project)
    assert add(project, "mine", "--local", str(family_dirs["llama"]), "--outcomes") == 0, capsys.readouterr().err
    after = project.read_text()
    comments = [line.split("#", 1)[1] for line in before.splitlines() if "#" in line]
    kept = [line.split("#", 1)[1] for line in after.splitlines() if "#" in line]
    assert all(c in kept for c in comments) and len(kept) == len(comments) + 1  # + the new entry's arm comment
    new = load_params(project)
    assert list(new.models) == [*old.models, "mine"]
    assert new.evaluate.models == [*old.evaluate.models, "mine"] and new.likelihood.models == [*old.likelihood.models, "mine"]
    assert new.model_dump(exclude={"models", "evaluate", "likelihood"}) == \
        old.model_dump(exclude={"models", "evaluate", "likelihood"})

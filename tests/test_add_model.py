"""`mless add-model`: a model folder of every supported family added by one command, with its complete entry
(every key dvc.yaml lists), the file's comments kept, the outcome lists extended; the refusals in one line with
params.yaml untouched; a hub id resolved through the offline cache."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from meaningless_tokens import add_model, store
from meaningless_tokens.config import load_params
from tests import tiny

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory):
    base = tmp_path_factory.mktemp("add-model-families")
    return {f: tiny.build(f, base / f) for f in tiny.FAMILIES}


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

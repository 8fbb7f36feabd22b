import hashlib
import json
import subprocess
import sys

import h5py
import numpy as np
import pytest
import torch

from meaningless_tokens import capture
from meaningless_tokens import models
from stages import extract
from meaningless_tokens.config import load_params
from meaningless_tokens.dataset import dataset_spec, load_math500
from meaningless_tokens.errors import ArtifactError, ConfigError, DatasetError
from meaningless_tokens.prompts import PromptBuilder
from meaningless_tokens.store import read_h5
from tests import tiny
from tests.conftest import ROOT
from tests.layer0 import own_mask, recompute_layer0
from tests.params import spelled_out, tiny_model

ARCHS = ["llama", "qwen2", "gemma3"]


def tiny_params(write_params, tiny_dirs, arch, n_samples=4, showcase=1, **spec):
    """The default params with one tiny model `tiny` of `arch` (`spec` added to its entry)."""
    return load_params(write_params(over={"extract": {"n_samples": n_samples, "showcase": showcase}},
                                    models={"tiny": spelled_out(tiny_model(arch, tiny_dirs[arch], **spec))}))


@pytest.mark.parametrize("arch", ARCHS)
def test_stored_layer0_equals_independent_recomputation(arch, tiny_dirs, write_params, cache_dir, tmp_path):
    params = tiny_params(write_params, tiny_dirs, arch, n_samples=3, showcase=3)
    out = extract.run(params, "tiny", root=tmp_path / "a")
    model, tokenizer = models.load(models.setup_for(params, "tiny"))
    with h5py.File(out) as f:
        assert list(f.attrs["layers"]) == [0, 1, 2] and list(f.attrs["heads"]) == [0, 1, 2, 3]
        for c in ("none", "mless", "mful"):
            g = f[c]
            off = g["offsets"][:]
            for k in range(3):
                ids = g["input_ids"][off[k]:off[k + 1]].tolist()
                expected, allowed = recompute_layer0(model, ids)  # [H, T, T], [T, T]
                assert np.array_equal(allowed, own_mask(model, len(ids)))  # causal, and Gemma's band
                stored = f["showcase"][f"{k:03d}"][c][0]
                np.testing.assert_allclose(stored, expected, atol=1e-5, rtol=0)
                np.testing.assert_allclose(stored.sum(-1), 1.0, atol=1e-5)
                start, end = g["span"][k]
                none_off = f["none"]["offsets"][:]
                orig = g["original_pos"][none_off[k]:none_off[k + 1]]
                sl = slice(off[k], off[k + 1])
                np.testing.assert_allclose(g["recv_all"][0, :, sl], expected.sum(1), atol=1e-5)
                np.testing.assert_allclose(g["recv_original"][0, :, sl], expected[:, orig, :].sum(1), atol=1e-5)
                np.testing.assert_allclose(g["recv_last"][0, :, sl], expected[:, -1, :], atol=1e-5)
                np.testing.assert_allclose(g["mass_span"][0, :, sl], expected[:, :, start:end].sum(-1), atol=1e-5)
                np.testing.assert_allclose(g["mass_first"][0, :, sl], expected[:, :, 0], atol=1e-5)
                if arch == "gemma3":  # the sliding window is in effect on these prompts
                    assert len(ids) > model.config.sliding_window and expected[:, -1, 0].max() == 0


@pytest.mark.parametrize("arch", ARCHS)
def test_capture_equals_the_models_own_eager_forward(arch, tiny_dirs, write_params, cache_dir):
    params = tiny_params(write_params, tiny_dirs, arch)
    model, tokenizer = models.load(models.setup_for(params, "tiny"))
    problems, _ = load_math500(dataset_spec(params.dataset, params.file))
    ids = PromptBuilder(params.prompt, tokenizer, "raw", params.file).build(problems[7])["mless"].input_ids
    with torch.no_grad():
        reference = model(torch.tensor([ids]), output_attentions=True).attentions
    capture.install_capture(model)
    captured = capture.attention(model, ids, [0, 1, 2])
    for layer in (0, 1, 2):
        assert torch.equal(captured[layer], reference[layer][0])


def test_early_exit_runs_only_the_requested_layers(tiny_dirs, write_params, cache_dir):
    params = tiny_params(write_params, tiny_dirs, "llama")
    model, tokenizer = models.load(models.setup_for(params, "tiny"))
    capture.install_capture(model)
    ran = []
    hooks = [layer.register_forward_pre_hook(lambda m, a, i=i: ran.append(i)) for i, layer in enumerate(model.get_decoder().layers)]
    hooks.append(model.lm_head.register_forward_pre_hook(lambda m, a: ran.append("lm_head")))
    capture.attention(model, [5, 6, 7, 8], [0, 1])
    assert ran == [0, 1]
    for h in hooks:
        h.remove()


def test_artifact_layout_alignment_and_determinism(tiny_dirs, write_params, cache_dir, tmp_path):
    params = tiny_params(write_params, tiny_dirs, "gemma3", n_samples=5, showcase=1)
    a = extract.run(params, "tiny", root=tmp_path / "a")
    b = extract.run(params, "tiny", root=tmp_path / "b")
    assert a.read_bytes() == b.read_bytes()
    with read_h5(a, "attention", ("problems/index", "none/recv_all", "showcase/000/mless")) as f:
        levels = f["problems/level"][:]
        assert len(levels) == 5
        prov = f.attrs["provenance"]
        for needle in ("weights_sha256", "dataset_sha256", "code_sha256", "transformers", "mless_span_text", "\"n_samples\": 5"):
            assert needle in prov
        # the stage's declared code deps by content, no git commit (that goes to the timing sidecar)
        code = json.loads(prov)["code_sha256"]
        assert code["stages/extract.py"] == hashlib.sha256((ROOT / "stages/extract.py").read_bytes()).hexdigest()
        assert "git_commit" not in json.loads(prov)
        none_ids, none_off = f["none/input_ids"][:], f["none/offsets"][:]
        span_lengths = set()
        for c in ("mless", "mful"):
            ids, off, span = f[c]["input_ids"][:], f[c]["offsets"][:], f[c]["span"][:]
            orig = f[c]["original_pos"][:]
            for k in range(5):
                sample = ids[off[k]:off[k + 1]]
                pos = orig[none_off[k]:none_off[k + 1]]
                assert np.array_equal(sample[pos], none_ids[none_off[k]:none_off[k + 1]])
                start, end = span[k]
                assert set(range(off[k + 1] - off[k])) - set(pos) == set(range(start, end))
                span_lengths.add(end - start)
                # every query row sums to one, so the attention received sums to the prompt length
                total = f[c]["recv_all"][:, :, off[k]:off[k + 1]].sum(-1)
                np.testing.assert_allclose(total, off[k + 1] - off[k], rtol=1e-5)
        assert len(span_lengths) == 1  # mful is cut to the mless span's token length
        assert f["none/span"][:].tolist() == [[0, 0]] * 5 and not f["none/mass_span"][:].any()


def test_float16_storage(tiny_dirs, write_params, cache_dir, tmp_path):
    params = tiny_params(write_params, tiny_dirs, "llama", n_samples=3)
    raw = params.model_dump()
    raw["extract"]["dtype"] = "float16"
    half = extract.run(load_params(write_params(raw)), "tiny", root=tmp_path / "h")
    with h5py.File(half) as f:
        assert f["mless/recv_all"].dtype == np.float16 and f["mless/recv_all"].compression == "gzip"


@pytest.mark.parametrize("spec, n, match", [
    ({"layers": [0, 9]}, 4, r"models\.tiny\.layers: \[9\] out of range; the model has 4 layers"),
    ({"heads": [0, 4]}, 4, r"models\.tiny\.heads: \[4\] out of range; the model has 4 query heads"),
    ({"template": "chat"}, 4, r"models\.tiny: the tokenizer has no chat template"),
])
def test_bad_input_fails_before_work(tiny_dirs, write_params, cache_dir, tmp_path, spec, n, match):
    params = tiny_params(write_params, tiny_dirs, "llama", n_samples=n, **spec)
    with pytest.raises(ConfigError, match=match):
        extract.run(params, "tiny", root=tmp_path / "x")
    assert not (tmp_path / "x").exists()  # nothing written, not even a folder


def test_subset_larger_than_dataset(tiny_dirs, write_params, cache_dir, tmp_path):
    with pytest.raises(DatasetError, match="asked for 501 problems; the dataset has 500"):
        extract.run(tiny_params(write_params, tiny_dirs, "llama", n_samples=501), "tiny", root=tmp_path / "x")


def test_prompt_longer_than_context(write_params, cache_dir, tmp_path):
    short = tiny.build("llama", tmp_path / "short", max_positions=64)
    params = tiny_params(write_params, {"llama": short}, "llama")
    with pytest.raises(ConfigError, match=r"a prompt has \d+ tokens, more than the context of model 'tiny' \(64 positions\)"):
        extract.run(params, "tiny", root=tmp_path / "x")
    assert not (tmp_path / "x").exists()  # nothing written, not even a folder


@pytest.mark.slow  # tens of seconds: make test-fast leaves it to make test
def test_cli_one_line_error_and_no_output(tiny_dirs, write_params, tmp_path):
    params = tiny_params(write_params, tiny_dirs, "llama", layers=[7])
    proc = subprocess.run([sys.executable, "-m", "stages.extract", "--model", "tiny", "--params", str(params.file)],
                          cwd=ROOT, capture_output=True, text=True, env={"MLESS_CACHE": str(tmp_path / "c"), "PATH": ""})
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("error: ") and "models.tiny.layers: [7]" in proc.stderr


def test_corrupt_or_truncated_attention_file_is_reported_by_name(tiny_dirs, write_params, cache_dir, tmp_path):
    good = extract.run(tiny_params(write_params, tiny_dirs, "llama", n_samples=3), "tiny", root=tmp_path / "good")
    data = good.read_bytes()
    truncated = tmp_path / "truncated.h5"
    truncated.write_bytes(data[: len(data) // 2])
    with pytest.raises(ArtifactError, match=rf"{truncated}: "):
        with read_h5(truncated, "attention", ("none/recv_all",)) as f:
            f["none/recv_all"][:]
    garbage = tmp_path / "garbage.h5"
    garbage.write_bytes(b"\0" * 4096)
    with pytest.raises(ArtifactError, match=rf"{garbage}: not a readable HDF5 file"):
        with read_h5(garbage, "attention"):
            pass
    with pytest.raises(ArtifactError, match=r"missing \(run the stage"):
        with read_h5(tmp_path / "absent.h5", "attention"):
            pass
    with pytest.raises(ArtifactError, match=r"missing datasets \['none/nothing'\]"):
        with read_h5(good, "attention", ("none/nothing",)):
            pass

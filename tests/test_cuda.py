"""The CUDA tier (`make test-gpu`): the stages in-process on CUDA, in float32 and bfloat16, against the
same run on the CPU in float32; host-device synchronisations of the hot loops counted; peak memory of
the partial load. Collected always; the CUDA cases are skipped with the reason where torch sees no CUDA
device. The CPU bfloat16 case runs everywhere: it checks the same comparisons and tolerances (and the
bfloat16 paths of the code) on every `make test`.

Tolerances, stated once: float32 on CUDA against float32 on the CPU differs only by the order of
floating-point sums (cuBLAS against MKL/oneDNN), so attention weights and measures agree to
FP32_ATOL; bfloat16 keeps 8 bits of mantissa (relative rounding 2**-8 = 0.4 % per operation), so
attention weights and activation measures agree to BF16_ATOL absolute (shares and weights live in
[0, 1]) or BF16_RTOL relative.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import warnings

import h5py
import numpy as np
import pytest
import torch

from meaningless_tokens import engines
from meaningless_tokens import models
from stages import activations, evaluate, extract, likelihood
from meaningless_tokens.config import load_params
from meaningless_tokens.errors import ConfigError
from tests import tiny

pytestmark = pytest.mark.cuda

CUDA = torch.cuda.is_available()
NO_CUDA = "no CUDA device (torch.cuda.is_available() is False): the CUDA tier runs on a GPU machine, `make test-gpu`"
CASES = [pytest.param("cpu", "bfloat16", id="cpu-bfloat16"),
         pytest.param("cuda", "float32", id="cuda-float32", marks=pytest.mark.skipif(not CUDA, reason=NO_CUDA)),
         pytest.param("cuda", "bfloat16", id="cuda-bfloat16", marks=pytest.mark.skipif(not CUDA, reason=NO_CUDA))]
FP32_ATOL = 1e-5
BF16_ATOL, BF16_RTOL = 0.05, 0.05

# Host-device synchronisations the hot loops are allowed (documented in docs/gpu.md, "The CUDA test tier"):
# extract copies each captured layer's [heads, T, T] weights to the host once per prompt (1 per layer and
# prompt); activations copies each measured layer's a and z once per prompt (2 per layer and prompt);
# generation syncs a fixed number of times per decode step (transformers' own end-of-sequence check,
# plus the boxed-stop criterion's decode of the new tokens), never per layer. SLACK covers the per-call
# set-up (the upload of the prompt ids, the model's mask preparation).
SLACK = 8
GEN_SYNCS_PER_STEP = 6


def tolerance(dtype: str) -> dict:
    return {"rtol": 1e-4, "atol": FP32_ATOL} if dtype == "float32" else {"rtol": BF16_RTOL, "atol": BF16_ATOL}


def params_for(write_params, tiny_dir, arch, device, dtype, **sections):
    raw = load_params(write_params()).model_dump()
    raw["runtime"].update(device=device, dtype=dtype)
    raw["extract"].update(n_samples=3, showcase=1)
    raw["activations"].update(layers=[0, 1], n_boot=50, showcase=1)
    raw["evaluate"].update(n_samples=3, max_new_tokens=8, batch_size=12, stop_at_boxed=True)
    raw["prompt"]["conditions"] = ["none", "mless", "mful", "arm"]
    raw["models"] = {"tiny": {"display_name": f"Tiny {arch}", "family": arch,
                              "source": {"kind": "local_dir", "path": str(tiny_dir)}, "layers": [0, 1, 2],
                              "heads": "all"}}
    for key, value in sections.items():
        raw[key].update(value)
    return load_params(write_params(raw))


@contextlib.contextmanager
def counting_syncs():
    """Count host-device synchronisations inside the block (torch's sync debug mode, as warnings)."""
    seen = []
    if not CUDA:
        yield seen
        return
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield seen
        finally:
            torch.cuda.set_sync_debug_mode("default")
    seen.extend(w for w in caught if "synchronizing" in str(w.message))


def float_datasets(path, kind, names=None) -> dict[str, np.ndarray]:
    out = {}
    with h5py.File(path, "r") as f:
        assert f.attrs["kind"] == kind

        def visit(name, obj):
            if isinstance(obj, h5py.Dataset) and obj.dtype.kind in "fiub" and (names is None or names(name)):
                out[name] = obj[()]
        f.visititems(visit)
    return out


def assert_close(got: dict, want: dict, dtype: str, what: str):
    assert got.keys() == want.keys(), what
    tol = tolerance(dtype)
    for name in sorted(want):
        a, b = np.asarray(got[name]), np.asarray(want[name])
        assert a.shape == b.shape, (what, name)
        if b.dtype.kind in "iub":
            if dtype == "float32" or not name.split("/")[-1].startswith(("hist", "outside")):
                np.testing.assert_array_equal(a, b, err_msg=f"{what}: {name}")
            else:  # a bfloat16 value may cross a bin edge; every value is still counted once
                np.testing.assert_array_equal(a.sum(axis=-1) + 0, b.sum(axis=-1) + 0, err_msg=f"{what}: {name}")
        else:
            np.testing.assert_allclose(a.astype(np.float64), b.astype(np.float64), err_msg=f"{what}: {name}", **tol)


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory):
    return tiny.build("llama", tmp_path_factory.mktemp("cuda-tier") / "llama")


@pytest.fixture(scope="module")
def gemma_dir(tmp_path_factory):
    return tiny.build("gemma3", tmp_path_factory.mktemp("cuda-tier") / "gemma3")


@pytest.mark.parametrize("device,dtype", CASES)
@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_extract_matches_the_cpu_in_float32(arch, device, dtype, llama_dir, gemma_dir, write_params, cache_dir,
                                             tmp_path):
    tiny_dir = {"llama": llama_dir, "gemma3": gemma_dir}[arch]
    ref = extract.run(params_for(write_params, tiny_dir, arch, "cpu", "float32"), "tiny", root=tmp_path / "cpu")
    params = params_for(write_params, tiny_dir, arch, device, dtype)
    with counting_syncs() as syncs:
        got = extract.run(params, "tiny", root=tmp_path / "dev")
    with h5py.File(got, "r") as f:
        prov = json.loads(f.attrs["provenance"])
        assert prov["loaded_layers"] == 3  # the early exit: layers 3.. of 4 never built
        assert prov["params"]["runtime"] == {"device": device, "dtype": dtype}
    assert_close(float_datasets(got, "attention"), float_datasets(ref, "attention"), dtype, f"extract {device} {dtype}")
    prompts = params.extract.n_samples * len([c for c in params.prompt.conditions if c != "arm"])
    # the compare() probe runs once more per layer set; each prompt copies each captured layer once
    assert len(syncs) <= (prompts + 2) * (len(params.models["tiny"].layers) + SLACK), len(syncs)


@pytest.mark.parametrize("device,dtype", CASES)
def test_activations_match_the_cpu_in_float32(device, dtype, llama_dir, write_params, cache_dir, tmp_path):
    ref = activations.run(params_for(write_params, llama_dir, "llama", "cpu", "float32"), "tiny", root=tmp_path / "cpu")
    params = params_for(write_params, llama_dir, "llama", device, dtype)
    with counting_syncs() as syncs:
        got = activations.run(params, "tiny", root=tmp_path / "dev")

    def measured(name):  # the measures and lambda; not the bootstrap intervals and p-values computed from them
        return name.split("/")[0] in ("none", "mless", "mful") and not any(
            k in name for k in ("ci", "p_value", "wilcoxon", "diff"))
    assert_close(float_datasets(got, "activations", measured), float_datasets(ref, "activations", measured), dtype,
                 f"activations {device} {dtype}")
    prompts = params.extract.n_samples * 3
    assert len(syncs) <= prompts * (2 * len(params.activations.layers) + SLACK), len(syncs)


@pytest.mark.parametrize("device,dtype", CASES)
def test_evaluate_with_arm_rows_and_the_boxed_stop(device, dtype, llama_dir, write_params, cache_dir, tmp_path):
    ref_params = params_for(write_params, llama_dir, "llama", "cpu", "float32")
    ref = evaluate.run(ref_params, "tiny", root=tmp_path / "cpu")
    params = params_for(write_params, llama_dir, "llama", device, dtype)
    with counting_syncs() as syncs:
        got = evaluate.run(params, "tiny", root=tmp_path / "dev")
    keys = [f"{c}/{k}" for c in params.prompt.conditions for k in ("output", "n_tokens", "stop")]
    with h5py.File(ref, "r") as fr, h5py.File(got, "r") as fg:
        want = {k: fr[k][()] for k in keys}
        have = {k: fg[k][()] for k in keys}
    for k in keys:
        if k.endswith("stop"):
            assert set(s.decode() for s in have[k]) <= {"eos", "boxed", "length"}
        if k.endswith("n_tokens"):
            assert (have[k] <= params.evaluate.max_new_tokens).all()
    if dtype == "float32":  # greedy argmax on float32 logits: the same tokens (arm rows included)
        for k in keys:
            np.testing.assert_array_equal(have[k], want[k], err_msg=k)
    else:  # bfloat16 logits round near-ties differently: the numerics are checked on the prefill below
        setup = models.setup_for(params, "tiny")
        model, tok = models.load(setup)
        cpu_model, _ = models.load(dataclasses.replace(setup, device="cpu", dtype="float32"))  # the reference's
        ids = tok("Please reason step by step. What is 1+1?")["input_ids"]
        with torch.no_grad():
            a = model(torch.tensor([ids], device=model.device)).logits.float().cpu()
            b = cpu_model(torch.tensor([ids])).logits
        scale = b.abs().max().item()
        assert (a - b).abs().max().item() <= BF16_RTOL * scale + BF16_ATOL
    steps = params.evaluate.max_new_tokens
    batches = -(-params.evaluate.n_samples * 4 // params.evaluate.batch_size)
    assert len(syncs) <= batches * (steps * GEN_SYNCS_PER_STEP + 4 * SLACK), len(syncs)


@pytest.mark.parametrize("device,dtype", CASES)
def test_likelihood_matches_the_cpu_in_float32(device, dtype, llama_dir, write_params, cache_dir, tmp_path):
    """Teacher-forced log-probs (the LM head at the scored positions only, batched by length) with the arm hook."""
    sections = {"likelihood": {"n_samples": 3, "solution_tokens": 16, "n_boot": 50, "showcase": 1,
                               "conditions": ["none", "mless", "arm"]}}
    ref = likelihood.run(params_for(write_params, llama_dir, "llama", "cpu", "float32", **sections), "tiny",
                         root=tmp_path / "cpu")
    params = params_for(write_params, llama_dir, "llama", device, dtype, **sections)
    with counting_syncs() as syncs:
        got = likelihood.run(params, "tiny", root=tmp_path / "dev")

    def scored(name):  # the per-problem log-probs; not the statistics computed from them
        return name.split("/")[0] in ("none", "mless", "arm") and name.split("/")[-1] in ("sum", "mean", "tokens")
    want = float_datasets(ref, "likelihood", scored)
    assert len(want) == 3 * 2 * 3, sorted(want)  # conditions x continuations x (sum, mean, tokens)
    assert_close(float_datasets(got, "likelihood", scored), want, dtype, f"likelihood {device} {dtype}")
    # one copy of the scored log-probs per batch, never per token or layer
    assert len(syncs) <= 3 * 3 * 2 * SLACK, len(syncs)


@pytest.mark.skipif(not CUDA, reason=NO_CUDA)
def test_the_boxed_stop_criterion_on_cuda(llama_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(llama_dir)
    prompt = tok("question:")["input_ids"]
    rows = [prompt + tok("so \\boxed{12} done")["input_ids"], prompt + tok("so \\boxed{1 and more")["input_ids"]]
    width = max(map(len, rows))
    ids = torch.tensor([r + [tok.pad_token_id] * (width - len(r)) for r in rows], device="cuda")
    done = engines._BoxedStop(tok, len(prompt))(ids, None)
    assert done.device.type == "cuda" and done.tolist() == [True, False]


@pytest.mark.skipif(not CUDA, reason=NO_CUDA)
def test_partial_load_takes_a_fraction_of_the_cuda_memory(write_params, cache_dir, tmp_path):
    """Extract's partial load (layers 0..2 of 32) against the whole 32-layer checkpoint, on CUDA."""
    big = tiny.build("llama", tmp_path / "llama32", layers=32)
    params = params_for(write_params, big, "llama", "cuda", "float32")
    setup = models.setup_for(params, "tiny")
    peaks = {}
    for label, layers in (("partial", [0, 1, 2]), ("full", None)):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        model, _ = models.load(setup, layers=layers)
        peaks[label] = torch.cuda.max_memory_allocated() - base
        del model
    print(f"peak CUDA memory of the load: partial {peaks['partial']} B, full {peaks['full']} B")
    # 3 of 32 layers plus the embeddings (tied head): well under a fifth of the whole model
    assert peaks["partial"] * 5 < peaks["full"], peaks


@pytest.mark.skipif(CUDA, reason="this machine has CUDA: the refusal is for machines without it")
def test_cuda_requested_without_cuda_is_one_line_before_any_model_is_loaded(llama_dir, write_params, cache_dir,
                                                                            tmp_path):
    params = params_for(write_params, llama_dir, "llama", "cuda", "float32")
    for run in (lambda: extract.run(params, "tiny", root=tmp_path),
                lambda: activations.run(params, "tiny", root=tmp_path),
                lambda: evaluate.run(params, "tiny", root=tmp_path)):
        with pytest.raises(ConfigError, match=r"params.yaml: runtime.device: 'cuda' requested but torch sees no CUDA"):
            run()
    assert not cache_dir.exists() or not any(cache_dir.rglob("*.safetensors")), "a model was prepared first"
    assert not list(tmp_path.rglob("*.h5"))

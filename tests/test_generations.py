"""Generations kept across stages (meaningless_tokens/generations.py): at the plan's one shape a row's tokens are its
own, so the sweep's count-0 and count-55 rows are evaluate's none and mless rows, generated once."""

import json
import random

import pytest

from meaningless_tokens import engines, generations
from tests.test_engine_shapes import engine_and_items, shape_params


def planned_engine(write_params, tiny_dirs, arch="llama", **cfg):
    """A transformers engine with the compiled path's shapes but no compilation (float32, CPU): what the store keys."""
    params = shape_params(write_params, tiny_dirs, arch, **cfg)
    engine, items = engine_and_items(params)
    engine.planned = True
    return engine, [it for it in items if it.condition != "arm"]


def run(engine, items, journal_path, rank=None) -> dict:
    engine.fit([(items, engine.cfg.max_new_tokens)])
    journal = engines.Journal(journal_path, "k")
    batches = engines.make_batches(items, engine.batch_size, condition_rank=rank)
    engines.run_journaled(engine, batches, journal, {it.index: "7" for it in items}, "test", "tiny")
    return {k: (r.output, r.n_tokens, r.stop) for k, r in journal.records.items()}


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_a_row_generates_the_same_in_any_company_at_the_plan_shape(arch, tiny_dirs, write_params, cache_dir):
    """Each row generated in two batches of different rows (and fillers), at the one shape: the same tokens."""
    engine, items = planned_engine(write_params, tiny_dirs, arch, n_samples=3, max_new_tokens=12, batch_size=4)
    with engine:
        engine.fit([(items, 12)])
        shape = engine.shape
        first = {}
        for batch in engines.make_batches(items, 4):
            for it, out in zip(batch, engines.generate(engine.model, engine.tokenizer, batch, 12, True, engine.eos,
                                                       shape=shape)):
                first[it.key] = out
        shuffled = items[:]
        random.Random(0).shuffle(shuffled)
        for batch in [shuffled[i:i + 3] for i in range(0, len(shuffled), 3)]:  # 3 rows + 1 filler each
            for it, out in zip(batch, engines.generate(engine.model, engine.tokenizer, batch, 12, True, engine.eos,
                                                       shape=shape)):
                assert out == first[it.key], it.key
    assert len(first) == len(items) == 9


def test_the_sweep_takes_evaluates_none_and_mless_rows(tiny_dirs, write_params, cache_dir, tmp_path, monkeypatch):
    """An evaluate-like run (none, mless, mful) fills the store; a sweep-like run (none, the mless prompt as `/x55`,
    another span as `/x10`) then generates only its `/x10` rows, and every row equals a run that reuses nothing."""
    cfg = dict(n_samples=3, max_new_tokens=10, batch_size=4)
    engine, items = planned_engine(write_params, tiny_dirs, **cfg)
    with engine:
        evaluated = run(engine, items, tmp_path / "evaluate.jsonl")
    assert engine.stats.get("reused", 0) == 0 and engine.store.path.is_file()
    by = {c: [it for it in items if it.condition == c] for c in ("none", "mless")}
    sweep = by["none"] + [engines.Item(it.index, "/x55", it.input_ids) for it in by["mless"]]
    sweep += [engines.Item(it.index, "/x10", it.input_ids[:-3] + it.input_ids[-2:]) for it in by["mless"]]

    engine, _ = planned_engine(write_params, tiny_dirs, **cfg)
    with engine:
        reused = run(engine, sweep, tmp_path / "sweep.jsonl", rank=str)
    assert engine.stats["reused"] == 6
    for it in by["none"]:
        assert reused[it.key] == evaluated[it.key]
    for it in by["mless"]:
        assert reused[(it.index, "/x55")] == evaluated[(it.index, "mless")]

    monkeypatch.setenv("MLESS_REUSE", "0")
    engine, _ = planned_engine(write_params, tiny_dirs, **cfg)
    with engine:
        fresh = run(engine, sweep, tmp_path / "fresh.jsonl", rank=str)
    assert engine.store is None and "reused" not in engine.stats
    assert fresh == reused and len(fresh) == 9


def test_only_greedy_unedited_rows_are_kept_and_damage_is_skipped(tmp_path, capsys):
    key = {"version": 1, "weights": "w", "settings": {"rows": 4}}
    store = generations.Store(tmp_path, key)
    rows = [(engines.Item(0, "none", (1, 2)), "a", 1, "eos", 0.5),
            (engines.Item(0, "arm", (1, 2, 3)), "b", 1, "eos", 0.5),
            (engines.Item(0, "none", (1, 2, 4), sample=0), "c", 1, "eos", 0.5),
            (engines.Item(-1, "filler", (1, 2, 5)), "d", 1, "eos", 0.5),
            (engines.Item(1, "/x10", (7, 8)), "e\x00\udc80", 2, "length", 0.25)]
    store.put(rows)
    with open(store.path, "a") as f:
        f.write('{"ids": "torn", "text": "x"')  # a run killed mid-line
    again = generations.Store(tmp_path, key)
    assert again.skipped == 1 and "1 damaged lines skipped" in capsys.readouterr().err
    assert again.get(engines.Item(5, "mless", (1, 2))) == ("a", 1, "eos", 0.5)  # the ids, not the label
    assert again.get(engines.Item(1, "/x10", (7, 8))) == ("e\x00\udc80", 2, "length", 0.25)
    assert len(again.rows) == 2
    header = json.loads(store.path.read_text().splitlines()[0])
    assert header == {"version": 1, "key": key}
    assert generations.Store(tmp_path, {**key, "settings": {"rows": 8}}).rows == {}  # another key, another file


def test_per_batch_shapes_keep_nothing(tiny_dirs, write_params, cache_dir, tmp_path):
    """The CPU's default (compile off): batches keep their own shapes, so no row is stored or reused."""
    engine, items = engine_and_items(shape_params(write_params, tiny_dirs, max_new_tokens=4, batch_size=4))
    with engine:
        run(engine, [it for it in items if it.condition == "none"], tmp_path / "j.jsonl")
    assert engine.store is None and not (cache_dir / "generations").exists()


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_the_sweeps_count_0_and_55_prompts_are_evaluates_none_and_mless(arch, tiny_dirs, write_params, cache_dir):
    """What makes the store's hits: the same prompt ids in both stages (the default prompt, span '/' x 55)."""
    from meaningless_tokens import models, span_sweep
    from meaningless_tokens.prompts import builder_for, dataset_spec, load_math500

    params = shape_params(write_params, tiny_dirs, arch)
    assert params.prompt.mless.count == 55 and "/" in params.sweep.tokens and 55 in params.sweep.counts
    setup = models.setup_for(params, "tiny")
    engine, _ = engine_and_items(params)
    with engine:
        problems = load_math500(dataset_spec(params.dataset, params.file))[0][:4]
        evaluate = builder_for(params.prompt, setup, engine.tokenizer)
        sweep = span_sweep._build(span_sweep.builders(params, setup, engine.tokenizer), params, "tiny", problems)
        for k, p in enumerate(problems):
            built = evaluate.build(p)
            assert sweep["none"][k].input_ids == sweep[("/", 0)][k].input_ids == built["none"].input_ids
            assert sweep[("/", 55)][k].input_ids == built["mless"].input_ids
            assert sweep[("/", 10)][k].input_ids != built["mless"].input_ids

"""Generations kept across stages (meaningless_tokens/generations.py): at the plan's one shape a row's tokens are its
own, so the sweep's count-0 and count-55 rows are evaluate's none and mless rows, generated once."""

import json
import random

import pytest

from meaningless_tokens import engines, generations
from tests.test_engine_shapes import engine_and_items, shape_params


def planned_engine(write_params, tiny_dirs, arch="llama", **cfg):
    """A transformers engine with the compiled path's shapes but no compilation (float32, CPU): what rows are kept at."""
    params = shape_params(write_params, tiny_dirs, arch, **cfg)
    engine, items = engine_and_items(params)
    engine.planned = True
    return engine, [it for it in items if it.condition != "arm"]


def run(engine, items, journal_path, rank=None, like=None) -> dict:
    engine.fit([(items, engine.cfg.max_new_tokens)], like=like)
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
    """An evaluate-like run (none, mless, mful) writes its kept rows; a sweep-like run (none, the mless prompt as
    `/x55`, another span as `/x10`) that adopts its shape and takes them generates only its `/x10` rows, and every row
    equals a run that takes nothing."""
    cfg = dict(n_samples=3, max_new_tokens=10, batch_size=4)
    engine, items = planned_engine(write_params, tiny_dirs, **cfg)
    with engine:
        evaluated = run(engine, items, tmp_path / "evaluate.jsonl")
        kept_path = tmp_path / "kept.jsonl"
        generations.write(kept_path, engine.row_key(), engine.shape,
                          [(it, *evaluated[it.key]) for it in items])
    assert engine.stats.get("reused", 0) == 0
    kept = generations.read(kept_path)
    assert kept.shape == engine.shape and len(kept.rows) == 9  # none, mless, mful of 3 problems
    by = {c: [it for it in items if it.condition == c] for c in ("none", "mless")}
    sweep = by["none"] + [engines.Item(it.index, "/x55", it.input_ids) for it in by["mless"]]
    sweep += [engines.Item(it.index, "/x10", it.input_ids[:-3] + it.input_ids[-2:]) for it in by["mless"]]

    def sweep_run(journal):
        engine, _ = planned_engine(write_params, tiny_dirs, **cfg)
        with engine:
            engine.fit([(sweep, engine.cfg.max_new_tokens)], like=kept.shape)
            taken = engine.take(kept)
            return run(engine, sweep, journal, rank=str, like=kept.shape), engine, taken

    reused, engine, taken = sweep_run(tmp_path / "sweep.jsonl")
    assert taken == 9 and engine.stats["reused"] == 6 and engine.stats["generated"] == 3
    for it in by["none"]:
        assert reused[it.key] == evaluated[it.key]
    for it in by["mless"]:
        assert reused[(it.index, "/x55")] == evaluated[(it.index, "mless")]

    monkeypatch.setenv("MLESS_REUSE", "0")
    fresh, engine, taken = sweep_run(tmp_path / "fresh.jsonl")
    assert taken == 0 and "reused" not in engine.stats and engine.stats["generated"] == 9
    assert fresh == reused and len(fresh) == 9


def test_only_greedy_unedited_rows_are_kept_and_damage_is_one_line(tmp_path):
    from meaningless_tokens.errors import ArtifactError

    key = {"version": generations.VERSION, "weights": "w", "settings": {"rows": 4}}
    shape = engines.Shape(4, 256, 300)
    rows = [(engines.Item(0, "none", (1, 2)), "a", 1, "eos"),
            (engines.Item(0, "arm", (1, 2, 3)), "b", 1, "eos"),
            (engines.Item(0, "none", (1, 2, 4), sample=0), "c", 1, "eos"),
            (engines.Item(-1, "filler", (1, 2, 5)), "d", 1, "eos"),
            (engines.Item(1, "/x10", (7, 8)), "e\x00\udc80", 2, "length")]
    path = tmp_path / "m.jsonl"
    generations.write(path, key, shape, rows)
    kept = generations.read(path)
    assert kept.key == key and kept.shape == shape and len(kept.rows) == 2
    assert kept.rows[generations.ids_digest((1, 2))] == ("a", 1, "eos")  # the ids, not the label
    assert kept.rows[generations.ids_digest((7, 8))] == ("e\x00\udc80", 2, "length")  # NUL, a lone surrogate
    header = json.loads(path.read_text().splitlines()[0])
    assert header["kept"] is True and header["shape"] == {"rows": 4, "width": 256, "cache_len": 300}
    assert generations.read(tmp_path / "absent.jsonl") is None
    with open(path, "a") as f:
        f.write('{"ids": "torn", "text": "x"')  # not what evaluate writes: a clear error, not a silent skip
    with pytest.raises(ArtifactError, match=r"m.jsonl line 4: not a file of kept generations"):
        generations.read(path)


def test_per_batch_shapes_keep_nothing(tiny_dirs, write_params, cache_dir, tmp_path):
    """The CPU's default (compile off): batches keep their own shapes, so no row is kept or taken, and the file says
    why (the same bytes whatever was generated: a rerun of evaluate does not rerun the sweep for nothing)."""
    engine, items = engine_and_items(shape_params(write_params, tiny_dirs, max_new_tokens=4, batch_size=4))
    none = [it for it in items if it.condition == "none"]
    with engine:
        out = run(engine, none, tmp_path / "j.jsonl")
        assert engine.shape is None and engine.row_key() is None
        generations.write(tmp_path / "m.jsonl", engine.row_key(), engine.shape, [(it, *out[it.key]) for it in none])
        kept = generations.read(tmp_path / "m.jsonl")
        assert kept.key is None and kept.rows == {} and kept.why == generations.NOT_KEPT
        assert engine.take(kept) == 0
    assert (tmp_path / "m.jsonl").read_text() == json.dumps(
        {"kept": False, "version": generations.VERSION, "why": generations.NOT_KEPT}, sort_keys=True) + "\n"


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_the_sweeps_count_0_and_55_prompts_are_evaluates_none_and_mless(arch, tiny_dirs, write_params, cache_dir):
    """What makes the store's hits: the same prompt ids in both stages (the default prompt, span '/' x 55)."""
    from meaningless_tokens import models
    from meaningless_tokens.dataset import dataset_spec, load_math500
    from meaningless_tokens.measures import sweep
    from meaningless_tokens.prompts import builder_for

    params = shape_params(write_params, tiny_dirs, arch)
    assert params.prompt.mless.count == 55 and "/" in params.sweep.tokens and 55 in params.sweep.counts
    setup = models.setup_for(params, "tiny")
    engine, _ = engine_and_items(params)
    with engine:
        problems = load_math500(dataset_spec(params.dataset, params.file))[0][:4]
        evaluate = builder_for(params.prompt, setup, engine.tokenizer)
        sweep = sweep._build(sweep.builders(params.prompt, params.sweep, setup, engine.tokenizer), "tiny", problems)
        for k, p in enumerate(problems):
            built = evaluate.build(p)
            assert sweep["none"][k].input_ids == sweep[("/", 0)][k].input_ids == built["none"].input_ids
            assert sweep[("/", 55)][k].input_ids == built["mless"].input_ids
            assert sweep[("/", 10)][k].input_ids != built["mless"].input_ids

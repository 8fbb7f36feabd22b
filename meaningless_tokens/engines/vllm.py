"""The vLLM engine: generation in worker processes (meaningless_tokens/vllm_engine.py); only the tokenizer is loaded
in the stage's process. It scores nothing: likelihood runs on the transformers engine."""

from __future__ import annotations

from typing import Iterator

from meaningless_tokens import models, sampling, vllm_engine
from meaningless_tokens.config import Evaluate
from meaningless_tokens.engines.base import Closing, Generated, Item, Scores, _common_settings
from meaningless_tokens.engines.transformers import stop_ids
from meaningless_tokens.errors import ConfigError


class VllmEngine(Closing):
    """vLLM in worker processes (meaningless_tokens/vllm_engine.py); only the tokenizer is loaded here."""

    def __init__(self, cfg: Evaluate, conditions: list[str], setup: models.ModelSetup, sampled: bool = True):
        from transformers import AutoConfig, AutoTokenizer, GenerationConfig

        self.cfg, self.setup, prepared = cfg, setup, setup.prepared
        self.device = setup.device
        self.trust = setup.spec.trust_remote_code
        self.tokenizer = AutoTokenizer.from_pretrained(prepared.path, local_files_only=True, trust_remote_code=self.trust)
        try:
            gen = GenerationConfig.from_pretrained(prepared.path, local_files_only=True)
        except OSError:  # no generation_config.json: the model config's, as from_pretrained builds it
            gen = GenerationConfig.from_model_config(
                AutoConfig.from_pretrained(prepared.path, local_files_only=True, trust_remote_code=self.trust))
        self.eos = stop_ids(gen, self.tokenizer)
        self.sampling = sampling.settings_for(cfg, gen) if sampled and cfg.sampling.n else None
        self.settings = {**_common_settings(cfg, setup, self.eos, self.device),
                         **vllm_engine.settings(cfg, conditions, setup)}
        self.stats: dict = {}
        self.batch_size = cfg.batch_size

    def close(self) -> None:
        """Nothing to remove: no model here, and the workers stop with `generate`'s generator."""

    def fit(self, groups: list[tuple[list[Item], int]], like=None) -> int:
        """The batch size of the journal's batches (vLLM schedules its own): auto is every row in one. `like` is
        ignored: vLLM has no plan shape."""
        if self.batch_size == "auto":
            self.batch_size = max(len(items) for items, _ in groups)
        return self.batch_size

    def row_key(self) -> None:
        """None: continuous batching puts a row in changing company, so no row is kept for another stage."""
        return None

    def take(self, kept) -> int:
        return 0

    def generate(self, batches: list[list[Item]], done: set) -> Iterator[list[Generated]]:
        cfg = self.cfg
        items = {":".join(map(str, it.key)): it for b in batches for it in b if it.key not in done}
        s = self.sampling
        # a sampled job carries its own seed (vLLM's per-request seed) and sampling values
        jobs = [(k, list(it.input_ids)) if it.sample < 0 else
                (k, list(it.input_ids), {"temperature": s["temperature"], "top_p": s["top_p"], "top_k": s["top_k"] or -1,
                                         "max_tokens": s["max_new_tokens"],
                                         "seed": vllm_engine.request_seed(sampling.sample_seed(
                                             s["seed"], it.index, it.condition, it.sample))})
                for k, it in items.items()]
        if not jobs:  # every generation is journaled or merged from shards: no engine to start
            return
        for job, ids, seconds in vllm_engine.generate(cfg, self.setup, self.settings, jobs, self.eos, self.stats):
            limit = cfg.max_new_tokens if items[job].sample < 0 else self.sampling["max_new_tokens"]
            text, n, reason = vllm_engine.cut(self.tokenizer, ids, self.eos, limit, cfg.stop_at_boxed)
            yield [(items[job], text, n, reason, seconds)]

    def loglikelihood(self, seqs, batch_tokens, arm=None, **kwargs) -> Scores:
        raise ConfigError("evaluate.engine: vllm generates only; teacher-forced likelihood runs on the transformers "
                          "engine (the likelihood stages, the sweep's likelihood and arm_tuning open it whatever "
                          "evaluate.engine says)")

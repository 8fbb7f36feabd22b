"""Tiny real models for tests: real transformers architectures from configs, random weights, and a
byte-level BPE tokenizer trained here on MATH-500 problems (so prompts tokenize like real text)."""

from __future__ import annotations

import json
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MATH500 = ROOT / "data" / "math500" / "test.jsonl"
ARCHS = ("llama", "qwen2", "gemma3")
# more decoder-only families of the installed transformers, each with an attention variant of its own:
# gemma2 (logit softcapping, alternating sliding/full layers), mistral (sliding window on every
# layer), qwen3 (q/k norms per head), olmo2 (q/k norms over all heads), phi3 (fused qkv projection,
# partial rotary), granite (attention/embedding multipliers); gemma3 mixes sliding and full layers
FAMILIES = ARCHS + ("gemma2", "mistral", "qwen3", "olmo2", "phi3", "granite")
WINDOW = 24  # sliding windows short enough that test prompts cross them


def train_tokenizer(out: Path, add_bos: bool):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    texts = [json.loads(line)["problem"] for line in MATH500.read_text().splitlines()]
    texts.append("Please reason step by step and put your final answer within \\boxed{}. / / / /")
    # <|endoftext|> too: transformers' Qwen2Tokenizer adds it when the vocabulary lacks it
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<pad>", "<bos>", "<eos>", "<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    if add_bos:  # Gemma prepends <bos>; the llama/qwen2 tokenizers of the shipped models add nothing
        tok.post_processor = processors.TemplateProcessing(
            single="<bos> $A", pair="<bos> $A $B", special_tokens=[("<bos>", tok.token_to_id("<bos>"))])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>")
    fast.save_pretrained(out)
    return fast


def build(arch: str, out: Path, layers: int = 4, max_positions: int = 4096) -> Path:
    """Save a tiny `arch` model (float32 safetensors + tokenizer) into `out` and return it."""
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, Gemma3TextConfig, LlamaConfig, Qwen2Config

    tokenizer = train_tokenizer(out, add_bos=arch.startswith("gemma"))
    common = dict(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=layers,
                  num_attention_heads=4, max_position_embeddings=max_positions, bos_token_id=tokenizer.bos_token_id,
                  eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    if arch == "llama":
        config = LlamaConfig(num_key_value_heads=2, **common)
    elif arch == "qwen2":
        config = Qwen2Config(num_key_value_heads=2, **common)
    elif arch == "gemma3":
        # a short window so that test prompts cross it, as long prompts do on the real model
        # layer types mixed as in the real model (5 sliding : 1 full there), a full layer among 0-2
        types = ["sliding_attention", "sliding_attention", "full_attention"] * layers
        config = Gemma3TextConfig(num_key_value_heads=1, head_dim=32, sliding_window=WINDOW,
                                  query_pre_attn_scalar=24, layer_types=types[:layers], **common)
    elif arch == "gemma2":  # a small cap so that capping changes the probabilities of random weights
        config = transformers.Gemma2Config(num_key_value_heads=2, head_dim=16, sliding_window=WINDOW,
                                           query_pre_attn_scalar=16, attn_logit_softcapping=0.05, **common)
    elif arch == "mistral":
        config = transformers.MistralConfig(num_key_value_heads=2, head_dim=16, sliding_window=WINDOW, **common)
    elif arch == "qwen3":
        config = transformers.Qwen3Config(num_key_value_heads=2, head_dim=16, **common)
    elif arch == "olmo2":
        config = transformers.Olmo2Config(num_key_value_heads=2, **common)
    elif arch == "phi3":
        config = transformers.Phi3Config(num_key_value_heads=2, partial_rotary_factor=0.5, **common)
    elif arch == "granite":
        config = transformers.GraniteConfig(num_key_value_heads=2, attention_multiplier=0.05, embedding_multiplier=4.0,
                                            residual_multiplier=0.5, logits_scaling=2.0, **common)
    else:
        raise ValueError(arch)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(out, safe_serialization=True)
    return out


# The paper's four models as tiny random stand-ins for the CPU dry run of the GPU profile (issue 20): each
# has its real model's layer count, query heads, kv heads and config family (Gemma-3-4b-it is the
# multimodal `gemma3` wrapper with its text model's 5 sliding : 1 full layer pattern and 1024-token window);
# only the widths are small (head_dim 4-16), so the head and layer indices the profile names exist.
PAPER_SHAPES = {  # name in profiles/gpu.yaml: (family, layers, query heads, kv heads, head_dim)
    "qwen2_5-math-1_5b": ("qwen2", 28, 12, 2, 8),
    "qwen2_5-math-7b": ("qwen2", 28, 28, 4, 4),
    "llama3_1-8b-instruct": ("llama", 32, 32, 8, 4),
    "gemma3-4b-it": ("gemma3", 34, 8, 4, 16),
}


def build_paper(name: str, out: Path) -> Path:
    """Save a tiny random model shaped like the paper's model `name` (PAPER_SHAPES) into `out`."""
    import torch
    from transformers import (AutoModelForCausalLM, Gemma3Config, Gemma3ForConditionalGeneration, Gemma3TextConfig,
                              LlamaConfig, Qwen2Config, SiglipVisionConfig)

    family, layers, heads, kv, head_dim = PAPER_SHAPES[name]
    tokenizer = train_tokenizer(out, add_bos=family == "gemma3")
    hidden = heads * head_dim if family != "gemma3" else 64
    common = dict(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden,
                  num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv,
                  max_position_embeddings=4096, bos_token_id=tokenizer.bos_token_id,
                  eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    if family == "gemma3":
        text = Gemma3TextConfig(head_dim=head_dim, query_pre_attn_scalar=head_dim, sliding_window=1024,
                                layer_types=[("full_attention" if (i + 1) % 6 == 0 else "sliding_attention")
                                             for i in range(layers)], **common)
        # a one-layer vision tower of 2x2 patches: the wrapper's shape, not its size (no image is ever fed)
        vision = SiglipVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                                    image_size=28, patch_size=14)
        config = Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4,
                              boi_token_index=len(tokenizer) - 1, eoi_token_index=len(tokenizer) - 1,
                              image_token_index=len(tokenizer) + 1)
        model = Gemma3ForConditionalGeneration(config).to(torch.float32)
    else:
        config = (Qwen2Config if family == "qwen2" else LlamaConfig)(**common)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.save_pretrained(out, safe_serialization=True)
    return out


def run_pipeline(params, root: Path) -> tuple[list[Path], list[Path]]:
    """dvc.yaml's stages up to the report in-process, in its order, for a project folder `root` with its params file
    and a model cache of its own (MLESS_CACHE): model by model each model stage whose `foreach` lists the model, then
    the others (figures, report); (figure files, report files)."""
    import importlib
    import os

    from meaningless_tokens import store

    names = store.STAGES[:store.STAGES.index("report") + 1]
    specs = {stage: store.dvc_stage(stage) for stage in names}
    module = {stage: importlib.import_module(spec["cmd"].split()[2]) for stage, spec in specs.items()}
    each = {stage: foreach_models(params, spec["foreach"]) for stage, spec in specs.items() if spec["foreach"]}
    before = os.environ.get("MLESS_CACHE")
    os.environ["MLESS_CACHE"] = str(root / "cache")
    try:
        for name in params.models:
            for stage, models in each.items():
                if name in models:
                    module[stage].run(params, name, root=root)
        figures, report = (module[stage].run(params, root=root) for stage in names if stage not in each)
        return figures, report
    finally:
        if before is None:
            os.environ.pop("MLESS_CACHE", None)
        else:
            os.environ["MLESS_CACHE"] = before


def foreach_models(params, foreach: str) -> list[str]:
    """The models a dvc.yaml `foreach: ${<dotted key>}` runs its stage for, read from `params`."""
    value = params
    for key in foreach.removeprefix("${").removesuffix("}").split("."):
        value = getattr(value, key)
    return list(value)


def hub_snapshot(cache_dir: Path, repo_id: str, commit: str, model_dir: Path) -> Path:
    """A model folder laid out in `<cache_dir>/hub` as huggingface_hub lays out a download of `repo_id` at `commit`
    (refs/main naming the commit, the files linked into snapshots/<commit>): the offline path reads it."""
    repo = cache_dir / "hub" / f"models--{repo_id.replace('/', '--')}"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    for f in model_dir.iterdir():
        os.symlink(f, snapshot / f.name)
    return snapshot


# The paper's models at their real widths (the hub's config.json values), for `make gpu-check`: random weights,
# the tests' tokenizer (its ids a subset of the vocabulary). `tiny=True` keeps each family, its query and kv head
# counts (so the GPU profile's chart heads exist) and its config keys, with tiny widths for the CPU.
REAL_CONFIGS = {
    "qwen2_5-math-1_5b": ("qwen2", dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                                        num_attention_heads=12, num_key_value_heads=2, vocab_size=151936,
                                        tie_word_embeddings=True, rope_theta=10000.0, max_position_embeddings=4096,
                                        rms_norm_eps=1e-6, sliding_window=4096, use_sliding_window=False)),
    "qwen2_5-math-7b": ("qwen2", dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28,
                                      num_attention_heads=28, num_key_value_heads=4, vocab_size=152064,
                                      tie_word_embeddings=False, rope_theta=10000.0, max_position_embeddings=4096,
                                      rms_norm_eps=1e-6, sliding_window=4096, use_sliding_window=False)),
    "llama3_1-8b-instruct": ("llama", dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                                           num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                                           tie_word_embeddings=False, rope_theta=500000.0,
                                           rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                         "high_freq_factor": 4.0,
                                                         "original_max_position_embeddings": 8192},
                                           max_position_embeddings=131072, rms_norm_eps=1e-5)),
    "gemma3-4b-it": ("gemma3", dict(hidden_size=2560, intermediate_size=10240, num_hidden_layers=34,
                                    num_attention_heads=8, num_key_value_heads=4, head_dim=256, vocab_size=262208,
                                    query_pre_attn_scalar=256, rope_theta=1_000_000.0, rope_local_base_freq=10000.0,
                                    rope_scaling={"rope_type": "linear", "factor": 8.0}, sliding_window=1024,
                                    final_logit_softcapping=None, attn_logit_softcapping=None,
                                    max_position_embeddings=131072, rms_norm_eps=1e-6)),
}


def real_config(name: str, tokenizer, tiny: bool = False):
    """The transformers config of the paper's model `name` (REAL_CONFIGS), special tokens from `tokenizer`; with
    `tiny`, head_dim 4 (Gemma 16), 6 layers and a 512-token vocabulary instead of the real widths."""
    from transformers import Gemma3Config, Gemma3TextConfig, LlamaConfig, Qwen2Config, SiglipVisionConfig

    family, values = REAL_CONFIGS[name]
    values = {**values, "bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
              "pad_token_id": tokenizer.pad_token_id}
    if tiny:
        head_dim = 16 if family == "gemma3" else 4
        hidden = values["num_attention_heads"] * head_dim
        values.update(hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=6, vocab_size=512,
                      **({"head_dim": head_dim, "query_pre_attn_scalar": head_dim} if family == "gemma3" else {}))
    if len(tokenizer) + 2 > values["vocab_size"]:
        raise ValueError(f"{name}: the tokenizer's {len(tokenizer)} ids do not fit a vocabulary of {values['vocab_size']}")
    if family == "qwen2":
        return Qwen2Config(**values)
    if family == "llama":
        return LlamaConfig(**values)
    # 5 sliding : 1 full layers, the multimodal wrapper with a one-layer vision tower of 2x2 patches (build_paper's)
    layers = values["num_hidden_layers"]
    text = Gemma3TextConfig(layer_types=[("full_attention" if (i + 1) % 6 == 0 else "sliding_attention")
                                         for i in range(layers)], **values)
    vision = SiglipVisionConfig(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                                image_size=28, patch_size=14)
    return Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4,
                        boi_token_index=len(tokenizer) - 1, eoi_token_index=len(tokenizer) - 1,
                        image_token_index=len(tokenizer) + 1)


def build_real(name: str, out: Path, tiny: bool = False, device: str = "cpu", dtype: str = "bfloat16") -> Path:
    """Save the paper's model `name` with its real config (real_config) and random weights into `out`: built on
    `device` (random init there: a 7B model initialises in seconds on a GPU, minutes on a CPU) in `dtype`."""
    import torch
    from transformers import AutoModelForCausalLM, Gemma3ForConditionalGeneration

    tokenizer = train_tokenizer(out, add_bos=REAL_CONFIGS[name][0] == "gemma3")
    config = real_config(name, tokenizer, tiny)
    torch.manual_seed(0)
    with torch.device(device):
        if REAL_CONFIGS[name][0] == "gemma3":
            model = Gemma3ForConditionalGeneration._from_config(config, dtype=getattr(torch, dtype))
        else:
            model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    model.save_pretrained(out, safe_serialization=True)
    del model
    return out

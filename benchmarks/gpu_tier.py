"""The CUDA tier's pytest plugin in `make gpu-check` (`pytest -p benchmarks.gpu_tier`): the cases in the order of
ORDER, so that a tier stopped at its time limit has run what only a GPU can check first, and the collected cases
written to the file named by $MLESS_TIER_COLLECTED (one node id a line, in the order they run) before the first
runs, so that a stopped tier names every case it did not run."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# test functions of tests/test_cuda.py, first to last; a case not named runs after these, in the file's order. First
# the quick cases that check what the CPU cannot (the draws' bits on CUDA, the stop criterion, the partial load's
# memory), then inductor's compiled ARM edit on CUDA (a cold compile each, checked nowhere else), then evaluate end
# to end (a cold compile of the decode step), and last the stage comparisons that repeat on CUDA a comparison the CPU
# bfloat16 case of the same test makes in every `make test`
ORDER = ("test_the_draws_uniforms_on_cuda_are_the_cpus_bit_for_bit",
         "test_the_boxed_stop_criterion_on_cuda",
         "test_partial_load_takes_a_fraction_of_the_cuda_memory",
         "test_the_compiled_arm_edit_fused_with_its_act_fn_on_cuda_is_the_eager_edit",
         "test_the_compiled_arm_edit_on_cuda_moves_what_the_cpu_does",
         "test_evaluate_with_arm_rows_and_the_boxed_stop",
         "test_likelihood_matches_the_cpu_in_float32",
         "test_activations_match_the_cpu_in_float32",
         "test_extract_matches_the_cpu_in_float32")


@pytest.hookimpl(trylast=True)  # after -m and -k have deselected
def pytest_collection_modifyitems(session, config, items):
    rank = {name: k for k, name in enumerate(ORDER)}
    items[:] = sorted(items, key=lambda item: rank.get(item.originalname or item.name, len(ORDER)))  # stable
    out = os.environ.get("MLESS_TIER_COLLECTED")
    if out:
        tmp = Path(out + ".tmp")
        tmp.write_text("".join(f"{item.nodeid}\n" for item in items))
        tmp.replace(out)

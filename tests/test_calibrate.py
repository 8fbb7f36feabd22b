"""`python -m meaningless_tokens.verify.calibrate`'s refusals, without a rerun: a variant the CPU cannot take is skipped
with one line naming it (never counted as agreement), an unknown variant is refused; the rerun itself is tested on the
shared tiny pipeline (tests/test_verify.py)."""

from __future__ import annotations

import pytest

from meaningless_tokens.verify import calibrate


@pytest.mark.parametrize("name,env,says", [
    ("mkl-avx512", {"MKL_CBWR": "AVX512"}, "MKL_CBWR=AVX512: this CPU lacks avx512f"),
    ("aten-avx512", {"ATEN_CPU_CAPABILITY": "avx512"}, "ATEN_CPU_CAPABILITY=avx512: this CPU lacks avx512f"),
    ("mkl-bogus", {"MKL_CBWR": "BOGUS"}, "MKL_CBWR=BOGUS: not a value it takes"),
    ("onednn-bogus", {"ONEDNN_MAX_CPU_ISA": "AVX9"}, "ONEDNN_MAX_CPU_ISA=AVX9: not a value it takes"),
])
def test_a_variant_the_cpu_cannot_take_is_named_and_skipped(name, env, says):
    assert calibrate.preflight(name, env, flags={"sse4_2", "avx", "avx2"}).startswith(says)


def test_a_variant_torch_does_not_follow_is_skipped():
    # torch reports its real thread count: a variant asking for another is not what ran
    why = calibrate.preflight("threads-0", {"OMP_NUM_THREADS": "not-a-number"}, flags=set())
    assert why.startswith("torch runs ") and "not not-a-number" in why
    assert calibrate.preflight("threads-1", {"OMP_NUM_THREADS": "1"}, flags=set()) == ""


def test_an_unknown_variant_is_one_line_and_exit_2(capsys):
    assert calibrate.main(["--variants", "aten-default,nosuch"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --variants: ['nosuch']: not a variant (aten-default, ") and err.count("\n") == 1

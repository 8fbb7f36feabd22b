"""The kind of quantity each value of an output is, and each kind's tolerance: TOLERANCES, and KINDS assembled from
what each measure declares (QUANTITIES in meaningless_tokens/measures/<stage>.py, the verdict's in report/verdict.py)."""

from __future__ import annotations

import fnmatch
import importlib
import pkgutil
from dataclasses import dataclass

from meaningless_tokens import measures, store
from meaningless_tokens.report import verdict


@dataclass(frozen=True)
class Tolerance:
    atol: float
    rtol: float
    covers: str


# One place for every tolerance: the kind of quantity -> numpy.isclose's atol and rtol. Chosen from measured
# cross-CPU and cross-instruction-set differences with a margin; a derived statistic's follows from its inputs'
# (docs/sharing.md#tolerances-and-their-basis).
TOLERANCES = {
    "exact": Tolerance(0.0, 0.0, "counts, token ids, indices, grades and accuracies, generated text, any non-float"),
    # rtol measured AVX2 against AVX-512 (docs/sharing.md): a weight of 0.486 moved by 9.3e-06, 93 % of atol alone
    "attention": Tolerance(1e-5, 5e-5, "attention weights and what is averaged from them: means, drops, span mass, "
                                       "lambda, their intervals (fractions, 0..1)"),
    "percent": Tolerance(1e-3, 0.0, "the same measures in percent (`*_pct`)"),
    # measured AVX2 against AVX-512 (docs/sharing.md): float32 sums of hundreds of weights move by 5.5e-05
    "attention-received": Tolerance(2e-4, 0.0, "the attention each position receives, summed over the queries "
                                               "(`recv_*`: up to a few hundred)"),
    "activation": Tolerance(1e-3, 5e-3, "layer 0's MLP activations (float16) and the measures and intervals "
                                        "computed from them"),
    "histogram": Tolerance(20.0, 1e-3, "counts of activations per histogram bin (a value on a bin edge moves to "
                                       "the next bin)"),
    "loglik": Tolerance(5e-4, 1e-4, "log-likelihoods, their sums and means, paired differences, intervals, "
                                    "p-values and shares"),
    # measured AVX2 against AVX-512 (docs/sharing.md): 8.0e-03 on a sum of -25.2 nats, beyond `loglik`
    "loglik-arm": Tolerance(5e-3, 1e-3, "log-likelihoods under ARM (`arm/*`): ARM's edit picks layer 0's "
                                        "activations by a threshold, and one on it goes the other way on other "
                                        "float kernels"),
    "residual": Tolerance(1e-3, 0.0, "a numerical check's residual recorded in provenance (the likelihood's "
                                     "`head_check_max_abs_diff`, which the stage requires below 1e-3)"),
    # the verdict's derived statistics (metrics/verdict.json): each from the tolerance t of the cells it reads
    "points": Tolerance(2e-3, 0.0, "the difference of two `percent` values in percentage points: the verdict's span "
                                   "growth (d)"),
    "pooled-points": Tolerance(5e-3, 0.0, "pooled estimates and intervals of the claims in percent or points (a)-(d)"),
    "tau2": Tolerance(0.01, 1e-3, "the between-model variance tau^2 of the claims in percent or points (a)-(d), "
                                  "points^2"),
    "i2": Tolerance(0.02, 0.0, "I^2, the share of the spread between models that is not sampling error (0..1)"),
    "p": Tolerance(1e-3, 0.05, "the verdict's p-values, each from its cell's estimate and interval"),
    "activation-points": Tolerance(0.1, 5e-3, "`activation` shares in percentage points (x 100): the verdict's "
                                              "near-zero shares (e1), (e2)"),
    "pooled-activation-points": Tolerance(0.25, 0.0125, "pooled estimates and intervals of (e1), (e2)"),
    "pooled-activation": Tolerance(2.5e-3, 0.0125, "pooled estimates and intervals of (e3), (e4)"),
    "pooled-loglik": Tolerance(2e-3, 4e-4, "pooled estimates and intervals of the likelihood claims (f2), "
                                                "(h1), (h2), nats"),
    "tau2-activation-points": Tolerance(0.15, 0.0, "tau^2 of (e1), (e2), points^2"),
    "tau2-activation": Tolerance(5e-5, 0.0, "tau^2 of (e3), (e4)"),
    "tau2-loglik": Tolerance(5e-5, 0.01, "tau^2 of (f2), (h1), (h2), nats^2"),
    "mde-loglik": Tolerance(3e-4, 0.0, "the power section's minimum detectable effects in nats per token (3 "
                                       "significant digits)"),
    # a string that prints numbers of a result: its text equal, each number within one unit of its last printed digit
    "printed": Tolerance(0.0, 0.0, "sentences and cells that print a result's numbers (the verdict's `md`, "
                                   "`detail`): the text equal, each number within one unit of its last digit"),
}
PRINTED = "printed"


def _glob(kind: str) -> str:
    """The file glob of artifact `kind` (store.PATHS), every model's."""
    named = "{name}" in store.PATHS[kind]
    return store.path(kind, "*" if named else None).as_posix()


VERDICT = _glob("verdict")

# Outputs that record a run (wall times, the machine), not a result: shown, never counted as differing. The
# folders of the run sidecars (store.PATHS' "timing/<stage>" kinds), so a revision's sidecar of a stage since
# renamed or removed is still one.
RUN_RECORDS = tuple(sorted({f"{store.path(kind, '*').parent.as_posix()}/*" for kind in store.PATHS
                            if kind.startswith("timing/")}))


def is_run_record(path: str) -> bool:
    """Whether an output file records a run (RUN_RECORDS), not a result."""
    return any(fnmatch.fnmatchcase(path, g) for g in RUN_RECORDS)


# Which kind a value belongs to: (file glob, key glob, kind), the first entry whose file glob matches the output
# file and whose key glob matches the dataset, key or column wins. In a key glob `*` and `?` are wildcards and
# brackets are literal (list items: `ci95[0]`, `claims[b]`). Floats take their kind's tolerance; strings are exact
# unless their kind is `printed`; integers and booleans are exact, histogram counts excepted. Each measure declares
# its own outputs' entries beside it (QUANTITIES in meaningless_tokens/measures/<stage>.py, the verdict's in
# report/verdict.py: artifact kinds of store.PATHS, each entry's file glob every model's); KINDS holds them between
# the entries for any file, which FIRST precede and LAST follow. CATCH_ALL comes last:
# tests/test_verify_kinds.py fails on a committed metrics key that only it, or another file's entry, matches.
CATCH_ALL = ("*", "*", "attention")
FIRST = (("*", "*head_check_max_abs_diff*", "residual"),)
LAST = (("*", "*_pct*", "percent"), CATCH_ALL)


def declared() -> tuple[tuple[str, str, str], ...]:
    """(file glob, key glob, kind) of every measure's QUANTITIES, the measures in their modules' name order, then
    the verdict's. Their files are each one measure's, so their order among measures decides nothing."""
    modules = [importlib.import_module(f"{measures.__name__}.{m.name}") for m in pkgutil.iter_modules(measures.__path__)]
    return tuple((_glob(kind), key, quantity) for module in [*modules, verdict]
                 for kind, key, quantity in getattr(module, "QUANTITIES", ()))


KINDS = FIRST + declared() + LAST
_unknown = sorted({k for *_, k in KINDS} - set(TOLERANCES))
if _unknown:
    raise ValueError(f"verify: QUANTITIES name no kind of TOLERANCES: {_unknown}")

def _match(file: str, key: str, file_glob: str, key_glob: str) -> bool:
    return fnmatch.fnmatchcase(file, file_glob) and fnmatch.fnmatchcase(key, key_glob.replace("[", "[[]"))


def kind_entry(file: str, key: str) -> tuple[str, str, str]:
    """The KINDS entry that gives the value at `key` of output `file` its kind."""
    return next(e for e in KINDS if _match(file, key, e[0], e[1]))


def kind_of(file: str, key: str) -> str:
    return kind_entry(file, key)[2]

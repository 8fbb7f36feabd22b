"""The kind of quantity each value of an output is, and each kind's tolerance: TOLERANCES, and KINDS assembled from
what each measure declares (QUANTITIES in meaningless_tokens/measures/<stage>.py, the verdict's in report/verdict.py)."""

from __future__ import annotations

import fnmatch
import importlib
import pkgutil

from meaningless_tokens import measures, store
from meaningless_tokens.report import verdict


from meaningless_tokens.tolerances import NOISE, TOLERANCES, Tolerance  # noqa: F401 - verify's names

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
# unless their kind is `printed`; integers and booleans are exact, counts past a threshold (`count`) excepted. Each measure declares
# its own outputs' entries beside it (QUANTITIES in meaningless_tokens/measures/<stage>.py, the verdict's in
# report/verdict.py: artifact kinds of store.PATHS, each entry's file glob every model's); KINDS holds them between
# the entries for any file, which FIRST precede and LAST follow. CATCH_ALL comes last:
# tests/test_verify_kinds.py fails on a committed metrics key that only it, or another file's entry, matches.
CATCH_ALL = ("*", "*", "attention")
FIRST = (("*", "*head_check_max_abs_diff*", "residual"),)
LAST = (("*", "*_pct*", "percent"), CATCH_ALL)
BOUNDED = ("count", "rank-p")  # kinds whose float noise is recorded beside each value (`<name>_noise`)


def declared() -> tuple[tuple[str, str, str], ...]:
    """(file glob, key glob, kind) of every measure's QUANTITIES, the measures in their modules' name order, then
    the verdict's. Their files are each one measure's, so their order among measures decides nothing."""
    modules = [importlib.import_module(f"{measures.__name__}.{m.name}") for m in pkgutil.iter_modules(measures.__path__)]
    return tuple((_glob(kind), key, quantity) for module in [*modules, verdict]
                 for kind, key, quantity in getattr(module, "QUANTITIES", ()))


def noise_entries(entries) -> tuple[tuple[str, str, str], ...]:
    """The `<name>_noise` beside each value of a bounded kind, in the same file: kind `noise`. Derived from the
    declarations, so each precedes the entry of its own file that would otherwise take it (`*/hist_*` matches
    `none/hist_original_noise` too)."""
    return tuple((f, f"{k}{NOISE}", "noise") for f, k, kind in entries if kind in BOUNDED)


KINDS = FIRST + noise_entries(declared()) + declared() + LAST
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

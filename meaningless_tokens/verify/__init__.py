"""Did the workspace's outputs reproduce a revision's? `python -m meaningless_tokens.verify [REV]` (`make verify`).

compare.py: two copies of a file by value, within the tolerance of each kind of quantity (KINDS: file glob, key glob,
kind; printed numbers to one unit of their last digit), pure: no git, no DVC;
driver.py: every output of dvc.lock against the revision's, read through DVC, the table and the verdict.
"""

from meaningless_tokens.verify.compare import (CATCH_ALL, KINDS, PRINTED, PROVENANCE_KEYS, RUN_KEYS, TOLERANCES, Largest,
                                               Tolerance, compare_arrays, compare_csv, compare_file, compare_h5,
                                               compare_json, compare_printed, kind_entry, kind_of)
from meaningless_tokens.verify.driver import (DIFFERS, DRAWN, IDENTICAL, MISSING, NOT_COMPARED, RUN_RECORD,
                                              RUN_RECORDS, WITHIN, Output, Verifier, main, table, verdict)

__all__ = ["CATCH_ALL", "DIFFERS", "DRAWN", "IDENTICAL", "KINDS", "MISSING", "NOT_COMPARED", "PRINTED", "PROVENANCE_KEYS", "RUN_KEYS",
           "RUN_RECORD", "RUN_RECORDS", "TOLERANCES", "WITHIN", "Largest", "Output", "Tolerance", "Verifier",
           "compare_arrays", "compare_csv", "compare_file", "compare_h5", "compare_json", "compare_printed", "kind_entry", "kind_of", "main", "table",
           "verdict"]

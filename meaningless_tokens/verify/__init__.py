"""Did the workspace's outputs reproduce a revision's? `python -m meaningless_tokens.verify [REV]` (`make verify`).

kinds.py: the kind of quantity each value is (KINDS: file glob, key glob, kind, from what each measure declares) and
each kind's tolerance;
compare.py: two copies of a file by value, within the tolerance of each value's kind (printed numbers to one unit of
their last digit), pure: no git, no DVC;
reference.py: the run's cached outputs described in git, and compared from that description;
conclusions.py: the two runs' verdict files, judged apart from their last digits (words, signs, Holm decisions, each
estimate within a tenth of its standard error);
driver.py: every output of dvc.lock against the revision's, read through DVC, the table and the verdict.
"""

from meaningless_tokens.verify.compare import (PROVENANCE_KEYS, RUN_KEYS, Largest, compare_arrays, compare_csv,
                                               compare_file, compare_h5, compare_json, compare_printed)
from meaningless_tokens.verify.kinds import (CATCH_ALL, KINDS, PRINTED, RUN_RECORDS, TOLERANCES, Tolerance, kind_entry,
                                            kind_of)
from meaningless_tokens.verify.driver import (BEYOND, DIFFERS, DRAWN, EXIT, IDENTICAL, MISSING, NOT_COMPARED, RUN_RECORD, WITHIN,
                                             Output, Verifier, main, table, verdict)

__all__ = ["BEYOND", "CATCH_ALL", "DIFFERS", "EXIT", "DRAWN", "IDENTICAL", "KINDS", "MISSING", "NOT_COMPARED", "PRINTED", "PROVENANCE_KEYS", "RUN_KEYS",
           "RUN_RECORD", "RUN_RECORDS", "TOLERANCES", "WITHIN", "Largest", "Output", "Tolerance", "Verifier",
           "compare_arrays", "compare_csv", "compare_file", "compare_h5", "compare_json", "compare_printed", "kind_entry", "kind_of", "main", "table",
           "verdict"]

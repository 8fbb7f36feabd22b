"""meaningless_tokens/store.py: file modes of atomic writes, and the provenance a stage records."""

from __future__ import annotations

import hashlib
import os

import pytest
import yaml

from meaningless_tokens.config import StageError
from meaningless_tokens.store import ROOT, atomic_path, provenance, run_info, write_timing


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o027, 0o640), (0o002, 0o664)])
def test_atomic_writes_get_the_mode_any_tool_gives_not_mkstemps(tmp_path, umask, mode):
    old = os.umask(umask)
    try:
        with atomic_path(tmp_path / "out.txt") as tmp:
            assert (tmp.stat().st_mode & 0o777) == 0o600  # mkstemp's, while it is being written
            tmp.write_text("x")
    finally:
        os.umask(old)
    assert ((tmp_path / "out.txt").stat().st_mode & 0o777) == mode


def test_a_failed_write_leaves_nothing(tmp_path):
    with pytest.raises(RuntimeError):
        with atomic_path(tmp_path / "out.txt") as tmp:
            tmp.write_text("half")
            raise RuntimeError("interrupted")
    assert list(tmp_path.iterdir()) == []


def test_provenance_records_the_code_the_stage_declares_by_content():
    spec = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]["evaluate"]["do"]
    declared = {d for d in spec["deps"] if d.startswith("stages/")}
    prov = provenance("evaluate")
    assert set(prov["code_sha256"]) == declared
    for path, digest in prov["code_sha256"].items():
        assert digest == hashlib.sha256((ROOT / path).read_bytes()).hexdigest()
    assert "git_commit" not in prov and "git_dirty" not in prov
    # a folder dep (the report's charts) counts every file in it; a file dep only itself (its templates, not
    # the explorer's beside them)
    report = provenance("report")["code_sha256"]
    assert {p for p in report if p.startswith("meaningless_tokens/charts/")} == {
        f"meaningless_tokens/charts/{p.name}" for p in (ROOT / "stages/charts").iterdir() if p.is_file()}
    assert {p for p in report if p.startswith("meaningless_tokens/templates/")} == {
        "meaningless_tokens/templates/report.html.j2", "meaningless_tokens/templates/report.md.j2"}


def test_provenance_of_a_stage_dvc_yaml_does_not_define_names_the_file_and_key():
    with pytest.raises(StageError, match=r"dvc\.yaml: stages\.no-such-stage: cannot read the stage's deps"):
        provenance("no-such-stage")


def test_the_git_commit_goes_to_the_runs_sidecar(tmp_path):
    info = run_info()
    assert set(info) == {"git_commit", "git_dirty"}
    assert len(info["git_commit"]) == 40 or info["git_commit"] == "unknown"
    write_timing(tmp_path / "metrics/timing/x.json", {"seconds": 1.5})
    import json

    assert json.loads((tmp_path / "metrics/timing/x.json").read_text()) == {"seconds": 1.5, **info}


def test_every_stage_declares_the_code_it_imports():
    """A stage's artifacts record the hashes of the code files it lists (provenance, dvc.lock): each module of
    `stages/` that its command imports, directly or not, must be among them, or a change to it would neither
    rerun the stage nor show in its provenance."""
    import subprocess
    import sys

    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    missing = {}
    for name, spec in stages.items():
        spec = spec.get("do", spec)
        module = spec["cmd"].split()[2]  # python -m stages.<module> ...
        declared = [d for d in spec["deps"] if d.startswith("stages/")]
        probe = (f"import sys, {module}; print('\\n'.join(sorted(m.__file__ for k, m in sys.modules.items() "
                 f"if k.startswith('stages.') and getattr(m, '__file__', None))))")
        out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True).stdout
        # not the params schema, the command line or the progress bars: they never change an output's bytes
        imported = {os.path.relpath(p, ROOT) for p in out.split() if not p.endswith("__init__.py")} - {
            "meaningless_tokens/config.py", "meaningless_tokens/cli.py", "meaningless_tokens/progress.py"}
        missing[name] = [p for p in sorted(imported) if not any(p == d or p.startswith(d.rstrip("/") + "/") for d in declared)]
    assert not any(missing.values()), {k: v for k, v in missing.items() if v}

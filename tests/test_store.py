"""meaningless_tokens/store/: file modes of atomic writes, and the provenance a stage records."""

from __future__ import annotations

import hashlib
import os

import pytest
import yaml

from meaningless_tokens.errors import StageError
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
    declared = {d for d in spec["deps"] if d.startswith(("stages/", "meaningless_tokens/"))}
    prov = provenance("evaluate")
    files = {f.relative_to(ROOT).as_posix() for d in declared if (ROOT / d).is_dir()  # a package: each of its files
             for f in (ROOT / d).rglob("*") if f.is_file() and "__pycache__" not in f.parts}
    assert set(prov["code_sha256"]) == {d for d in declared if not (ROOT / d).is_dir()} | files
    for path, digest in prov["code_sha256"].items():
        assert digest == hashlib.sha256((ROOT / path).read_bytes()).hexdigest()
    assert "git_commit" not in prov and "git_dirty" not in prov
    # a folder dep (the report's charts) counts every file in it; a file dep only itself (its templates, not
    # the explorer's beside them)
    report = provenance("report")["code_sha256"]
    assert {p for p in report if p.startswith("meaningless_tokens/charts/")} == {
        f"meaningless_tokens/charts/{p.name}" for p in (ROOT / "meaningless_tokens/charts").iterdir()
        if p.is_file() and p.suffix in (".py", ".yaml")}  # the chart code
    assert {p for p in report if p.startswith("meaningless_tokens/report/")} == {
        f"meaningless_tokens/report/{p.name}" for p in (ROOT / "meaningless_tokens/report").iterdir()
        if p.is_file() and p.suffix in (".py", ".yaml")}  # the verdict's code and the paper's numbers beside it
    assert {p for p in report if p.startswith("meaningless_tokens/templates/")} == {
        "meaningless_tokens/templates/report.html.j2", "meaningless_tokens/templates/report.md.j2",
        "meaningless_tokens/templates/results.md.j2", "meaningless_tokens/templates/verdict.j2"} | {
        f"meaningless_tokens/templates/charts/{p.name}" for p in (ROOT / "meaningless_tokens/templates/charts").iterdir()}


def test_provenance_of_a_stage_dvc_yaml_does_not_define_names_the_file_and_key():
    with pytest.raises(StageError, match=r"dvc\.yaml: stages\.no-such-stage: cannot read the stage"):
        provenance("no-such-stage")


def test_the_git_commit_goes_to_the_runs_sidecar(tmp_path):
    import torch

    info = run_info()
    assert set(info) == {"git_commit", "git_dirty", "cpu_model", "cpu_capability", "threads", "device"}
    assert len(info["git_commit"]) == 40 or info["git_commit"] == "unknown"
    # the machine facts `python -m meaningless_tokens.verify` prints when an output is not identical
    assert info["cpu_capability"] == torch.backends.cpu.get_cpu_capability() and info["threads"] == torch.get_num_threads()
    assert info["device"] == "cpu" and info["cpu_model"]
    import json

    import psutil

    held = psutil.Process().memory_info().rss / 2**20  # before the sidecar is written: later imports grow it
    write_timing(tmp_path / "metrics/timing/x.json", {"seconds": 1.5})
    got = json.loads((tmp_path / "metrics/timing/x.json").read_text())
    peak = got.pop("peak_rss_mb")  # the process's peak resident memory so far, MiB: at least what it held then
    assert got == {"seconds": 1.5, **info}
    assert held - 1 <= peak < 1 << 20


NOT_CODE = ("meaningless_tokens/config", "meaningless_tokens/errors.py", "meaningless_tokens/cli.py",
            "meaningless_tokens/progress.py", "stages/__init__.py", "meaningless_tokens/__init__.py")


def _docstring_only(path: str) -> bool:
    """A package's __init__ that holds its docstring alone (measures/, results/): no code a stage runs."""
    import ast

    body = ast.parse((ROOT / path).read_text()).body
    return path.endswith("__init__.py") and len(body) == 1 and isinstance(body[0], ast.Expr)


def test_every_stage_declares_the_code_it_imports():
    """A stage's artifacts record the hashes of the code files it lists (provenance, dvc.lock): each module of
    `stages/` and `meaningless_tokens/` that its command imports, directly or not, must be among them, or a change
    to it would neither rerun the stage nor show in its provenance; and a stage lists no module it does not
    import (a change to it would rerun the stage for nothing), save the capture the model probe imports when
    it runs."""
    import subprocess
    import sys

    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    missing, extra = {}, {}
    for name, spec in stages.items():
        spec = spec.get("do", spec)
        module = spec["cmd"].split()[2]  # python -m stages.<module> ...
        declared = [d for d in spec["deps"] if d.startswith(("stages/", "meaningless_tokens/"))]
        # a stage that opens an engine imports the backend params name when it opens it: it depends on every one
        opens = ("e = sys.modules.get('meaningless_tokens.engines'); [e.backend(n) for n in (e.BACKENDS if e else ()) if "
                 "any(getattr(m, 'open_engine', None) is e.open_engine for k, m in list(sys.modules.items()) "
                 "if k != e.__name__)]; ")
        probe = (f"import sys, {module}; {opens}print('\\n'.join(sorted(m.__file__ for k, m in sys.modules.items() "
                 f"if k.split('.')[0] in ('stages', 'meaningless_tokens') and getattr(m, '__file__', None))))")
        out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True).stdout
        # not the params schema, the exceptions, the command line or the progress bars: they never change an output's
        # bytes; nor the two top packages' __init__ (a package's own, as models/__init__.py, is code the stage runs)
        imported = {p for p in (os.path.relpath(p, ROOT) for p in out.split()) if not p.startswith(NOT_CODE) and not _docstring_only(p)}
        missing[name] = [p for p in sorted(imported) if not any(p == d or p.startswith(d.rstrip("/") + "/") for d in declared)]
        lazy = {"meaningless_tokens/capture.py"} if "meaningless_tokens/models/probe.py" in imported else set()
        extra[name] = [d for d in declared if d.endswith(".py") and d not in imported | lazy]
    assert not any(missing.values()), {k: v for k, v in missing.items() if v}
    assert not any(extra.values()), {k: v for k, v in extra.items() if v}


def test_stages_holds_exactly_the_stage_modules():
    """stages/ is what dvc.yaml runs, one module per stage; the shared code lives in meaningless_tokens/."""
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    run = {(s.get("do", s))["cmd"].split()[2] for s in stages.values()}
    assert all(m.startswith("stages.") for m in run), run
    here = {f"stages.{p.stem}" for p in (ROOT / "stages").iterdir() if p.suffix == ".py" and p.stem != "__init__"}
    assert here == run, {"not a stage": sorted(here - run), "missing": sorted(run - here)}
    assert not [p.name for p in (ROOT / "stages").iterdir() if p.is_dir() and p.name != "__pycache__"]


def _imports(path) -> set[str]:
    """The project modules a file imports, at module level or inside a function."""
    import ast

    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in ("stages", "meaningless_tokens"):
            subs = [f"{node.module}.{a.name}" for a in node.names]
            found |= {m for m in subs if _module_file(m)} or {node.module}
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] in ("stages", "meaningless_tokens")}
    return found


def _module_file(module: str):
    base = ROOT.joinpath(*module.split("."))
    return next((p for p in (base.with_suffix(".py"), base / "__init__.py") if p.is_file()), None)


def test_the_import_graph_keeps_its_layers():
    """No library module imports a stage; no stage imports another stage; the library's imports form no cycle."""
    graph = {}
    for path in sorted([*(ROOT / "meaningless_tokens").rglob("*.py"), *(ROOT / "stages").glob("*.py")]):
        rel = path.relative_to(ROOT).with_suffix("")
        module = ".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)
        graph[module] = {m for m in _imports(path) if m != module}
    from meaningless_tokens import LAYERS

    layer = {f"meaningless_tokens.{m}": k for k, names in enumerate(LAYERS) for m in names}

    def level(module: str) -> int:
        parts = module.split(".")
        return layer[".".join(parts[:2])] if len(parts) > 1 else -1  # the package itself: TEMPLATES, LAYERS

    library = [m for m in graph if m.startswith("meaningless_tokens.")]
    assert sorted({".".join(m.split(".")[:2]) for m in library}) == sorted(layer), "LAYERS lists every module once"
    upward = {m: sorted(d for d in graph[m] if d.startswith("stages") or level(d) > level(m)) for m in library}
    assert not any(upward.values()), {m: d for m, d in upward.items() if d}
    sideways = {m: sorted(d for d in deps if d.startswith("stages.")) for m, deps in graph.items() if m.startswith("stages.")}
    assert not any(sideways.values()), {m: d for m, d in sideways.items() if d}
    # a package imports its submodules (charts/__init__ lists the chart kinds): not an edge back up
    library = {m: {d for d in deps if d in graph and not d.startswith(m + ".")} for m, deps in graph.items()
               if m.startswith("meaningless_tokens")}
    state: dict[str, int] = {}

    def visit(m: str, trail: list[str]) -> None:
        state[m] = 1
        for d in sorted(library.get(m, ())):
            if state.get(d) == 1:
                raise AssertionError(f"import cycle: {' -> '.join(trail[trail.index(d):] + [d])}")
            if d not in state:
                visit(d, trail + [d])
        state[m] = 2

    for m in library:
        if m not in state:
            visit(m, [m])
    assert len(library) > 20 and sum(map(len, library.values())) > 40  # the walk saw the real graph


def test_every_output_dvc_yaml_declares_has_its_path_in_the_table():
    """store.PATHS names every file a stage writes: dvc.yaml's outs and metrics, with ${key}/${item} as {name}. The
    reference, which describes those files for `make verify`, is verify's and named there: store is a dependency of
    every stage, so a path of verify's in it would tie each stage to verify."""
    from meaningless_tokens.store import PATHS
    from meaningless_tokens.verify.reference import FOLDER

    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    templates = set(PATHS.values()) | {FOLDER}
    missing = []
    for stage, spec in stages.items():
        for entry in (spec.get("do") or spec).get("outs", []) + (spec.get("do") or spec).get("metrics", []):
            out = next(iter(entry)) if isinstance(entry, dict) else entry
            template = out.replace("${key}", "{name}").replace("${item}", "{name}")
            if template not in templates:
                missing.append(f"{stage}: {out}")
    assert not missing, f"dvc.yaml outputs not in store.PATHS: {missing}"


def test_the_stage_order_and_the_run_sidecars_are_dvc_yaml_s():
    """store.STAGES is dvc.yaml's stages in its order, and PATHS' `timing/<stage>` kinds are exactly its model stages
    (each a foreach): each declares its sidecar in `metrics:`, which the path table reads from there."""
    from meaningless_tokens.store import PATHS, STAGES

    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    assert STAGES == tuple(stages)
    timing = [kind.removeprefix("timing/") for kind in PATHS if kind.startswith("timing/")]
    assert timing == [s for s in STAGES if "foreach" in stages[s]] and "prepare" in timing and "figures" not in timing


def test_a_stage_reading_a_params_key_dvc_yaml_does_not_list_for_it_fails():
    """Every stage reads params through store.params_view (the stage tests run each stage so): a key its dvc.yaml
    entry does not list raises, naming the stage and the key."""
    from meaningless_tokens.config import load_params
    from meaningless_tokens.store import params_view
    from meaningless_tokens.errors import UnlistedParam

    params = load_params(ROOT / "params.yaml")
    name = next(iter(params.models))
    view = params_view(params, "sweep", name)
    assert view.sweep.counts == params.sweep.counts and view.models[name].heads == params.models[name].heads
    assert view.prompt.mless.placement == params.prompt.mless.placement and view.file == params.file
    for read, key in ((lambda: view.evaluate.n_samples, "evaluate.n_samples"), (lambda: view.prompt.mful, "prompt.mful"),
                      (lambda: view.models[name].layers, f"models.{name}.layers"), (lambda: view.figures, "figures")):
        with pytest.raises(UnlistedParam, match=rf"stage 'sweep' reads params key '{key}', which dvc.yaml does not list"):
            read()
    # a derived copy (the sweep's span prompts) stays restricted
    copy = view.prompt.model_copy(update={"conditions": ["none", "mless"]})
    with pytest.raises(UnlistedParam, match="'prompt.mful'"):
        copy.mful
    # the list a foreach names is readable (the stage checks its model is listed), other models are not there
    assert name in params_view(params, "evaluate", name).evaluated
    assert set(params_view(params, "evaluate", name).models) == {name}


def test_the_params_an_artifact_records_are_exactly_those_dvc_yaml_lists():
    from meaningless_tokens.config import load_params
    from meaningless_tokens.store import dvc_stage, params_keys, stage_params

    params = load_params(ROOT / "params.yaml")
    name = next(iter(params.models))

    def flat(d, prefix=""):
        for k, v in d.items():
            yield from (flat(v, f"{prefix}{k}.") if isinstance(v, dict) and v else [f"{prefix}{k}"])

    for stage in ("extract", "evaluate", "stats", "activations", "sweep", "likelihood"):
        assert dvc_stage(stage)["params"], stage
        recorded = set(flat(stage_params(params, stage, name)))
        for key in params_keys(stage, name):
            assert any(r == key or r.startswith(key + ".") for r in recorded), (stage, key)
        for r in recorded:
            assert any(r == key or r.startswith(key + ".") for key in params_keys(stage, name)), (stage, r)
    assert "arm" not in stage_params(params, "evaluate", name, unused=("arm",))


def test_the_stages_read_dvc_yaml_as_dvc_resolves_it(tmp_path):
    """store.dvc_stage reads dvc.yaml as DVC does: for every stage DVC generates (arm_tuning's too, its models listed
    here), the params keys and deps the project reads, `${key}` / `${item}` replaced by the model, are exactly those
    DVC tracks: anchors and aliases resolved, a `params.yaml: [...]` group's keys included."""
    import shutil

    from dvc.dependency.param import ParamsDependency
    from dvc.repo import Repo

    from meaningless_tokens.store import dvc_stage, params_keys

    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    raw["arm_tuning"]["models"] = raw["likelihood"]["models"][:1]
    shutil.copy(ROOT / "dvc.yaml", tmp_path / "dvc.yaml")
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    Repo.init(tmp_path, no_scm=True).close()
    seen = set()
    with Repo(tmp_path) as repo:
        for st in repo.index.stages:
            group, _, name = st.name.partition("@")
            seen.add(group)
            spec = dvc_stage(group)
            tracked = {p.def_path: set(p.params) for p in st.deps if isinstance(p, ParamsDependency)}
            keys = set(params_keys(group, name or None))
            assert tracked == ({"params.yaml": keys} if keys else {}), st.name  # the reference reads no params
            assert len(params_keys(group, name or None)) == len(set(params_keys(group, name or None))), st.name
            deps = {d.def_path for d in st.deps if not isinstance(d, ParamsDependency)}
            assert deps == {d.replace("${key}", name).replace("${item}", name) for d in spec["deps"]}, st.name
    assert seen == set(yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"])
    assert "arm_tuning" in seen and "models.${key}.family" in params_keys("extract")


@pytest.mark.parametrize("entry, says", [
    ("- other.yaml: [seed]", r"other\.yaml: \['seed'\]; the stages read params\.yaml only"),
    ("- params.yaml: []", r"params\.yaml: \[\]; the stages read params\.yaml only, and a group lists its keys"),
    ("- ${chosen}.seed", r"'\$\{chosen\}\.seed'; the stages expand only \$\{key\} and \$\{item\}"),
    ("- params.yaml: [stats, 3]", r"3; the stages expand only \$\{key\} and \$\{item\}"),
])
def test_a_params_entry_the_stages_cannot_read_as_dvc_does_is_refused(tmp_path, monkeypatch, entry, says):
    """A form DVC reads one way and the stages another (another params file, a whole file, a `vars` or params.yaml
    interpolation) would have a stage read other keys than DVC tracks: one line naming the file and the stage."""
    from meaningless_tokens.store import params_keys, stages

    text = (ROOT / "dvc.yaml").read_text()
    listed = "      params: [stats]\n"
    assert text.count(listed) == 1
    (tmp_path / "dvc.yaml").write_text(text.replace(listed, f"      params:\n        - stats\n        {entry}\n"))
    monkeypatch.setattr(stages, "DVC_YAML", tmp_path / "dvc.yaml")
    with pytest.raises(StageError, match=rf"^{tmp_path}/dvc\.yaml: stages\.stats\.params: .*{says}"):
        params_keys("stats", "any")
    params_keys("extract", "any")  # the other stages still read


def test_a_dep_the_stages_cannot_expand_is_refused(tmp_path, monkeypatch):
    from meaningless_tokens.store import code_hashes, stages

    text = (ROOT / "dvc.yaml").read_text()
    (tmp_path / "dvc.yaml").write_text(text.replace("deps: [stages/stats.py,", "deps: [stages/stats.py, \"${lib}/store\","))
    monkeypatch.setattr(stages, "DVC_YAML", tmp_path / "dvc.yaml")
    with pytest.raises(StageError, match=r"stages\.stats\.deps: '\$\{lib\}/store'; the stages expand only"):
        code_hashes("stats")


@pytest.mark.parametrize("stage", ["figures", "report", "explorer"])
def test_figures_report_and_explorer_read_only_the_keys_dvc_yaml_lists(tmp_path, monkeypatch, stage):
    """The stages without a model have a params view too: each key they read is listed (the charts' model lists
    included), any other raises; a stage whose list lacks what it reads fails at that read with UnlistedParam."""
    import importlib

    from meaningless_tokens.config import load_params
    from meaningless_tokens.errors import UnlistedParam
    from meaningless_tokens.store import params_keys, params_view, stages

    params = load_params(ROOT / "params.yaml")
    view = params_view(params, stage)
    assert view.models == params.models and view.figures == params.figures and view.file == params.file
    if stage in ("figures", "report"):  # the charts' Context reads which models were evaluated and scored
        assert (view.evaluated, view.scored) == (params.evaluated, params.scored)
    if stage == "report":  # and the verdict which were tuned
        assert view.arm_tuning.models == params.arm_tuning.models
    with pytest.raises(UnlistedParam, match=rf"stage '{stage}' reads params key 'sweep', which dvc.yaml does not"):
        view.sweep
    # the stage itself, its list emptied: its first read raises before any artifact is opened
    text = (ROOT / "dvc.yaml").read_text()
    data = yaml.safe_load(text)
    data["stages"][stage]["params"] = []
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    monkeypatch.setattr(stages, "DVC_YAML", tmp_path / "dvc.yaml")
    assert params_keys(stage) == []
    module = importlib.import_module(f"stages.{stage}")
    with pytest.raises(UnlistedParam, match=rf"stage '{stage}' reads params key '(figures|models)'"):
        module.run(params_view(params, stage), root=tmp_path / "out")
    assert not (tmp_path / "out").exists()

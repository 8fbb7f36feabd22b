"""Writing artifacts: atomic (temporary file, then rename) and deterministic."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import tempfile
from pathlib import Path

from meaningless_tokens.errors import ArtifactError, NonFiniteError, OutputError, StageError, UnlistedParam


def os_reason(e: OSError) -> str:
    """The reason of an OSError in a few words: its strerror, or the errno h5py buries in its message."""
    import re

    if e.errno:
        return os.strerror(e.errno)
    m = re.search(r"errno = (\d+)", str(e))
    if m:
        return os.strerror(int(m.group(1)))
    return " ".join(str(e.strerror or e).split())[:300] or type(e).__name__


def os_error_line(e: OSError) -> str:
    """`<path>: <reason>` of an OSError (the command line's `error:` line for a filesystem fault)."""
    return f"{e.filename if e.filename is not None else '?'}: {os_reason(e)}"


def fs_error(e: OSError, path: str | os.PathLike) -> OutputError:
    """`<path>: <reason>` for an OSError met while writing `path` (the OSError's own file where it names one)."""
    return OutputError(f"{e.filename or path}: {os_reason(e)}")


@contextlib.contextmanager
def atomic_path(final: str | os.PathLike):
    """Yield a temporary path beside `final`; rename it onto `final` only if the block succeeds.

    A crash or Ctrl-C leaves the old `final` (or nothing) in place, never a half-written file; a temporary
    file a killed run left behind (`.<name>.*.partial`) is removed when the next writer of `final` starts.
    A filesystem fault (full disk, read-only or missing folder, permission denied) is an OutputError naming the
    file. The file gets the mode any tool's output gets (0666 less the umask: 0644 with the usual 022), not
    mkstemp's private 0600, so a shared workspace or a web server can read what the pipeline wrote.
    """
    final = Path(final)
    try:
        final.parent.mkdir(parents=True, exist_ok=True)
        for stale in final.parent.glob(f".{glob_escape(final.name)}.*.partial"):
            stale.unlink(missing_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{final.name}.", suffix=".partial", dir=final.parent)
        os.close(fd)
    except OSError as e:
        raise fs_error(e, final) from None
    tmp = Path(tmp)
    try:
        yield tmp
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, final)
    except OSError as e:
        raise fs_error(e, final) from None
    finally:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass


def glob_escape(name: str) -> str:
    import glob

    return glob.escape(name)


def _umask() -> int:
    """The process's umask (read without changing it where /proc says it; else set and restore)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_json_atomic(path: str | os.PathLike, data) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False) + "\n")


def write_csv_atomic(path: str | os.PathLike, header: list[str], rows) -> None:
    """A CSV table (the ones `dvc plots` draws), "\n" line ends whatever the platform."""
    import csv
    import io

    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(header)
    w.writerows(rows)
    with atomic_path(path) as tmp:
        tmp.write_text(buf.getvalue())


# ---- HDF5 -------------------------------------------------------------------------------------

FORMAT_VERSION = 1


_WRITING: dict[str, Path] = {}  # temporary file name -> the artifact it becomes, while write_h5 holds it open


@contextlib.contextmanager
def write_h5(final: str | os.PathLike):
    """An HDF5 file opened for writing at a temporary path, renamed onto `final` on success.

    Fixed library version bounds and no timestamps, so equal inputs give byte-identical files. The file is built
    in memory (HDF5's core driver, no backing store) and its image written out with plain file I/O: a full or
    read-only disk is then one OutputError naming `final`, never an HDF5 library that fails to flush its
    caches at close and crashes the interpreter at exit (as it did with the disk driver)."""
    import h5py

    final = Path(final)
    with atomic_path(final) as tmp:
        f = h5py.File(tmp.name, "w", driver="core", backing_store=False, libver=("earliest", "v110"),
                      track_order=True)
        key = f.filename
        _WRITING[key] = final
        try:
            f.attrs["format_version"] = FORMAT_VERSION
            yield f
            f.flush()
            image = f.id.get_file_image()
        finally:
            _WRITING.pop(key, None)
            _close_quietly(f)
        try:
            with open(tmp, "wb") as out:
                out.write(image)
        except OSError as e:
            raise fs_error(e, final) from None


def _close_quietly(f) -> None:
    try:
        f.close()
    except Exception:  # noqa: BLE001 - the write already failed; that error is the one reported
        pass


def check_finite(data, where: str) -> None:
    """Raise NonFiniteError naming `where` and the first non-finite value's index, if `data` holds one."""
    import numpy as np

    data = np.asarray(data)
    if data.dtype.kind not in "fc":
        return
    bad = ~np.isfinite(data)
    if bad.any():
        first = np.unravel_index(int(np.argmax(bad)), data.shape) if data.ndim else ()
        raise NonFiniteError(f"{where}: non-finite value {data[first].item()!r} at index {list(map(int, first))} "
                             f"({int(bad.sum())} of {data.size} values)")


def put(group, name: str, data, compress: bool = True, **attrs):
    """A dataset with fixed dtype, chunked + gzip-compressed when large enough, fletcher32-checksummed (a flipped
    byte is a read error, not a number), no timestamps. NaN or infinity is refused (NonFiniteError)."""
    import numpy as np

    data = np.asarray(data)
    final = _WRITING.get(group.file.filename, group.file.filename)
    check_finite(data, f"{final}: {group.name.rstrip('/')}/{name}")
    kw = {}
    if data.dtype.kind == "O":  # variable-length strings: the checksum would cover only their heap pointers
        if compress and data.size >= 1024:
            kw = dict(compression="gzip", compression_opts=4, shuffle=True, chunks=True)
    elif data.size and data.ndim:  # fletcher32 needs a chunked layout: small arrays are one chunk
        kw = dict(chunks=True if data.size >= 1024 else data.shape, fletcher32=True)
        if compress and data.size >= 1024:
            kw |= dict(compression="gzip", compression_opts=4, shuffle=True)
    ds = group.create_dataset(name, data=data, track_times=False, **kw)
    for k, v in attrs.items():
        ds.attrs[k] = v
    return ds


def put_json_attr(obj, name: str, value) -> None:
    obj.attrs[name] = json.dumps(value, sort_keys=True, ensure_ascii=False)


@contextlib.contextmanager
def read_h5(path: str | os.PathLike, kind: str, required: tuple[str, ...] = (), model: str | None = None,
            params=None):
    """Open an artifact for reading; every failure is an ArtifactError naming the file.

    The artifact must be of `kind`, written by that kind's stage, and of `model` (by default, at
    `artifacts/<kind>/<model>.h5`, the model its file name says): another model's file copied in place is refused.
    With `params`, the params values it records (its stage's dvc.yaml keys) must be today's: a stale artifact,
    or one made by another experiment, is refused naming the first key that differs."""
    import h5py

    path = Path(path)
    if not path.is_file():
        raise ArtifactError(f"{path}: missing (run the stage that writes it: dvc repro)")
    try:
        f = h5py.File(path, "r")
    except OSError as e:
        raise ArtifactError(f"{path}: not a readable HDF5 file (corrupt or truncated?): {e}") from None
    try:
        if f.attrs.get("kind") != kind or f.attrs.get("format_version") != FORMAT_VERSION:
            raise ArtifactError(f"{path}: expected a '{kind}' artifact of format {FORMAT_VERSION}, found "
                                f"kind={f.attrs.get('kind')!r} format={f.attrs.get('format_version')!r}")
        _check_origin(f, path, kind, model, params)
        missing = [name for name in required if name not in f]
        if missing:
            raise ArtifactError(f"{path}: missing datasets {missing} (truncated or written by another version?)")
        yield f
    except (OSError, KeyError) as e:  # a damaged chunk surfaces only when read
        raise ArtifactError(f"{path}: cannot read ({type(e).__name__}: {e}); corrupt or truncated?") from None
    finally:
        f.close()


KIND_STAGE = {"attention": "extract", "eval": "evaluate"}  # the stage that writes an artifact kind, where its name differs


def _check_origin(f, path: Path, kind: str, model: str | None, params=None) -> None:
    import json as _json

    if model is None and path.parent.name == kind:  # the artifact's own place: artifacts/<kind>/<model>.h5
        model = path.stem
    found = f.attrs.get("model")
    if model is not None and found is not None and str(found) != model:
        raise ArtifactError(f"{path}: written for model '{found}', read as model '{model}' (another model's file "
                            f"copied in place?); rerun its stage: dvc repro")
    try:
        stage = _json.loads(f.attrs["provenance"]).get("stage") if "provenance" in f.attrs else None
    except (ValueError, TypeError, AttributeError):
        raise ArtifactError(f"{path}: its provenance attribute is not JSON (corrupt or written by another tool?)") from None
    want = KIND_STAGE.get(kind, kind)
    if stage is not None and stage != want:
        raise ArtifactError(f"{path}: written by stage '{stage}', expected '{want}'")
    if params is not None and "provenance" in f.attrs:
        recorded = _json.loads(f.attrs["provenance"]).get("params")
        name = str(found) if found is not None else model
        if recorded is not None:
            now = _json.loads(_json.dumps(stage_params(params, want, name), ensure_ascii=False))
            differs = _first_difference(recorded, now)
            if differs:
                key, old, new = differs
                raise ArtifactError(f"{path}: made with other params ({key}: {_json.dumps(old, ensure_ascii=False)} vs "
                                    f"{_json.dumps(new, ensure_ascii=False)})")


def _first_difference(recorded, now, prefix: str = ""):
    """(dotted key, recorded value, today's value) of the first leaf that differs, or None. A key recorded as
    absent or null where today's params hold a section is one the writer did not read (e.g. `arm` with no arm
    condition): the keys that decided that (the conditions, the sample counts) are compared themselves."""
    if isinstance(recorded, dict) and isinstance(now, dict):
        for key in recorded:
            if key in now:
                found = _first_difference(recorded[key], now[key], f"{prefix}{key}.")
                if found:
                    return found
        return None
    if recorded is None and isinstance(now, dict):
        return None
    return None if recorded == now else (prefix.rstrip("."), recorded, now)


ROOT = Path(__file__).resolve().parent.parent
CODE_PATHS = ("stages", "meaningless_tokens", "pyproject.toml")  # the code: run_info's git_commit is the last commit touching it
CODE_DIRS = ("stages/", "meaningless_tokens/")  # a dvc.yaml dep under one of these is code


def code_hashes(stage: str) -> dict[str, str]:
    """{path: sha256} of every code file the stage declares as a dependency in dvc.yaml.

    Code deps are those under `stages/` and `meaningless_tokens/` (a folder dep counts each file in it); data
    deps (dataset, artifacts) are recorded by the stages themselves. These hashes are what dvc.lock records for the
    stage's code, so an artifact carrying them is a function of the stage's declared inputs only."""
    import hashlib

    import yaml

    dvc_yaml = ROOT / "dvc.yaml"
    try:
        stages = yaml.safe_load(dvc_yaml.read_text())["stages"]
        spec = stages[stage]
    except (OSError, yaml.YAMLError, KeyError, TypeError) as e:
        raise StageError(f"{dvc_yaml}: stages.{stage}: cannot read the stage's deps ({type(e).__name__}: {e})") from None
    deps = (spec.get("do") or spec).get("deps") or []
    files = []
    for dep in deps:
        path = ROOT / dep
        if not str(dep).startswith(CODE_DIRS):
            continue
        if path.is_dir():
            files += [p for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts]
        elif path.is_file():
            files.append(path)
        else:
            raise StageError(f"{dvc_yaml}: stages.{stage}.deps: {dep} does not exist")
    return {p.relative_to(ROOT).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(files)}


def dvc_stage(stage: str) -> dict:
    """dvc.yaml's definition of `stage` (a foreach stage's `do` part, with `foreach` beside it)."""
    import yaml

    dvc_yaml = ROOT / "dvc.yaml"
    try:
        spec = yaml.safe_load(dvc_yaml.read_text())["stages"][stage]
        return {**(spec.get("do") or spec), "foreach": spec.get("foreach")}
    except (OSError, yaml.YAMLError, KeyError, TypeError, AttributeError) as e:
        raise StageError(f"{dvc_yaml}: stages.{stage}: cannot read the stage ({type(e).__name__}: {e})") from None


# ---- the params a stage reads: exactly dvc.yaml's `params:` list of the stage ----------------------

# Keys that decide where or how fast a stage runs, never what it writes: no stage lists them, any may read them.
UNTRACKED = ("profile", "runtime.threads", "runtime.cache_dir", "runtime.offline")


def params_keys(stage: str, name: str | None = None) -> list[str]:
    """The dotted params keys dvc.yaml lists for `stage` (${key} and ${item} replaced by the model `name`)."""
    keys = dvc_stage(stage).get("params") or []
    return [k.replace("${key}", name).replace("${item}", name) if name else k for k in keys]


def _tree(keys) -> dict:
    """Dotted keys as a nested dict whose leaves are True (the whole value under that key)."""
    tree: dict = {}
    for key in keys:
        node, parts = tree, key.split(".")
        for part in parts[:-1]:
            if node.get(part) is True:
                break
            node = node.setdefault(part, {})
        else:
            node[parts[-1]] = True
    return tree


def stage_params(params, stage: str, name: str | None = None, unused: tuple[str, ...] = ()) -> dict:
    """The values of exactly the params keys dvc.yaml lists for `stage`, nested as in params.yaml: what an
    artifact records as the params that made it (so the file is a function of its declared inputs); less the
    top-level `unused` ones (listed, but not read by this run: e.g. `arm` when no condition applies it)."""
    def values(obj, tree):
        if tree is True:
            return obj.model_dump() if hasattr(obj, "model_dump") else (
                {k: values(v, True) for k, v in obj.items()} if isinstance(obj, dict) else obj)
        return {k: values(obj[k] if isinstance(obj, dict) else getattr(obj, k), sub) for k, sub in tree.items()}

    tree = _tree(params_keys(stage, name))
    return values(params, {k: v for k, v in tree.items() if k not in unused})


def params_view(params, stage: str, name: str | None = None):
    """`params` restricted to the keys dvc.yaml lists for `stage` (and UNTRACKED, and the list its `foreach`
    names): reading any other key raises UnlistedParam, so a stage cannot depend on a key whose change would not
    rerun it. The view is the same pydantic classes with the unlisted fields left out."""
    if name is not None and name not in params.models:
        from meaningless_tokens.config import model_spec

        model_spec(params, name)  # the error that lists the configured models
    keys = params_keys(stage, name) + list(UNTRACKED)
    foreach = str(dvc_stage(stage).get("foreach") or "")
    if foreach.startswith("${") and foreach[2:-1] != "models":  # e.g. evaluate.models: the stage checks it is listed
        keys.append(foreach[2:-1])
    view = _restrict(params, _tree(keys), stage, "")
    view._file = params._file
    return view


def _restrict(obj, tree, stage: str, prefix: str):
    if tree is True:
        return obj
    if isinstance(obj, dict):
        return {k: _restrict(obj[k], sub, stage, f"{prefix}{k}.") for k, sub in tree.items() if k in obj}
    cls = _view_class(type(obj), stage, prefix)
    view = cls.model_construct(**{k: _restrict(getattr(obj, k), sub, stage, f"{prefix}{k}.")
                                  for k, sub in tree.items() if k in type(obj).model_fields})
    for k in type(obj).model_fields:  # model_construct fills defaults in: take out what is not listed
        if k not in tree:
            view.__dict__.pop(k, None)
    return view


@functools.cache
def _view_class(cls, stage: str, prefix: str):
    def __getattr__(self, item):
        if item in cls.model_fields:
            raise UnlistedParam(f"stage '{stage}' reads params key '{prefix}{item}', which dvc.yaml does not list for "
                                f"it (a change to it would not rerun the stage): add it to stages.{stage}.params")
        return cls.__getattr__(self, item)

    return type(cls.__name__, (cls,), {"__getattr__": __getattr__, "__module__": cls.__module__,
                                       "__qualname__": cls.__qualname__})


# Written into the environment (sys.prefix) by `make install`: the lock it was installed from and its sha256.
ENV_RECORD = "meaningless-tokens-lock.json"


def environment() -> dict:
    """The lock this environment was installed from (`make install` records it): {"lock", "sha256"},
    both None where the environment was installed by hand."""
    import sys

    try:
        data = json.loads((Path(sys.prefix) / ENV_RECORD).read_text())
        return {"lock": data["lock"], "sha256": data["sha256"]}
    except (OSError, ValueError, KeyError, TypeError):
        return {"lock": None, "sha256": None}


def provenance(stage: str) -> dict:
    """The run-independent provenance of a stage's artifact: package version, the sha256 of each code
    file the stage depends on (`code_hashes`), library versions and the environment's lock (`environment`).

    No git commit: a commit moves whenever anything is committed (results, params, another stage's
    code), and an artifact's bytes must depend only on the stage's declared inputs, or a fresh
    clone's `dvc repro` would write other bytes than the committed run. The commit that ran goes to
    the run's sidecar instead (`run_info`, in `metrics/timing/<stage>-<model>.json`)."""
    from importlib import metadata

    libs = {}
    for lib in ("torch", "transformers", "tokenizers", "h5py", "numpy", "math-verify", "dvc"):
        try:
            libs[lib] = metadata.version(lib)
        except metadata.PackageNotFoundError:
            pass
    try:
        version = metadata.version("meaningless-tokens")
    except metadata.PackageNotFoundError:
        version = "unknown"
    return {"package_version": version, "stage": stage, "code_sha256": code_hashes(stage), "libraries": libs,
            "environment": environment()}


def model_provenance(stage: str, params, name: str, manifest: dict, unused: tuple[str, ...] = ()) -> dict:
    """What every model stage's artifact records first: `provenance(stage)`, the model (its manifest: source, weights
    sha256, architecture facts) and the params dvc.yaml lists for the stage (`stage_params`)."""
    return {**provenance(stage), "model": {"name": name, **manifest}, "params": stage_params(params, stage, name, unused)}


def run_info() -> dict:
    """What identifies this run's code in git, for the run's sidecar (never inside an artifact):
    `git_commit`, the last commit that changed the code (CODE_PATHS), and `git_dirty`, whether the
    code had uncommitted changes (then the commit alone does not identify it)."""
    import subprocess

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()

    try:
        commit = git("log", "-1", "--format=%H", "--", *CODE_PATHS) or "unknown"
        dirty = bool(git("status", "--porcelain", "--", *CODE_PATHS))
    except (OSError, subprocess.CalledProcessError):
        commit, dirty = "unknown", None
    return {"git_commit": commit, "git_dirty": dirty, **machine()}


def machine() -> dict:
    """What explains a float output's last digits on another machine (`python -m meaningless_tokens.verify`
    prints both sides'): `cpu_model`, `cpu_capability` (the instruction set torch dispatches its kernels to,
    e.g. AVX2 or AVX512), `threads` (torch's intra-op threads) and `device` (cpu, or the CUDA device's name).
    The torch facts only where the stage ran torch (None otherwise: statistics and figures are numpy only).
    """
    import platform
    import sys

    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    facts = {"cpu_model": model, "cpu_capability": None, "threads": None, "device": "cpu"}
    torch = sys.modules.get("torch")
    if torch is not None:
        cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
        facts.update(cpu_capability=torch.backends.cpu.get_cpu_capability(), threads=torch.get_num_threads(),
                     device=torch.cuda.get_device_name() if cuda else "cpu")
    return facts


def write_timing(path: str | os.PathLike, data: dict) -> None:
    """A run's sidecar (`metrics/timing/<stage>-<model>.json`): its timings, `run_info()` and `peak_rss_mb`,
    the process's peak resident memory so far (MiB; Linux reports ru_maxrss in KiB, macOS in bytes), which
    a stage writes last: the stage's peak."""
    import resource
    import sys

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    peak_mb = rss / (1 << 20) if sys.platform == "darwin" else rss / 1024
    write_json_atomic(path, {**data, **run_info(), "peak_rss_mb": round(peak_mb, 1)})


def write_prompt_timing(path: str | os.PathLike, seconds: float, n_prompts: int, artifact: Path) -> None:
    """The sidecar of a stage that runs the model on prompts: wall time, per prompt, the artifact's size."""
    write_timing(path, {"seconds": round(seconds, 2), "ms_per_prompt": round(1000 * seconds / n_prompts, 1),
                        "prompts": n_prompts, "bytes": artifact.stat().st_size})


# ---- where artifacts live (relative to the project root) ---------------------------------------

STAGES = ("prepare", "extract", "evaluate", "stats", "activations", "sweep", "likelihood", "arm_tuning", "figures",
          "report", "explorer")

# kind -> path template: every file a stage writes or reads, named once (`{name}`: the model). dvc.yaml spells
# the same paths with ${key}/${item} (tests/test_store.py checks that each of its outs and metrics is here).
PATHS = {
    "manifest": "artifacts/models/{name}.json",
    "attention": "artifacts/attention/{name}.h5",
    "eval": "artifacts/eval/{name}.h5",
    "stats": "artifacts/stats/{name}.h5",
    "activations": "artifacts/activations/{name}.h5",
    "sweep": "artifacts/sweep/{name}.h5",
    "likelihood": "artifacts/likelihood/{name}.h5",
    "arm_tuning": "artifacts/arm_tuning/{name}.h5",
    # one folder per table kind, so dvc.yaml's top-level `plots` name each folder once
    **{f"plots/{k}": f"artifacts/plots/{k}/{{name}}.csv" for k in ("original", "full", "sweep", "likelihood")},
    "metrics/accuracy": "metrics/accuracy/{name}.json",
    "metrics/sweep": "metrics/sweep/{name}.json",
    "metrics/likelihood": "metrics/likelihood/{name}.json",
    "metrics/arm_tuning": "metrics/arm_tuning/{name}.json",
    # a run's sidecar (never deterministic: timings, the commit that ran); figures and report write none
    **{f"timing/{s}": f"metrics/timing/{s}-{{name}}.json" for s in STAGES[:8]},
    # resumable generations (not DVC outputs: kept across runs so an interrupted stage resumes)
    "journal/eval": "artifacts/eval/.journal/{name}.jsonl",
    "journal/sweep": "artifacts/sweep/.journal/{name}.jsonl",
    "figures": "reports/figures",
    "accuracy_table": "reports/accuracy.csv",
    "likelihood_links": "reports/likelihood.json",
    "report.html": "reports/report.html",
    "report.md": "reports/report.md",
    "explorer": "reports/explorer.html",
    "verdict": "metrics/verdict.json",
    "results.md": "docs/results.md",
    "results": "docs/results",
}


def path(kind: str, name: str | None = None) -> Path:
    """Where the artifact `kind` (a PATHS key) of model `name` lives, relative to the project root."""
    try:
        template = PATHS[kind]
    except KeyError:
        raise KeyError(f"no artifact kind {kind!r} (store.PATHS: {', '.join(PATHS)})") from None
    if ("{name}" in template) != (name is not None):
        raise TypeError(f"artifact kind {kind!r}: {'a model name is needed' if name is None else 'takes no model name'}")
    return Path(template.format(name=name) if name is not None else template)


def outputs(params, name: str, root: Path | None = None, **kinds: str) -> dict[str, Path]:
    """A stage's outputs, role -> absolute path of the artifact kind (a PATHS key) for model `name`: under `root`
    where given (a test's folder), else under the project that `params` belong to."""
    return {role: (root / path(kind, name) if root else params.project_path(str(path(kind, name))))
            for role, kind in kinds.items()}


FIGURES_DIR = path("figures")

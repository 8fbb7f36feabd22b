"""Tolerances from a measured spread: `python -m meaningless_tokens.verify.calibrate` (docs/sharing.md#calibration).

Reruns the numerically sensitive stages of the pipeline (SENSITIVE, each model's) on this machine under each
float-kernel variant a CPU can take, one variable at a time (VARIANTS: torch's kernel sets, oneMKL's code paths,
oneDNN's ISA cap, thread counts), each in a copy of the project under `.calibrate/` (hard links: the stages write
their outputs beside them and rename them into place, so the originals are never touched), and compares every
output value by value: each variant with the committed run (the revision's outputs as `make verify` reads them:
cache, remote or reference), with the workspace's own outputs, and with each other variant. It writes, per kind of
quantity, the largest difference measured as a share of that kind's tolerance today (above 1: beyond it), and where,
as a Markdown table (`--out`, written whole or not at all) and, with `--json`, as JSON. The tolerances themselves
change only in a commit a person makes (meaningless_tokens/tolerances.py), as a stated margin over the spread.

A variant this CPU cannot take (a kernel set it lacks, a value the library does not know) is skipped with one line
naming it, never counted as agreement; a variant whose stage fails is skipped the same way, its log kept. Each
variant costs a rerun of the sensitive stages (the table states each one's seconds); a variant already measured at
this commit is reused from `.calibrate/<variant>/result.json` unless `--fresh`.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from meaningless_tokens.errors import ArtifactError, Beyond, Differs, VerifyError
from meaningless_tokens.store import atomic_path
from meaningless_tokens.tolerances import TOLERANCES
from meaningless_tokens.verify.compare import Largest, compare_file
from meaningless_tokens.verify.driver import BEYOND, IDENTICAL, WITHIN, Verifier, numbers, project_root
from meaningless_tokens.verify.kinds import is_run_record
from meaningless_tokens.verify.reference import DRAWN

SENSITIVE = ("extract", "stats", "activations", "sweep", "likelihood")  # what rounds differently on other kernels
WORKDIR = ".calibrate"

# one variable at a time: name -> the environment it sets
VARIANTS = {
    "aten-default": {"ATEN_CPU_CAPABILITY": "default"},
    "aten-avx2": {"ATEN_CPU_CAPABILITY": "avx2"},
    "aten-avx512": {"ATEN_CPU_CAPABILITY": "avx512"},
    "mkl-compatible": {"MKL_CBWR": "COMPATIBLE"},
    "mkl-avx2": {"MKL_CBWR": "AVX2"},
    "mkl-avx512": {"MKL_CBWR": "AVX512"},
    "onednn-avx2": {"ONEDNN_MAX_CPU_ISA": "AVX2"},
    "threads-1": {"OMP_NUM_THREADS": "1"},
    "threads-2": {"OMP_NUM_THREADS": "2"},
    "threads-4": {"OMP_NUM_THREADS": "4"},
}
# what each library accepts (oneMKL's MKL_CBWR branches; oneDNN's ONEDNN_MAX_CPU_ISA), and the CPU flag each needs
MKL_CBWR = {"AUTO": None, "COMPATIBLE": None, "SSE4_2": "sse4_2", "AVX": "avx", "AVX2": "avx2", "AVX512": "avx512f"}
ONEDNN_ISA = {"SSE41": "sse4_1", "AVX": "avx", "AVX2": "avx2", "AVX512_CORE": "avx512f", "DEFAULT": None}
ATEN = {"default": None, "avx2": "avx2", "avx512": "avx512f"}

PROBE = ("import json, torch; print(json.dumps({'capability': torch.backends.cpu.get_cpu_capability(), "
         "'threads': torch.get_num_threads(), 'mkl': torch.backends.mkl.is_available(), "
         "'mkldnn': torch.backends.mkldnn.is_available()}))")


def cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    line = next((x for x in text.splitlines() if x.startswith("flags")), "")
    return set(line.partition(":")[2].split())


def preflight(name: str, env: dict[str, str], flags: set[str]) -> str:
    """Why this CPU cannot take the variant ("" when it can): a flag it lacks, a value the library does not know,
    or torch reporting another capability or thread count than the variant sets."""
    for var, value in env.items():
        table = {"ATEN_CPU_CAPABILITY": ATEN, "MKL_CBWR": MKL_CBWR, "ONEDNN_MAX_CPU_ISA": ONEDNN_ISA}.get(var)
        if table is not None:
            if value not in table:
                return f"{var}={value}: not a value it takes ({', '.join(table)})"
            if table[value] and table[value] not in flags:
                return f"{var}={value}: this CPU lacks {table[value]}"
    try:
        probe = subprocess.run([sys.executable, "-c", PROBE], env={**os.environ, **env}, capture_output=True,
                               text=True, timeout=120, check=True)
        facts = json.loads(probe.stdout.strip().splitlines()[-1])
    except (subprocess.SubprocessError, ValueError, IndexError) as e:
        return f"torch cannot start under it ({type(e).__name__})"
    if "ATEN_CPU_CAPABILITY" in env and facts["capability"].lower() != env["ATEN_CPU_CAPABILITY"]:
        return f"torch reports capability {facts['capability']}, not {env['ATEN_CPU_CAPABILITY']}"
    if "OMP_NUM_THREADS" in env and str(facts["threads"]) != env["OMP_NUM_THREADS"]:
        return f"torch runs {facts['threads']} threads, not {env['OMP_NUM_THREADS']}"
    if "MKL_CBWR" in env and not facts["mkl"]:
        return "this torch has no oneMKL"
    if "ONEDNN_MAX_CPU_ISA" in env and not facts["mkldnn"]:
        return "this torch has no oneDNN"
    return ""


@dataclass
class Measured:
    """One comparison's largest share of each kind's tolerance, and where."""
    by_kind: dict[str, tuple[float, str]] = field(default_factory=dict)
    differs: list[str] = field(default_factory=list)  # differences of structure, or that no tolerance measures

    def take(self, largest: Largest) -> None:
        for table in (largest.by_kind, largest.beyond_by_kind):
            for kind, (share, text) in table.items():
                if share > self.by_kind.get(kind, (-1.0, ""))[0]:
                    self.by_kind[kind] = (share, text)

    def as_json(self) -> dict:
        return {"by_kind": {k: [s, t] for k, (s, t) in sorted(self.by_kind.items())}, "differs": self.differs}

    @classmethod
    def of(cls, d: dict) -> Measured:
        return cls({k: (s, t) for k, (s, t) in d["by_kind"].items()}, list(d["differs"]))


def _ignore(root: Path):
    skip = {root / ".git", root / WORKDIR, root / ".dvc" / "cache", root / ".dvc" / "tmp", root / ".whl"}

    def ignore(folder: str, names: list[str]) -> list[str]:
        return [n for n in names if Path(folder) / n in skip or (Path(folder) == root and n.startswith(".venv"))]
    return ignore


def _link(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


class Calibration:
    def __init__(self, root: Path, rev: str, stages: list[str], models: list[str] | None, fresh: bool):
        from dvc.repo import Repo

        self.root, self.rev, self.fresh = root, rev, fresh
        self.work = root / WORKDIR
        with Repo(str(root)) as repo:
            self.commit = repo.scm.get_rev()
            chosen = [s for s in repo.index.stages
                      if s.addressing.partition("@")[0] in stages
                      and (models is None or s.addressing.partition("@")[2] in models)]
            self.stages = [(s.addressing, s.cmd if isinstance(s.cmd, str) else " && ".join(s.cmd),
                            [str(o.def_path) for o in s.outs]) for s in chosen]
        if not self.stages:
            raise VerifyError(f"no stage of dvc.yaml among {stages} for models {models or 'all'}")
        self.outputs = [o for *_, outs in self.stages for o in outs if not is_run_record(o)]

    def tree(self, name: str) -> Path:
        return self.work / name / "tree"

    def run_variant(self, name: str, env: dict[str, str]) -> dict:
        """The sensitive stages rerun in a copy of the project under `env`; the copy is kept for the pairwise
        comparisons. Returns the variant's record (its seconds and each stage's exit)."""
        folder, tree = self.work / name, self.tree(name)
        record = folder / "result.json"
        if record.is_file() and not self.fresh:
            saved = json.loads(record.read_text())
            if saved.get("commit") == self.commit and tree.is_dir():
                print(f"calibrate: {name}: measured before at this commit, reused ({record})")
                return saved
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        shutil.copytree(self.root, tree, ignore=_ignore(self.root), copy_function=_link, symlinks=True)
        path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
        run_env = {**os.environ, **env, "PATH": path}
        started, log = time.perf_counter(), folder / "log.txt"
        with log.open("w") as out:
            for stage, cmd, _ in self.stages:
                print(f"calibrate: {name}: {stage}", flush=True)
                out.write(f"$ {cmd}\n")
                out.flush()
                rc = subprocess.run(cmd, shell=True, cwd=tree, env=run_env, stdout=out, stderr=subprocess.STDOUT).returncode
                if rc != 0:
                    return {"commit": self.commit, "failed": f"{stage} exited {rc} (log: {log})"}
        result = {"commit": self.commit, "env": env, "seconds": round(time.perf_counter() - started, 1)}
        with atomic_path(record) as tmp:
            Path(tmp).write_text(json.dumps(result, indent=2))
        return result

    def against_revision(self, here: Path) -> tuple[Measured, str]:
        """The outputs under `here` against the revision's, as `make verify` compares them; verify's numbers line of
        those outputs."""
        v = Verifier(self.root, self.rev, here=here)
        try:
            rows = {r.path: r for r in v.outputs()}
            measured, checked = Measured(), []
            for path in self.outputs:
                row = rows.get(path)
                if row is None:
                    continue
                v.check(row, rows)
                checked.append(row)
                if row.largest is not None:
                    measured.take(row.largest)
                if row.status not in (IDENTICAL, WITHIN, BEYOND):
                    measured.differs.append(f"{path}: {row.status}: {row.detail}")
                elif row.status == BEYOND and row.largest and "exact" in row.largest.beyond_by_kind:
                    measured.differs.append(f"{path}: {row.largest.beyond_by_kind['exact'][1]}")
            return measured, numbers(checked)
        finally:
            v.tmp.cleanup()

    def between(self, a: Path, b: Path) -> Measured:
        """Every output file under `a` against the same under `b`, value by value."""
        measured = Measured()
        for out in self.outputs:
            files = sorted(p.relative_to(a) for p in (a / out).rglob("*") if p.is_file()) if (a / out).is_dir() \
                else [Path(out)]
            for rel in files:
                if rel.suffix in DRAWN or not (a / rel).is_file() or not (b / rel).is_file():
                    continue
                largest = Largest()
                try:
                    compare_file(rel.as_posix(), a / rel, b / rel, largest)
                except Beyond:
                    pass
                except (Differs, ArtifactError) as e:
                    measured.differs.append(str(e))
                if "exact" in largest.beyond_by_kind:  # a count, token id or text that no tolerance admits
                    measured.differs.append(largest.beyond_by_kind["exact"][1])
                measured.take(largest)
        return measured


def table(cal: Calibration, runs: dict[str, dict], skipped: dict[str, str], measured: dict[tuple[str, str], Measured],
          facts: dict, lines_of: dict[str, str]) -> str:
    """The calibration as Markdown: the variants, then per kind its largest share of today's tolerance."""
    lines = [f"# Calibration at `{cal.commit[:7]}`", "",
             f"Made by `python -m meaningless_tokens.verify.calibrate` on {facts['cpu']} (torch capability "
             f"{facts['capability']}, {facts['cores']} cores), {facts['date']}. Stages rerun: "
             f"{', '.join(s for s, *_ in cal.stages)}. Each variant's outputs are compared with the committed run "
             f"(`{cal.rev}`, as `make verify` reads it), with the workspace's and with every other variant's.", "",
             "| variant | environment | seconds | against the committed run: verify's numbers of these outputs | largest "
             "share of a tolerance |", "|---|---|---|---|---|"]
    for name, run in runs.items():
        env = " ".join(f"`{k}={v}`" for k, v in run.get("env", {}).items()) or "as found"
        m = measured.get((name, "committed"))
        top = max(m.by_kind.values(), key=lambda x: x[0])[0] if m and m.by_kind else 0.0
        lines.append(f"| {name} | {env} | {run.get('seconds', '')} | {lines_of.get(name, '')} | {top:.3g}"
                     f"{'; ' + str(len(m.differs)) + ' not measured by a tolerance' if m and m.differs else ''} |")
    for name, why in skipped.items():
        lines.append(f"| {name} | {' '.join(f'`{k}={v}`' for k, v in VARIANTS.get(name, {}).items())} | | "
                     f"skipped: {why} | |")
    lines += ["", "Largest difference per kind of quantity, as a share of its tolerance today (1: at the tolerance; "
              "above 1: beyond it):", "", "| kind | atol | rtol | largest share | between | where |",
              "|---|---|---|---|---|---|"]
    per_kind: dict[str, tuple[float, str, str]] = {}
    for (a, b), m in measured.items():
        for kind, (share, text) in m.by_kind.items():
            if share > per_kind.get(kind, (-1.0, "", ""))[0]:
                per_kind[kind] = (share, f"{a} / {b}", text)
    for kind in TOLERANCES:
        if kind in per_kind:
            share, pair, text = per_kind[kind]
            t = TOLERANCES[kind]
            lines.append(f"| `{kind}` | {t.atol:g} | {t.rtol:g} | {share:.3g} | {pair} | "
                         f"{text.replace('|', '/')[:200]} |")
    differs = [(f"{a} / {b}", d) for (a, b), m in measured.items() for d in m.differs]
    if differs:
        lines += ["", "Not measured by a tolerance (a difference of structure, or of an exact value):", ""]
        lines += [f"- {pair}: {d.replace('|', '/')[:300]}" for pair, d in differs[:40]]
    return "\n".join(lines) + "\n"


def machine_facts() -> dict:
    import torch

    cpu = next((x.partition(":")[2].strip() for x in Path("/proc/cpuinfo").read_text().splitlines()
                if x.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").is_file() else platform.processor()
    return {"cpu": cpu, "capability": torch.backends.cpu.get_cpu_capability(), "cores": os.cpu_count(),
            "date": time.strftime("%Y-%m-%d")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m meaningless_tokens.verify.calibrate",
                                 description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rev", default="HEAD", help="the committed run to compare with (default HEAD)")
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of: {', '.join(VARIANTS)}")
    ap.add_argument("--stages", default=",".join(SENSITIVE), help="the stages rerun (default: %(default)s)")
    ap.add_argument("--models", default="", help="comma-separated model names (default: every model's stages)")
    ap.add_argument("--out", default="docs/calibration.md", help="the table (default: %(default)s)")
    ap.add_argument("--json", default="", help="also the measurements as JSON, to this file")
    ap.add_argument("--fresh", action="store_true", help="rerun variants measured before at this commit")
    ap.add_argument("--keep", action="store_true", help=f"keep the variants' copies under {WORKDIR}/")
    args = ap.parse_args(argv)
    names = [v for v in args.variants.split(",") if v]
    unknown = [v for v in names if v not in VARIANTS]
    try:
        if unknown:
            raise VerifyError(f"--variants: {unknown}: not a variant ({', '.join(VARIANTS)})")
        root = project_root()
        cal = Calibration(root, args.rev, [s for s in args.stages.split(",") if s],
                          [m for m in args.models.split(",") if m] or None, args.fresh)
        flags, runs, skipped = cpu_flags(), {}, {}
        for name in names:
            why = preflight(name, VARIANTS[name], flags)
            if why:
                print(f"calibrate: {name}: skipped: {why}")
                skipped[name] = why
                continue
            run = cal.run_variant(name, VARIANTS[name])
            if "failed" in run:
                print(f"calibrate: {name}: skipped: {run['failed']}")
                skipped[name] = run["failed"]
                continue
            runs[name] = run
        measured: dict[tuple[str, str], Measured] = {}
        lines_of: dict[str, str] = {}
        sides = {"workspace": root, **{n: cal.tree(n) for n in runs}}
        for name, here in sides.items():
            print(f"calibrate: comparing {name} with the committed run", flush=True)
            measured[(name, "committed")], lines_of[name] = cal.against_revision(here)
        for a, b in itertools.combinations(sides, 2):
            print(f"calibrate: comparing {a} with {b}", flush=True)
            measured[(a, b)] = cal.between(sides[a], sides[b])
        text = table(cal, {"workspace": {}, **runs}, skipped, measured, machine_facts(), lines_of)
        with atomic_path(root / args.out) as tmp:
            Path(tmp).write_text(text)
        if args.json:
            with atomic_path(root / args.json) as tmp:
                Path(tmp).write_text(json.dumps({"commit": cal.commit, "runs": runs, "skipped": skipped,
                                                 "measured": {f"{a} / {b}": m.as_json() for (a, b), m in measured.items()}},
                                                indent=2))
        print(text)
        if not args.keep:
            for name in runs:
                shutil.rmtree(cal.tree(name), ignore_errors=True)
    except VerifyError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())

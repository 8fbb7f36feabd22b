"""Did the workspace's outputs reproduce a revision's? `python -m meaningless_tokens.verify [REV]` (`make verify`).

DVC compares hashes, and across CPUs of different instruction sets float kernels round differently, so a
rerun elsewhere shows every float output as modified. This compares every output in dvc.lock with the same
output at REV (default HEAD; any git revision or `dvc exp` name) by value, file by file
(meaningless_tokens/verify/compare.py: each float within the tolerance of its kind of quantity). Figures and
pages (PNG, SVG, HTML, Markdown) are drawn from other outputs, and the reference describes them: they count as
reproduced when their stage's data and params are unchanged and every output they read is identical or within
tolerance (the dependency graph of dvc.lock); where only the stage's code differs, a page is compared by what it
prints (meaningless_tokens/verify/pages.py) and a figure differs.

REV's outputs are read through DVC (`dvc.api.DVCFileSystem`): git-tracked metrics from git, cached outputs from
the DVC cache or the default remote, and where neither holds them, from the revision's reference (`reference/`, in
git: meaningless_tokens/verify/reference.py), whose rows say so. What none of them holds is "not compared", never
taken as equal. The answer is
one row per output (identical, within tolerance, beyond tolerance: values moved in a file otherwise alike, differs:
in structure), the conclusions judged apart (verify/conclusions.py) and a final line; its exit status is EXIT's:
0 reproduced, 4 reproduced in its conclusions (values beyond float noise, every conclusion equal), 1 not reproduced,
3 not verified (outputs not compared), 2 an error. The tolerances, and the measured differences they rest on:
docs/sharing.md#reproduced-or-not-make-verify.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from meaningless_tokens import store
from meaningless_tokens.config import yaml12
from meaningless_tokens.errors import ArtifactError, Beyond, ConfigError, Differs, VerifyError
from meaningless_tokens.progress import bar
from meaningless_tokens.verify.compare import Largest, changed_keys, compare_file
from meaningless_tokens.verify.conclusions import Conclusions, judge
from meaningless_tokens.verify.kinds import is_run_record
from meaningless_tokens.verify.pages import compare_page
from meaningless_tokens.verify.reference import DRAWN, FOLDER, RevisionReference, compare_held, md5_file

IDENTICAL, WITHIN, BEYOND, DIFFERS, MISSING, NOT_COMPARED, RUN_RECORD = (
    "identical", "within tolerance", "beyond tolerance", "differs", "missing", "not compared", "run record")
# the exit status of each answer (docs/sharing.md#reproduced-or-not-make-verify)
EXIT = {"reproduced": 0, "not reproduced": 1, "error": 2, "not verified": 3, "reproduced in its conclusions": 4,
        "interrupted": 130}


# ---- the pipeline's outputs on both sides -------------------------------------------------------------


@dataclass
class Output:
    path: str
    stage: str
    md5: str | None  # the revision's, from its dvc.lock
    status: str = ""
    detail: str = ""
    via: str = ""  # "reference" where the revision's side came from its reference, not the cache or remote
    largest: Largest | None = None  # the largest within-tolerance difference, for the closing line


def read_lock(text: str, source: str) -> dict:
    try:
        lock = yaml12.load(text) or {}
        return lock["stages"]
    except (yaml12.YAMLError, ConfigError, KeyError, TypeError) as e:
        raise VerifyError(f"{source}: stages: not a dvc.lock ({type(e).__name__}: {e})") from None


def _covers(dep: str, out: str) -> bool:
    return dep == out or out.startswith(dep.rstrip("/") + "/") or dep.startswith(out.rstrip("/") + "/")


class Verifier:
    def __init__(self, root: Path, rev: str, here: Path | None = None):
        """The workspace `root`'s outputs against revision `rev`'s; `here`: read the workspace's files from another
        copy of the project (a calibration's variant), its dvc.lock still `root`'s."""
        from dvc.api import DVCFileSystem

        self.root, self.rev = root, rev
        self.here = here or root
        self.sha = self._resolve(rev)
        self.fs = DVCFileSystem(str(root), rev=self.sha)
        try:
            ws_lock = (root / "dvc.lock").read_text()
        except OSError as e:
            raise VerifyError(f"{root / 'dvc.lock'}: cannot read it ({e}); run `dvc repro` first") from None
        self.ws = read_lock(ws_lock, "dvc.lock")
        try:
            rev_lock = self.fs.read_text("dvc.lock")
        except (OSError, FileNotFoundError) as e:
            raise VerifyError(f"{rev}:dvc.lock: no dvc.lock at that revision ({e})") from None
        self.old = read_lock(rev_lock, f"{rev}:dvc.lock")
        self.tmp = tempfile.TemporaryDirectory(prefix="verify-")
        self._reference: RevisionReference | None = None

    @property
    def reference(self) -> RevisionReference:
        """The revision's reference, read the first time an output is in no cache or remote."""
        if self._reference is None:
            self._reference = RevisionReference(
                self.fetch, lambda folder: self.fs.find(folder), self.old, self.rev)
        return self._reference

    def notes(self) -> list[str]:
        """One line per problem of the revision's reference that left outputs not compared."""
        ref = self._reference
        if ref is None:
            return []
        lines = [ref.problem] if ref.problem else []
        if ref.mismatched:
            lines.append(f"{ref.folder}/manifest.json at {self.rev}: {len(ref.mismatched)} output(s) recorded with "
                         f"other md5s than its dvc.lock (first: {ref.mismatched[0]}; the reference stage did not run "
                         f"after it): not compared from the reference")
        return lines

    def _resolve(self, rev: str) -> str:
        """A git revision or an experiment name -> its commit."""
        from dvc.repo import Repo

        with Repo(str(self.root)) as repo:
            scm = repo.scm
            try:
                return scm.resolve_rev(rev)
            except Exception:  # noqa: BLE001 - scmrepo raises its own RevError; try it as an experiment next
                pass
            from dvc.repo.experiments.utils import resolve_name

            ref = resolve_name(scm, rev).get(rev)
            if ref is None:
                raise VerifyError(f"{rev}: neither a git revision nor an experiment name of this repository")
            return scm.get_ref(str(ref))

    def outputs(self) -> list[Output]:
        """Every output of either dvc.lock, in the workspace lock's order, then those only the revision has."""
        rows, seen = [], set()
        for locks in (self.ws, self.old):
            for stage, entry in locks.items():
                for out in entry.get("outs") or []:
                    if out["path"] not in seen:
                        seen.add(out["path"])
                        old = next((o for o in (self.old.get(stage) or {}).get("outs") or []
                                    if o["path"] == out["path"]), None)
                        rows.append(Output(out["path"], stage, old["md5"] if old else None))
        return rows

    # -- reading the revision's bytes through DVC

    def rev_files(self, out: Output) -> dict[str, str]:
        """{file path: md5} of the output at the revision (a folder's files from its .dir listing)."""
        if out.md5 is None or not out.md5.endswith(".dir"):
            return {out.path: out.md5}
        listing = self.fs.find(out.path, detail=True)
        # a `cache: false` folder kept in git (docs/results) lists git blobs, which carry no md5: hash the file
        return {p: (info.get("dvc_info") or {}).get("md5") or info.get("md5") or md5_file(self.fetch(p))
                for p, info in listing.items()}

    def fetch(self, path: str) -> Path:
        """The revision's file, copied by DVC from git, the cache or the remote into a temporary folder."""
        dest = Path(self.tmp.name) / path
        if not dest.exists():
            dest.parent.mkdir(parents=True, exist_ok=True)
            self.fs.get_file(path, str(dest))
        return dest

    # -- one output

    def check(self, out: Output, results: dict[str, Output]) -> None:
        here = self.here / out.path
        if is_run_record(out.path):
            out.status, out.detail = RUN_RECORD, "wall times and the machine; not a result"
            return
        if out.stage not in self.ws or not any(o["path"] == out.path for o in self.ws[out.stage].get("outs") or []):
            out.status, out.detail = MISSING, "in the revision's dvc.lock, not in the workspace's"
            return
        if not here.exists():
            out.status, out.detail = MISSING, f"not in the workspace (restore it: {self.restore(out.path)})"
            return
        if out.md5 is None:
            out.status, out.detail = NOT_COMPARED, f"not in {self.rev}'s dvc.lock"
            return
        try:
            theirs = self.rev_files(out)
        except Exception as e:  # noqa: BLE001 - whatever DVC raises for a listing it cannot get
            theirs, why = self.reference.listing(out.path, out.md5)
            if theirs is None:
                out.status, out.detail = NOT_COMPARED, f"its listing is in no cache or remote ({type(e).__name__}); {why}"
                return
            out.via = "reference"
        mine = ({str(p.relative_to(self.here)): p for p in sorted(here.rglob("*")) if p.is_file()}
                if here.is_dir() else {out.path: here})
        gone = sorted(set(theirs) - set(mine))
        if gone:
            out.status, out.detail = MISSING, f"{gone[0]}: in the revision, not here"
            return
        extra = sorted(set(mine) - set(theirs))
        if extra:
            out.status, out.detail = DIFFERS, f"{extra[0]}: here, not in the revision"
            return
        changed = [p for p in sorted(theirs) if md5_file(mine[p]) != theirs[p]]
        if not changed:
            out.status = IDENTICAL
            return
        largest = Largest()
        # the reference describes the other outputs (their md5s, their blocks): reproduced when they are
        describes = out.path == FOLDER
        drawn = [p for p in changed if Path(p).suffix in DRAWN or describes]
        listed = None  # the output as the revision's reference records it, looked up once
        try:
            for p in changed:
                if p in drawn:
                    continue
                try:
                    theirs_path = self.fetch(p)
                except Exception as e:  # noqa: BLE001 - not in the cache, not on the remote, remote unreachable
                    if listed is None:
                        listed, why = self.reference.listing(out.path, out.md5)
                    held, why = (self.reference.held(p, self.fetch) if listed and listed.get(p) == theirs[p]
                                 else (None, why or f"{self.rev}'s reference records another md5 for it"))
                    if held is None:
                        out.status, out.detail = NOT_COMPARED, f"{p}: in no cache or remote ({type(e).__name__}); {why}"
                        return
                    out.via = "reference"
                    try:
                        compare_held(p, mine[p], held, largest)
                    except Beyond:  # kept in `largest`; the output's other files are compared too
                        pass
                    continue
                try:
                    compare_file(p, mine[p], theirs_path, largest)
                except Beyond:
                    pass
        except Differs as e:
            out.status, out.detail = DIFFERS, str(e)
            return
        except ArtifactError as e:  # a reduction the reference holds that this code cannot read
            out.status, out.detail = NOT_COMPARED, str(e)
            return
        inherited = ""  # a figure or the reference drawn from outputs beyond tolerance: judged by what it draws from
        if drawn:
            status, why, code = self.drawn_from(out, results)
            if status not in (WITHIN, BEYOND):
                out.status, out.detail = status, f"{drawn[0]}: {why}"
                return
            if not describes and (code or status == BEYOND):
                # drawn by other code, or from values beyond tolerance: a page is compared by what it prints
                for p in drawn:
                    if status == BEYOND and not code and Path(p).suffix not in (".md", ".html"):
                        inherited = inherited or f"{p}: {why}"
                        continue
                    try:
                        theirs_path = self.fetch(p)
                    except Exception as e:  # noqa: BLE001 - not in the cache, not on the remote, remote unreachable
                        if status == BEYOND and not code:  # nothing to read it against: judged by what it draws from
                            inherited = inherited or f"{p}: {why} (its copy at the revision is in no cache or remote)"
                            continue
                        out.status, out.detail = NOT_COMPARED, (f"{p}: drawn by other code ({code}), and the "
                                                                f"revision's copy is in no cache or remote "
                                                                f"({type(e).__name__})")
                        return
                    try:
                        compare_page(p, mine[p], theirs_path, largest)
                    except Beyond as e:  # kept in `largest`; from inputs within tolerance it prints the same, or differs
                        if status != BEYOND:
                            out.status, out.detail = DIFFERS, f"{e}; drawn by other code ({code})"
                            return
                    except Differs as e:
                        out.status, out.detail = DIFFERS, f"{e}; drawn by other code ({code})" if code else f"{e}; {why}"
                        return
                    except OSError as e:  # the workspace's copy unreadable
                        out.status, out.detail = DIFFERS, f"{p}: cannot be read here ({e})"
                        return
                why = (f"drawn by other code ({code}) from the same inputs; compared as text, the code's names and run "
                       "records set aside" if code else f"{why}; compared as text, the run records set aside")
            elif status == BEYOND:
                inherited = f"{drawn[0]}: {why}"
            if describes and self.edited(out):  # the reference stands for the outputs: it must be what its stage wrote
                out.status, out.detail = DIFFERS, (f"{drawn[0]}: changed after its stage wrote it (dvc status: "
                                                   f"modified; restore it: {self.restore(out.path)})")
                return
            if not largest.beyond and not inherited and largest.share < 0:
                out.status, out.detail = WITHIN, f"{len(drawn)} drawn file(s) differ in bytes; {why}"
                out.detail += _added(largest)
                return
        out.largest = largest
        if largest.beyond or inherited:
            out.status = BEYOND
            out.detail = (f"{largest.n_beyond} value(s) beyond tolerance, the first: {largest.beyond[0]}"
                          if largest.beyond else inherited) + _added(largest)
            return
        out.status, out.largest = WITHIN, largest if largest.share >= 0 else None
        out.detail = f"largest: {largest.text}" if largest.share >= 0 else "values and attributes equal; only the bytes differ (provenance keys, wall times or layout)"
        out.detail += _added(largest)

    def restore(self, path: str) -> str:
        """The command that puts the workspace's `path` back as its stage wrote it: git keeps a `cache: false`
        output (metrics, the reference, docs/results), DVC's cache the others."""
        import subprocess

        tracked = subprocess.run(["git", "ls-files", "--error-unmatch", "--", path], cwd=self.root,
                                 capture_output=True).returncode == 0
        return f"git checkout -- {path}" if tracked else f"dvc checkout {path}"

    def edited(self, out: Output) -> bool:
        """Whether the workspace's `out` is not what its stage wrote (its hash differs from the workspace's
        dvc.lock's), as `dvc status` says: the reference edited by hand. (A page is judged by what it prints.)"""
        from dvc.repo import Repo

        if self.here != self.root:  # a calibration's copy: the workspace's dvc.lock is not the one it ran with
            return False
        with Repo(str(self.root)) as repo:  # only this output is hashed, not the stage's inputs
            return any(o.changed_checksum() for st in repo.index.stages if st.addressing == out.stage
                       for o in st.outs if o.def_path == out.path)

    def drawn_from(self, out: Output, results: dict[str, Output]) -> tuple[str, str, str]:
        """Whether a figure or page counts as reproduced: (status, why, the first of its stage's code inputs that
        differ from the revision's, or ""). Reproduced when its stage's params are those of the revision and every
        output it reads is identical or within tolerance (a run record counts as equal); with other code, `check`
        then compares what a page prints. The reference describes the other outputs: its code is not a result."""
        mine, theirs = self.ws.get(out.stage) or {}, self.old.get(out.stage) or {}
        if mine.get("params") != theirs.get("params"):
            changed = sorted(k for f in set(mine.get("params") or {}) | set(theirs.get("params") or {})
                             for k in changed_keys((mine.get("params") or {}).get(f), (theirs.get("params") or {}).get(f)))
            return DIFFERS, f"drawn with other params ({', '.join(changed[:3]) or 'params files'})", ""
        deps_theirs = {d["path"]: d.get("md5") for d in theirs.get("deps") or []}
        read, code = [], ""
        for dep in mine.get("deps") or []:
            outs = [r for r in results.values() if _covers(dep["path"], r.path) and r.path != out.path]
            if outs:
                read += outs
            elif deps_theirs.get(dep["path"]) != dep.get("md5") and not code:
                code = dep["path"]
        for r in read:
            if not r.status:  # an output it reads, not checked yet (dvc.lock's order is not promised)
                self.check(r, results)
            if r.status in (DIFFERS, MISSING):
                return DIFFERS, f"drawn from {r.path}, which {r.status.replace('missing', 'is missing')}", code
            if r.status == NOT_COMPARED:
                return NOT_COMPARED, f"drawn from {r.path}, which was not compared", code
        beyond = next((r for r in read if r.status == BEYOND), None)
        if beyond is not None:
            return BEYOND, f"drawn from {beyond.path}, which is beyond tolerance", code
        if code and out.path == FOLDER:
            return WITHIN, f"describes outputs that are identical or within tolerance (its code differs: {code})", code
        return WITHIN, "drawn from outputs that are identical or within tolerance, same code and params", code

    def conclusions(self) -> Conclusions:
        """The workspace's verdict file against the revision's (verify/conclusions.py)."""
        path = store.path("verdict").as_posix()
        try:
            here = json.loads((self.root / path).read_text())
        except (OSError, ValueError) as e:
            return Conclusions(problem=f"{path}: cannot read it here ({type(e).__name__}): the conclusions cannot be "
                                       "judged; the numbers alone are")
        try:
            theirs = json.loads(self.fs.read_text(path))
        except Exception as e:  # noqa: BLE001 - not at that revision, or not JSON
            return Conclusions(problem=f"{self.rev}:{path}: cannot read it ({type(e).__name__}): the conclusions cannot "
                                       "be judged; the numbers alone are")
        return judge(here, theirs, path)

    def run_facts(self, out: Output) -> tuple[dict, dict] | None:
        """Both sides' run facts from the stage's sidecar (metrics/timing/<stage>-<model>.json)."""
        stage, _, model = out.stage.partition("@")
        if not model or f"timing/{stage}" not in store.PATHS:
            return None
        sidecar = store.path(f"timing/{stage}", model).as_posix()
        try:
            mine = json.loads((self.root / sidecar).read_text())
        except (OSError, ValueError):
            return None
        try:
            theirs = json.loads(self.fs.read_text(sidecar))
        except Exception:  # noqa: BLE001 - not at that revision
            theirs = {}
        return ({k: mine.get(k, "not recorded") for k in store.RUN_FACTS},
                {k: theirs.get(k, "not recorded") for k in store.RUN_FACTS})

    def run(self) -> list[Output]:
        """Every output checked; a single file's detail does not repeat its path."""
        rows = self.outputs()
        results = {r.path: r for r in rows}
        with bar(rows, desc=f"verify against {self.rev}", unit="output") as progress:
            for out in progress:
                progress.set_postfix_str(out.path, refresh=False)
                if not out.status:  # drawn_from may have checked it already
                    self.check(out, results)
        for out in rows:
            out.detail = out.detail.replace(f"{out.path}: ", "")
        return rows



# ---- the answer -----------------------------------------------------------------------------------------


def _added(largest: Largest) -> str:
    """What only the workspace has, for a row's detail."""
    if not largest.added:
        return ""
    more = f" and {len(largest.added) - 1} more" if len(largest.added) > 1 else ""
    return f"; added here: {largest.added[0]}{more}"


def _name(text: str) -> str:
    """The value a difference's text names: its file and key (`file: key[index]`)."""
    return ": ".join(text.split(": ")[:2])


def shown(r: Output) -> str:
    """The status as the table prints it: compared from the reference says so."""
    return f"{r.status} ({r.via})" if r.via and r.status in (IDENTICAL, WITHIN, DIFFERS) else r.status


def table(rows: list[Output]) -> str:
    width = max(len("Path"), *(len(r.path) for r in rows))
    swidth = max(len(shown(r)) for r in rows)
    lines = [f"{'Path':<{width}}  {'Status':<{swidth}}  Detail"]
    lines += [f"{r.path:<{width}}  {shown(r):<{swidth}}  {r.detail}".rstrip() for r in rows]
    return "\n".join(lines)


def numbers(rows: list[Output]) -> str:
    """The numbers' answer: how many outputs are identical, within tolerance, beyond it, differ."""
    count = {s: sum(r.status == s for r in rows) for s in (IDENTICAL, WITHIN, BEYOND, DIFFERS, MISSING, NOT_COMPARED,
                                                            RUN_RECORD)}
    parts = [f"{len(rows)} outputs", f"{count[IDENTICAL]} identical", f"{count[WITHIN]} within tolerance"]
    parts += [f"{count[BEYOND]} beyond tolerance"] if count[BEYOND] else []
    parts.append(f"{count[DIFFERS]} differ")
    parts += [f"{count[s]} {s}" for s in (MISSING, NOT_COMPARED) if count[s]]
    parts.append(f"{count[RUN_RECORD]} run records")
    return ", ".join(parts)


def verdict(rows: list[Output], conclusions: Conclusions | None = None) -> tuple[str, int]:
    """The final line and the exit status (EXIT): `reproduced` when every number is within tolerance and every
    conclusion equal; `reproduced in its conclusions` when values moved beyond tolerance, the files otherwise alike,
    and every conclusion is equal; `not reproduced` when an output differs in structure or is missing, a conclusion
    moved, or values moved and the conclusions could not be judged; `not verified` when outputs were not compared."""
    conclusions = conclusions or Conclusions(problem="the conclusions were not judged")
    count = {s: sum(r.status == s for r in rows) for s in (BEYOND, DIFFERS, MISSING, NOT_COMPARED)}
    line = numbers(rows)
    if count[DIFFERS] or count[MISSING] or conclusions.moved:
        why = f"; a conclusion moved: {conclusions.moved[0]}" if conclusions.moved else ""
        more = f" (and {len(conclusions.moved) - 1} more)" if len(conclusions.moved) > 1 else ""
        return f"not reproduced: {line}{why}{more}", EXIT["not reproduced"]
    if count[BEYOND] and conclusions.problem:
        return f"not reproduced: {line}; {conclusions.problem}", EXIT["not reproduced"]
    if count[NOT_COMPARED]:
        return f"not verified: {line}", EXIT["not verified"]
    if count[BEYOND]:
        values = [v for r in rows if r.status == BEYOND and r.largest and r.largest.beyond for v in r.largest.beyond[:1]]
        n = sum(r.largest.n_beyond for r in rows if r.status == BEYOND and r.largest)
        named = "; ".join(_name(v) for v in values[:6]) + (f"; and {len(values) - 6} more outputs" if len(values) > 6 else "")
        return (f"reproduced in its conclusions: {n} value(s) beyond float noise ({named}), every conclusion equal, "
                f"largest move {conclusions.largest:.2g} SE ({conclusions.where or 'no estimate moved'}); {line}",
                EXIT["reproduced in its conclusions"])
    return f"reproduced: {line}", EXIT["reproduced"]


def conclusions_line(c: Conclusions) -> str:
    if c.problem:
        return f"conclusions: not judged: {c.problem}"
    if c.moved:
        return f"conclusions: {len(c.moved)} moved: " + "; ".join(c.moved[:3]) + (" ..." if len(c.moved) > 3 else "")
    return (f"conclusions: every verdict word, sign, Holm decision and pooled decision equal; the largest move of an "
            f"estimate {c.largest:.2g} standard errors ({c.where or 'none moved'}; at most 0.1)")


def project_root() -> Path:
    from dvc.exceptions import NotDvcRepoError
    from dvc.repo import Repo

    try:
        return Path(Repo.find_root())
    except NotDvcRepoError:
        raise VerifyError(f"{Path.cwd()}: not inside a DVC repository (run it in the project's checkout)") from None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m meaningless_tokens.verify", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("rev", nargs="?", default="HEAD", help="a git revision or a `dvc exp` name (default HEAD)")
    ap.add_argument("--json", action="store_true", help="the rows and the verdict as JSON on stdout")
    args = ap.parse_args(argv)
    try:
        v = Verifier(project_root(), args.rev)
        try:
            rows = v.run()
            judged = v.conclusions()
        finally:
            v.tmp.cleanup()
    except VerifyError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT["error"]
    except KeyboardInterrupt:
        return EXIT["interrupted"]
    line, code = verdict(rows, judged)
    notes = v.notes()
    if args.json:
        print(json.dumps({"rev": args.rev, "commit": v.sha, "verdict": line, "notes": notes,
                          "conclusions": {"equal": judged.equal, "moved": judged.moved, "problem": judged.problem or None,
                                          "largest_move_se": judged.largest, "where": judged.where or None},
                          "outputs": [{"path": r.path, "status": r.status, "via": r.via or None, "detail": r.detail,
                                       "largest_share_of_tolerance": r.largest.share if r.largest else None,
                                       "largest_by_kind": ({k: share for k, (share, _) in sorted(r.largest.by_kind.items())}
                                                           if r.largest else {}),
                                       "beyond_by_kind": ({k: share for k, (share, _) in sorted(r.largest.beyond_by_kind.items())}
                                                          if r.largest else {}),
                                       "values_beyond": r.largest.n_beyond if r.largest else 0}
                                      for r in rows]}, indent=2))
        return code
    for note in notes:
        print(f"note: {note}")
    print(table(rows))
    facts = []
    for r in rows:
        if r.status in (WITHIN, BEYOND, DIFFERS):
            got = v.run_facts(r)
            if got:
                facts.append(f"  {r.stage}: " + "; ".join(
                    f"{k} {got[0][k]} here, {got[1][k]} at {args.rev}" if got[0][k] != got[1][k] else f"{k} {got[0][k]}"
                    for k in store.RUN_FACTS))
    if facts:
        print(f"\nRun facts of the stages whose outputs are not identical (workspace vs {args.rev}):")
        print("\n".join(dict.fromkeys(facts)))
    within = [r for r in rows if r.status in (WITHIN, BEYOND) and r.largest and r.largest.share >= 0]
    if within:
        top = max(within, key=lambda r: r.largest.share)
        print(f"\nLargest difference within tolerance ({top.largest.share:.0%} of its tolerance): {top.largest.text}")
    print(f"\n{conclusions_line(judged)}")
    print(f"\n{line}")
    return code


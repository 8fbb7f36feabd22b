"""The stages a scheduled run runs: DVC's own graph and order (`dvc repro`'s plan), the ones that must run, and
which of them ask for a GPU."""

from __future__ import annotations

import ast
import contextlib
from dataclasses import dataclass, field
from pathlib import Path

# the params key that marks a stage that loads a model: it runs where runtime.device says
DEVICE_KEY = "runtime.device"


@dataclass
class Step:
    """One stage of the plan: its DVC name (`extract@tiny-a`), the stages it depends on, whether it loads a model."""
    name: str
    upstream: tuple[str, ...]
    loads_model: bool
    changed: bool                    # dvc status: its deps, params, command or outputs differ from dvc.lock
    cacheable: bool = True           # DVC keeps a run-cache record of it (no uncached output beyond metrics and plots)
    gpu: bool = False                # asks Ray for a GPU (set by `plan`)
    downstream: set = field(default_factory=set)
    ancestors: tuple[str, ...] = ()  # every stage upstream of it, however far
    journal: str | None = None       # the store.PATHS kind of its generation's journal: it splits into shards
    memos: tuple[str, ...] = ()      # stages of its model whose outputs it reads where present, not a DVC dep
    stale: bool = False              # its dvc.lock entry names outputs the DVC cache lacks (workspace.uncached_entry)


def plan(root: Path, targets: list[str] | None = None) -> list[Step]:
    """The stages `dvc repro [targets]` would visit, in its order (a post-order walk of the active graph), with
    their upstream stages within the plan, whether each loads a model, whether each has changed, and whether its
    dvc.lock entry is stale."""
    from dvc.repo import Repo
    from dvc.repo.reproduce import collect_stages, get_active_graph, plan_repro

    from meaningless_tokens.cluster.workspace import uncached_entry

    with contextlib.chdir(root), Repo(str(root)) as repo:  # DVC reads a target's name against the working folder
        stages = collect_stages(repo, targets or ["dvc.yaml"])
        graph = get_active_graph(repo.index.graph)
        order = [s for s in plan_repro(graph, stages) if s.cmd]
        names = {s: s.addressing for s in order}
        # as Stage.run decides: an uncached output other than a metric or plot turns the run-cache off
        cacheable = {s for s in order if not any(not o.use_cache and not (o.is_metric or o.is_plot) for o in s.outs)}
        # read from the lock's hashes before `status` looks at the workspace; only the run-cache restores such a stage
        stale = {s for s in cacheable if uncached_entry(repo, s)}
        changed = set(repo.status(targets=[s.addressing for s in order], with_deps=False))
        every = {s.addressing for s in repo.index.stages}
        steps = []
        for s in order:
            upstream = tuple(names[d] for d in graph.successors(s) if d in names)
            keys = {k for dep in s.deps if hasattr(dep, "params") for k in (dep.params or [])}
            steps.append(Step(s.addressing, upstream, DEVICE_KEY in keys, s.addressing in changed, s in cacheable,
                              stale=s in stale))
    tables = declared(root)
    for s in steps:
        stage, _, model = s.name.partition("@")
        own = tables.get(stage, {})
        s.journal = own.get("OUTPUTS", {}).get("journal")
        # a serial run, in dvc.yaml's order, has run the producer first (evaluate's kept generations for the sweep)
        made_by = {other for other, t in tables.items() for kind in own.get("INPUTS", {}).values()
                   if kind in t.get("OUTPUTS", {}).values()}
        s.memos = tuple(f"{m}@{model}" for m in sorted(made_by) if model and f"{m}@{model}" in every)
    by_name = {s.name: s for s in steps}
    for s in steps:  # post-order: upstream stages first
        for u in s.upstream:
            by_name[u].downstream.add(s.name)
        s.ancestors = tuple(dict.fromkeys(a for u in s.upstream for a in (*by_name[u].ancestors, u)))
    return steps


def declared(root: Path) -> dict[str, dict]:
    """Each stage module's OUTPUTS and INPUTS tables (stages/<stage>.py: role -> store.PATHS kind), read from its
    source: the driver imports no stage (nor torch)."""
    out = {}
    for path in sorted((root / "stages").glob("*.py")):
        tables = {}
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                    and node.targets[0].id in ("OUTPUTS", "INPUTS"):
                try:
                    tables[node.targets[0].id] = ast.literal_eval(node.value)
                except ValueError:  # not a literal: not one of these tables
                    continue
        out[path.stem] = tables
    return out


def to_run(steps: list[Step]) -> tuple[list[Step], list[Step]]:
    """(what a run schedules as tasks, what it leaves to the workspace's final `dvc repro`). Scheduled: the changed
    stages and every stage downstream of one (the others are up to date in the workspace, and a task restores them
    from the cache it shares). Left: those among them that the run-cache cannot bring back to the workspace (an
    uncached output: the report's pages in git, the reference) and every stage downstream of one."""
    chosen: set[str] = set()
    left: set[str] = set()
    for s in steps:  # post-order: a stage's upstream stages come before it
        if s.changed or any(u in chosen or u in left for u in s.upstream):
            (left if not s.cacheable or any(u in left for u in s.upstream) else chosen).add(s.name)
    return [s for s in steps if s.name in chosen], [s for s in steps if s.name in left]

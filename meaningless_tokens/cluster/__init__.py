"""The study's DVC graph scheduled by Ray: `mless repro --cluster [ADDRESS]` (docs/gpu.md, "Every GPU of a node or
a cluster").

DVC runs one stage at a time. Here every stage whose upstream stages are done runs as a Ray task, as many at once as
the cluster's CPUs and GPUs allow: a GPU each for the stages that load a model on CUDA, CPUs for the rest. A task runs
its stage with DVC itself (`dvc repro <stage>`, the same command, params and code as the workspace's, uncommitted
changes included) in a git worktree of its own, so that no two share DVC's lock; the stages upstream of it that other
tasks ran are restored there from the run-cache. The tasks on the driver's node share the workspace's DVC cache;
a task on another node has a cache of its own and exchanges outputs and run-cache records through the project's DVC
remote. When the graph is done the workspace runs `dvc repro` (`--pull` across nodes), which restores every stage
from the run-cache: dvc.lock, the figures and the report are written once, there, as a serial run writes them.

graph.py     the stages `dvc repro` would run, in its order, read from DVC's index; which of them ask for a GPU
workspace.py the workspace's files as a snapshot, one git repository of them per node, a worktree per task
task.py      what runs inside a Ray task: one stage (or one shard of a generating stage) through DVC, and what it did
schedule.py  the driver: Ray tasks as their upstream stages finish, failures, the final `dvc repro`
timeline.py  which stage ran on which node and GPU when: reports/runs/<stamp>/timeline.json and .png
cli.py       `mless repro`
"""

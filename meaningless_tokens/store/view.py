"""The params a stage reads: exactly dvc.yaml's `params:` list of the stage (`params_view` refuses any other key;
`stage_params` is what an artifact records)."""

from __future__ import annotations

import functools

from meaningless_tokens.errors import UnlistedParam
from meaningless_tokens.store.stages import dvc_stage


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

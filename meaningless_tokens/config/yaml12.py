"""YAML as DVC reads and writes it: YAML 1.2 through ruamel.yaml, the project's one YAML semantics.

DVC reads params.yaml, dvc.yaml and dvc.lock with ruamel.yaml, and `dvc exp run -S` writes params back with it. YAML
1.1 (PyYAML) reads the same text otherwise: `on`, `off`, `yes`, `no` as booleans and `1e-3` as a string, so a value
DVC wrote as the string `on` would reach the schema as True. Every reader of these files goes through `load`."""

from __future__ import annotations

import io
from typing import Any

from ruamel.yaml import YAML, YAMLError  # noqa: F401 - YAMLError: what callers catch for a file that is not YAML
from ruamel.yaml.constructor import SafeConstructor
from ruamel.yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode  # noqa: F401 - Node: compose's, for editors

from meaningless_tokens.errors import ConfigError


class _UniqueKeys(SafeConstructor):
    """Refuses a key given twice in one mapping as ruamel.yaml (and so DVC) does, but in the project's words: the
    dotted key and both lines."""

    def construct_document(self, node: Any) -> Any:
        self._prefix = {}  # id of each mapping node -> its dotted key ("likelihood."), named in the error

        def walk(n, prefix):
            if isinstance(n, MappingNode):
                self._prefix[id(n)] = prefix
                for k, v in n.value:
                    walk(v, f"{prefix}{k.value}." if isinstance(k, ScalarNode) else prefix)
            elif isinstance(n, SequenceNode):
                for i, v in enumerate(n.value):
                    walk(v, f"{prefix}{i}.")

        walk(node, "")
        return super().construct_document(node)

    def check_mapping_key(self, node: Any, key_node: Any, mapping: Any, key: Any, value: Any) -> bool:
        if key in mapping:
            first = next(k for k, _ in node.value if self.construct_object(k, deep=True) == key)
            raise ConfigError(f"{self._prefix.get(id(node), '')}{key}: given twice (lines {first.start_mark.line + 1} "
                              f"and {key_node.start_mark.line + 1}); YAML keys are unique: keep one")
        return True


def load(text: str) -> Any:
    """The document's data as DVC's params reader returns it (plain dicts, lists, scalars); raises YAMLError on text
    that is not YAML and ConfigError (dotted key, both lines) on a key given twice."""
    yaml = YAML(typ="safe", pure=True)  # pure: the same reader whether or not ruamel's C extension is installed
    yaml.Constructor = _UniqueKeys
    return yaml.load(text)


def dump(data: Any) -> str:
    """`data` in block style, keys in their order, lines never folded: `load` reads back exactly `data` (a string
    such as 'on' or '1e3' is quoted where YAML 1.2 would read it otherwise)."""
    yaml = YAML(typ="safe", pure=True)
    yaml.default_flow_style = False
    yaml.sort_base_mapping_type_on_output = False
    yaml.width = 1 << 20
    out = io.StringIO()
    yaml.dump(data, out)
    return out.getvalue()


def flow(value: Any) -> str:
    """`value` on one line in flow style (`[0, 1]`, `{c: null}`, `'on'`), as a params value or a `-S` value reads."""
    yaml = YAML(typ="safe", pure=True)
    yaml.default_flow_style = True
    yaml.sort_base_mapping_type_on_output = False
    yaml.width = 1 << 20
    out = io.StringIO()
    yaml.dump([value], out)  # inside a list: a lone scalar would end the document with `...`
    return out.getvalue().strip()[1:-1]


def compose(text: str) -> Node:
    """The document's node tree, each node with its start and end in the text (for editing the text in place)."""
    return YAML(typ="rt").compose(text)

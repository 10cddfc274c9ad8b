"""A strict YAML loader for baseline files: safe tags only, no duplicate keys, no aliases.

PyYAML keeps the last of two equal keys silently, and an alias makes two places one object (or
expands to billions of nodes); ``StrictLoader`` refuses both, naming the line and the key.
``UnaliasedDumper`` writes an object met twice out twice, so the store never writes an alias it
would refuse. docs/gate.md, "The baseline store".
"""

from __future__ import annotations

from typing import Any

import yaml
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode, Node, SequenceNode

__all__ = ["QUOTE_CHARS", "StrictLoader", "StrictYAMLError", "UnaliasedDumper", "cut", "quoted"]

QUOTE_CHARS = 200  # at most this much of the file's own text is quoted in a message

_BASE: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_DUMPER_BASE: type[yaml.SafeDumper] = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


class StrictYAMLError(yaml.YAMLError):
    """A construct the strict loader refuses; ``line`` is 1-based, ``what`` says what and where."""

    def __init__(self, line: int, what: str) -> None:
        super().__init__(f"line {line}: {what}")
        self.line = line
        self.what = what


def cut(text: str, limit: int = QUOTE_CHARS) -> str:
    """``text`` cut to ``limit`` characters: a message quotes the file, never floods."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def quoted(value: object, limit: int = QUOTE_CHARS) -> str:
    """``value``'s repr, cut to ``limit`` characters."""
    return cut(repr(value), limit)


def _line(node: Node) -> int:
    """The 1-based line where ``node`` starts."""
    return int(node.start_mark.line) + 1


class StrictLoader(_BASE):  # type: ignore[valid-type,misc]
    """A safe loader that refuses duplicate keys and aliases (``StrictYAMLError``)."""

    def _refuse_alias(self, node: Node, where: str, line: int) -> None:
        """Raise when ``node`` was constructed already: only an alias reaches a node twice.
        ``where`` names the place that refers to it, at ``line``."""
        if node in self.constructed_objects:
            raise StrictYAMLError(
                line, f"{where} is an alias (*) of the node anchored (&) at line {_line(node)}; "
                "aliases are not allowed in a baseline file: write the value out"
            )

    def construct_object(self, node: Node, deep: bool = False) -> Any:
        """Any node, refusing one reached a second time (an alias anywhere the checks of mappings
        and sequences, which name the key, do not look)."""
        self._refuse_alias(node, "a node", _line(node))
        return super().construct_object(node, deep=deep)

    def construct_sequence(self, node: Node, deep: bool = False) -> list[Any]:
        """A list, refusing an item that is an alias."""
        if isinstance(node, SequenceNode):
            for index, child in enumerate(node.value):
                self._refuse_alias(child, f"item {index} of the list starting here", _line(node))
        return list(super().construct_sequence(node, deep=deep))

    def construct_mapping(self, node: Node, deep: bool = False) -> dict[Any, Any]:
        """A mapping, refusing an aliased key or value and a key that appears twice (PyYAML
        keeps the last one)."""
        if not isinstance(node, MappingNode):
            raise ConstructorError(None, None, f"expected a mapping, found {type(node).__name__}", node.start_mark)
        self.flatten_mapping(node)
        mapping: dict[Any, Any] = {}
        lines: dict[Any, int] = {}
        for key_node, value_node in node.value:
            self._refuse_alias(key_node, "a key", _line(key_node))
            key = self.construct_object(key_node, deep=deep)
            try:
                hash(key)
            except TypeError:
                raise ConstructorError("while reading a mapping", node.start_mark, "found an unhashable key",
                                       key_node.start_mark) from None
            if key in mapping:
                raise StrictYAMLError(
                    _line(key_node), f"key {quoted(key)} appears twice in one mapping (first at line {lines[key]}); "
                    "PyYAML would keep the last silently: keep the one that is right and remove the other"
                )
            self._refuse_alias(value_node, f"the value of key {quoted(key)}", _line(key_node))
            mapping[key], lines[key] = self.construct_object(value_node, deep=deep), _line(key_node)
        return mapping


class UnaliasedDumper(_DUMPER_BASE):  # type: ignore[valid-type,misc]
    """A safe dumper (libyaml's where PyYAML has it) that never writes an anchor or an alias."""

    def ignore_aliases(self, data: Any) -> bool:
        """Every object written out in full, however often it is met."""
        return True

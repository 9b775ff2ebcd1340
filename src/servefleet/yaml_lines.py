"""Where a setting is in a YAML file: the line of a validation error's location, so that every
error about a file names ``file:line``."""

from __future__ import annotations

from collections.abc import Sequence

import yaml


def compose(text: str) -> yaml.Node | None:
    """The YAML's node tree (positions kept), or None when it does not parse."""
    try:
        return yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return None


def line_of(root: yaml.Node | None, loc: Sequence[str | int]) -> int | None:
    """The 1-based line of the deepest node along ``loc`` (mapping keys, list indices): the
    setting itself, or the section that lacks it. None for the top level or no tree."""
    node, found = root, None
    for part in loc:
        child = None
        if isinstance(node, yaml.MappingNode):
            child = next((v for k, v in node.value if k.value == str(part)), None)
            if child is None:  # an unknown key: the key itself
                child = next((k for k, _ in node.value if k.value == str(part)), None)
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int):
            child = node.value[part] if 0 <= part < len(node.value) else None
        if child is None:
            break
        node = found = child
    return None if found is None else found.start_mark.line + 1


def syntax_error(origin: str, exc: yaml.YAMLError) -> str:
    """``origin:line: invalid YAML: what`` for a parse error."""
    mark = getattr(exc, "problem_mark", None)
    where = f"{origin}:{mark.line + 1}" if mark is not None else origin
    problem = getattr(exc, "problem", None) or str(exc)
    return f"{where}: invalid YAML: {problem}"

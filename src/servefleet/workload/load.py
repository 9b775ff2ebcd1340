"""Loading a workload: a preset name, or a YAML file (optionally ``base:`` a preset), then
overrides; validated into a ``WorkloadSpec`` with errors that name the file, the field and the fix.
"""

from __future__ import annotations

import difflib
from pathlib import Path

import yaml
from pydantic import ValidationError

from . import presets
from .errors import WorkloadError
from .spec import WorkloadSpec


def load_workload(name_or_path: str | Path, *, overrides: dict | None = None) -> WorkloadSpec:
    """A preset (``chat-3tier``, ``enterprise-mix``, ``sharegpt:PATH``) or a YAML file, with
    ``overrides`` deep-merged on top (a ``None`` value deletes a key)."""
    text = str(name_or_path)
    if presets.is_preset(text) and not Path(text).is_file():
        raw, base_dir = presets.preset(text), None
        origin = f"preset {text!r}" + (f" (usage: {u})" if (u := presets.USAGE.get(text)) else "")
    else:
        raw, base_dir, origin = _read_yaml(Path(text)), Path(text).parent, text
        raw.setdefault("name", _name_from(Path(text)))
        if raw.get("base") is not None:
            raw = deep_merge(_base(raw["base"], origin), raw)
    if overrides:
        raw, origin = deep_merge(raw, overrides), f"{origin} with overrides"
    return validate_workload(raw, base_dir=base_dir, origin=origin)


def validate_workload(
    raw: dict, *, base_dir: Path | None = None, origin: str = "workload"
) -> WorkloadSpec:
    try:
        return WorkloadSpec.model_validate(raw, context={"base_dir": base_dir})
    except ValidationError as e:
        raise WorkloadError(format_errors(e, origin)) from None


def recorded_workload(summary: dict) -> WorkloadSpec:
    """The workload a ``servefleet bench`` summary ran, from the spec it recorded (a preset,
    a file or ``--input-len/--output-len`` alike), so a replay needs none of the files."""
    return validate_workload(summary["workload"], origin="the workload recorded in summary.json")


def deep_merge(base: dict, over: dict) -> dict:
    """``over`` on top of ``base``: mappings merge key by key (unless they name different
    ``type``s, then ``over`` replaces), anything else replaces, ``None`` deletes."""
    out = dict(base)
    for k, v in over.items():
        old = out.get(k)
        if v is None:
            out.pop(k, None)
        elif (
            isinstance(v, dict)
            and isinstance(old, dict)
            and v.get("type", old.get("type")) == old.get("type")
        ):
            out[k] = deep_merge(old, v)
        else:
            out[k] = v
    return out


def _name_from(path: Path) -> str:
    return "".join(c if c.isalnum() or c in "_.+-" else "-" for c in path.stem) or "workload"


def _base(name, origin: str) -> dict:
    if not isinstance(name, str) or not presets.is_preset(name):
        raise WorkloadError(
            f"{origin}: base: {name!r} is not a preset; use one of {', '.join(presets.PRESETS)}"
        )
    return presets.preset(name)


def _read_yaml(path: Path) -> dict:
    if not path.is_file():
        close = difflib.get_close_matches(str(path), list(presets.PRESETS), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise WorkloadError(
            f"{path}: no such workload file, and not a preset ({', '.join(presets.PRESETS)}){hint}"
        )
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        raise WorkloadError(f"{where}: invalid YAML: {getattr(e, 'problem', None) or e}") from None
    if not isinstance(data, dict):
        raise WorkloadError(
            f"{path}: expected a mapping (name:, arrival:, classes: ...) at the top level"
        )
    return data


# ---- error messages ---------------------------------------------------------------------------

_LENGTHS = ("fixed", "uniform", "normal", "lognormal", "empirical")
_UNIONS = {
    "prompt": _LENGTHS,
    "output": _LENGTHS,
    "turns": _LENGTHS,
    "arrival": ("poisson", "gamma", "constant", "bursts", "closed", "ramp"),
    "dataset": ("sharegpt",),
}


def format_errors(err: ValidationError, origin: str) -> str:
    lines = [f"{origin}: invalid workload:"]
    for e in err.errors():
        loc = _clean_loc(e["loc"])
        lines.append(f"  {'.'.join(map(str, loc)) or '(top level)'}: {_message(e, loc)}")
    return "\n".join(lines)


def _clean_loc(loc: tuple) -> tuple:
    """Drop the union tags pydantic inserts (``prompt.normal.sd`` -> ``prompt.sd``)."""
    out: list = []
    for part in loc:
        if (
            out
            and out[-1] in _UNIONS
            and isinstance(part, str)
            and ("[" in part or part in _UNIONS[out[-1]])
        ):
            continue
        out.append(part)
    return tuple(out)


def _message(e: dict, loc: tuple) -> str:
    kind, ctx, field = e["type"], e.get("ctx") or {}, loc[-1] if loc else ""
    if kind == "extra_forbidden":
        close = difflib.get_close_matches(str(field), _FIELDS, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        return f"unknown field {field!r}{hint} (remove it or fix the spelling)"
    if kind == "missing":
        return f"required field missing; add `{field}: ...`"
    if kind == "union_tag_invalid":
        return f"unknown type {ctx.get('tag')!r}; use one of {ctx.get('expected_tags')}"
    if kind == "union_tag_not_found":
        choices = ", ".join(_UNIONS.get(str(field), ())) or "see docs/workload.md"
        return f"missing `type:`; say which kind it is: {choices}"
    msg = e["msg"].removeprefix("Value error, ")
    value = e.get("input")
    got = (
        f" (got {value!r})"
        if isinstance(value, str | int | float) and kind != "value_error"
        else ""
    )
    return msg + got


def _vocabulary() -> list[str]:
    from . import spec

    fields: set[str] = set()
    for obj in vars(spec).values():
        if isinstance(obj, type) and issubclass(obj, spec._Model):
            fields.update(obj.model_fields)
    return sorted(fields)


_FIELDS = _vocabulary()

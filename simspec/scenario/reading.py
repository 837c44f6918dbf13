"""Reading scenario and profile files: YAML with clear errors, `--set` overrides, and pydantic's report
turned into one InputError naming the key path and what is allowed there."""

from __future__ import annotations

import copy
import re
import types
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from simspec.errors import InputError
from simspec.outputs import resolve_or_absolute


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, except that a mapping giving one key twice is an error (PyYAML keeps the last one,
    silently dropping the first)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, Any] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # `<<: *anchor`: the mapping's own keys override it
                continue
            key = self.construct_object(key_node, deep=deep)  # type: ignore[no-untyped-call]
            try:
                first = seen.get(key)
            except TypeError:  # an unhashable key: construct_mapping below says so
                continue
            if first is not None:
                raise DuplicateKeyError(key, first, key_node.start_mark)
            seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep=deep)


# YAML 1.1 (PyYAML) reads an exponent without a dot (1e-1, 5e3) as text; YAML 1.2 and every user read it as a
# number. With strict number fields that text would be refused, so this loader reads it as a float.
_UniqueKeyLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?(?:\d+(?:\.\d*)?|\.\d+)[eE][-+]?\d+$"), list("-+0123456789."))


class DuplicateKeyError(yaml.YAMLError):
    def __init__(self, key: Any, first: yaml.Mark, again: yaml.Mark):
        super().__init__(f"key {key!r} given twice (line {first.line + 1} and line {again.line + 1})")
        self.key = key
        self.first = first
        self.again = again


def parse_yaml(text: str, file: str) -> Any:
    """YAML text as Python data, through the one loader every user file goes through: a syntax error or a key
    given twice in one mapping is an InputError naming the file and the line."""
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506  # a SafeLoader subclass
    except DuplicateKeyError as exc:
        raise InputError(f"given twice in one mapping (line {exc.first.line + 1} and line {exc.again.line + 1});"
                         " keep one: YAML would silently drop the first", file=file, key=str(exc.key)) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        raise InputError(f"not valid YAML{where}: {getattr(exc, 'problem', exc)}", file=file) from None


def read_yaml(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError("file not found", file=str(path)) from None
    except UnicodeDecodeError as exc:
        raise InputError(f"not UTF-8 text (byte {exc.start}); save it as UTF-8", file=str(path)) from None
    except OSError as exc:
        raise InputError(f"cannot read: {exc.strerror}", file=str(path)) from None
    data = parse_yaml(text, str(path))
    if not isinstance(data, dict):
        raise InputError("must be a YAML mapping of keys to values", file=str(path))
    return data


def relative_to_scenario(path: str, scenario_path: str) -> Path:
    """A path a scenario names (profile, corpus, tokenizer), resolved against the scenario file's directory;
    a scenario without a file ("<...>", e.g. inline in a case or a sweep) resolves against the working one."""
    base = Path(scenario_path).parent if scenario_path and not scenario_path.startswith("<") else Path.cwd()
    return resolve_or_absolute(base / path)  # a symlink loop: the read names it


def apply_overrides(data: dict[str, Any], overrides: list[str], file: str) -> dict[str, Any]:
    """Apply `key.path=value` overrides (value parsed as YAML) to a copy of the raw scenario mapping."""
    out = copy.deepcopy(data)
    for item in overrides:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise InputError(f"--set expects key.path=value, got {item!r}", file=file)
        try:
            value = yaml.load(raw, Loader=_UniqueKeyLoader) if raw.strip() else None  # noqa: S506  # SafeLoader
        except DuplicateKeyError as exc:
            raise InputError(f"--set value {raw!r} gives {exc.key!r} twice; keep one", file=file, key=key) from None
        except yaml.YAMLError:
            raise InputError(f"--set value {raw!r} is not valid YAML (a scalar, [list] or {{mapping}})", file=file,
                             key=key) from None
        set_field(out, key, value, file)
    return out


def set_field(data: dict[str, Any], path: str, value: Any, file: str) -> None:
    """Set one field of a raw scenario mapping in place: missing sections are created; a mapping value
    replaces the section it names. The one path walk behind `--set` and sweeps' structured changes."""
    node = data
    parts = path.split(".")
    if not all(part.strip() for part in parts):
        raise InputError(f"{path!r} is not a field path (dot-separated keys, e.g. server.tp)", file=file, key=path)
    for i, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise InputError(f"{'.'.join(parts[:i + 1])} is not a mapping here (it is {child!r}), so {path} cannot"
                             " be set", file=file, key=path)
        node = child
    node[parts[-1]] = copy.deepcopy(value)


def _model_at(root: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The pydantic model class that holds the last key of `loc` (for listing allowed keys)."""
    model: Any = root
    for part in loc[:-1]:
        if isinstance(part, int) or model is None:
            continue
        field = model.model_fields.get(part) if isinstance(model, type) and issubclass(model, BaseModel) else None
        if field is None:
            # a discriminated-union tag in the location: pick the member with that tag
            model = _union_member(model, part)
            continue
        model = _unwrap(field.annotation)
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def _unwrap(annotation: Any) -> Any:
    args = typing.get_args(annotation)
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        models = [a for a in args if isinstance(a, type) and issubclass(a, BaseModel)]
        return models[0] if len(models) == 1 else tuple(models) if models else None
    return annotation


def _union_member(candidates: Any, tag: Any) -> Any:
    if isinstance(candidates, tuple):
        for member in candidates:
            type_field = member.model_fields.get("type") or member.model_fields.get("kind")
            if type_field is not None and tag in typing.get_args(type_field.annotation):
                return member
    return candidates


def _key_path(loc: tuple[Any, ...], root: type[BaseModel]) -> str:
    parts: list[str] = []
    model: Any = root
    for part in loc:
        if isinstance(part, str) and isinstance(model, tuple):
            model = _union_member(model, part)  # skip the tag pydantic inserts for discriminated unions
            continue
        parts.append(str(part))
        if isinstance(part, str) and isinstance(model, type) and issubclass(model, BaseModel):
            field = model.model_fields.get(part)
            model = _unwrap(field.annotation) if field is not None else None
    return ".".join(parts)


_STRICT_TYPES = {"float_type": "the number", "int_type": "the number", "bool_type": "true or false"}


def error_text(err: Any) -> str:
    """One of pydantic's errors (an item of ValidationError.errors()) as the text after the key path."""
    msg = err["msg"].removeprefix("Value error, ")
    got = err.get("input")
    if (err["type"] not in ("model_type", "value_error") or got is None) and not isinstance(got, dict | list):
        msg = f"{msg} (got {got!r})"
    if err["type"] in ("float_type", "int_type") and isinstance(got, bool):
        msg += "; true and false are not numbers"
    elif err["type"] == "bool_type" and isinstance(got, int | float) and not isinstance(got, bool):
        msg += "; write true or false"
    if err["type"] in _STRICT_TYPES and isinstance(got, str):  # YAML read it as text: it was quoted
        msg += f"; a quoted value is text: write {_STRICT_TYPES[err['type']]} without quotes"
    return msg


def validation_error(exc: ValidationError, file: str, root: type[BaseModel]) -> InputError:
    """Turn pydantic's report into one InputError per the first problem, with allowed values spelled out."""
    lines = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        key = _key_path(loc, root)
        if err["type"] == "extra_forbidden":
            holder = _model_at(root, loc)
            allowed = ", ".join(holder.model_fields) if holder else "see the schema"
            lines.append((key, f"unknown key; allowed keys here: {allowed}"))
        elif err["type"] == "missing":
            lines.append((key, "required key is missing"))
        else:
            lines.append((key, error_text(err)))
    key, msg = lines[0]
    more = f" (and {len(lines) - 1} more problem(s): " + "; ".join(f"{k}: {m}" for k, m in lines[1:]) + ")" \
        if len(lines) > 1 else ""
    return InputError(msg + more, file=file, key=key or None)

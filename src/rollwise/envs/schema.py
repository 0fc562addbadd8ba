"""Tool arguments checked against their JSON schema before anything runs.

Model output is data: a call with an unknown name, missing, extra or wrong-typed arguments, huge
strings or values that are not JSON becomes a message for the policy, never an exception and
never a value that reaches a handler unchecked.
"""

from __future__ import annotations

import json
import math

from rollwise.types import ToolSpec

MAX_STRING = 10_000  # characters in one string value
MAX_ARGUMENTS = 100_000  # characters of the whole arguments object as JSON
MAX_DEPTH = 16  # nesting of arrays and objects
INT64 = 2**63  # SQLite (and most backends) hold 64-bit integers


def check_call(specs: dict[str, ToolSpec], name: object, arguments: object) -> str | None:
    """None when the call fits one of `specs`, else the error to show the policy."""
    spec = specs.get(name) if isinstance(name, str) else None
    if spec is None:
        return f"unknown tool {str(name)[:100]}"
    return check_arguments(spec, arguments)


def check_arguments(spec: ToolSpec, arguments: object) -> str | None:
    if not isinstance(arguments, dict):
        return "arguments must be an object"
    try:
        size = len(json.dumps(arguments, allow_nan=False))
    except (TypeError, ValueError, RecursionError):
        return "arguments must be JSON"
    if size > MAX_ARGUMENTS:
        return f"arguments are too long ({size} > {MAX_ARGUMENTS} characters)"
    props = spec.parameters.get("properties", {})
    required = spec.parameters.get("required", [])
    if len(props) == 1 and list(props) == list(required) and set(arguments) != set(props):
        return f"{spec.name} takes exactly one argument: {required[0]}"
    missing = [a for a in required if a not in arguments]
    if missing:
        return f"{spec.name} is missing argument {', '.join(missing)}"
    extra = [str(a)[:100] for a in arguments if a not in props]
    if extra:
        return f"{spec.name} takes no argument {', '.join(extra)}"
    for key, value in arguments.items():
        if error := check_value(value, props[key], key, 0):
            return error
    return None


def check_value(value: object, schema: dict, path: str, depth: int) -> str | None:
    """Type, enum, size and range of one value, recursing into arrays and objects."""
    if depth > MAX_DEPTH:
        return f"{path} is nested too deeply"
    types = schema.get("type") or []
    types = [types] if isinstance(types, str) else types
    if types and not any(fits(value, t) for t in types):
        return f"{path} must be {' or '.join(types)}"
    if "enum" in schema and value not in schema["enum"]:
        return f"{path} must be one of {', '.join(map(str, schema['enum']))}"
    if isinstance(value, str) and len(value) > MAX_STRING:
        return f"{path} is too long ({len(value)} > {MAX_STRING} characters)"
    if isinstance(value, int) and not isinstance(value, bool) and not -INT64 <= value < INT64:
        return f"{path} is out of range"
    if isinstance(value, list):
        for i, item in enumerate(value):
            if error := check_value(item, schema.get("items", {}), f"{path}[{i}]", depth + 1):
                return error
    if isinstance(value, dict):
        props = schema.get("properties", {})
        missing = [k for k in schema.get("required", []) if k not in value]
        if missing:
            return f"{path} is missing {', '.join(missing)}"
        for key, item in value.items():
            if error := check_value(item, props.get(key, {}), f"{path}.{key}", depth + 1):
                return error
    return None


def fits(value: object, typ: str) -> bool:
    """JSON-schema types; booleans are not numbers. Unknown type names constrain nothing."""
    if typ == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if typ == "number":
        return (
            isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        )
    checks = {"string": str, "boolean": bool, "array": list, "object": dict, "null": type(None)}
    return isinstance(value, checks[typ]) if typ in checks else True

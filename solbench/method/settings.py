"""A method's settings on their one typed path from the spec to the method: ``build_method_settings`` builds the
method's Config once, strictly (an unknown key names itself, the method and where; values coerced to the field's
type), and ``MethodSettings`` carries it, with its canonical values as the read-only mapping a run id hashes and
spec.json stores. ``method_settings`` builds one from a run read back from spec.json.

Split from solbench/method/__init__.py (the Method interface and its registry), which re-exports these names.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import json
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any

from solbench.errors import ConfigError


class MethodSettings(dict):
    """A method's settings as they travel from the spec to the method: the typed ``config`` (an instance of the
    method's Config, built once) and, as this read-only mapping, its canonical values (JSON types: what
    a run's id hashes and spec.json stores). ``RunConfig.method_config`` holds one after expansion; a run read
    back from spec.json holds the plain mapping, which :func:`method_settings` builds into one."""

    __slots__ = ("method", "config")

    def __init__(self, values: Any = (), *, method: str | None = None, config: Any = None) -> None:
        super().__init__(values)
        self.method = method
        self.config = config

    @classmethod
    def of(cls, method: str, config: Any) -> "MethodSettings":
        """The settings of a built Config instance."""
        return cls(json.loads(json.dumps(dataclasses.asdict(config))), method=method, config=config)

    def replace(self, **changes: Any) -> "MethodSettings":
        """These settings with some fields changed (the Config's checks run again)."""
        return MethodSettings.of(self.method, dataclasses.replace(self.config, **changes))

    def _frozen(self, *args, **kwargs):
        raise TypeError("a run's method settings are fixed at expansion; use .replace(field=value)")

    __setitem__ = __delitem__ = update = pop = popitem = clear = setdefault = __ior__ = _frozen

    def __reduce__(self):
        return (_rebuild_settings, (dict(self), self.method, self.config))

    def __copy__(self) -> "MethodSettings":
        return self

    def __deepcopy__(self, memo) -> "MethodSettings":
        return MethodSettings(dict(self), method=self.method, config=copy.deepcopy(self.config, memo))


def _rebuild_settings(values: dict, method: str | None, config: Any) -> MethodSettings:
    return MethodSettings(values, method=method, config=config)


def method_settings(name: str, values: Mapping[str, Any] | None) -> MethodSettings:
    """The settings of method ``name``: ``values`` itself when it is already built for it, else built from the
    mapping (a run's spec.json; strictly, as at expansion)."""
    if isinstance(values, MethodSettings) and values.method == name and values.config is not None:
        return values
    return build_method_settings(name, values)


def build_method_settings(name: str, values: Mapping[str, Any] | None, where: str = "method_config",
                          locate: Callable[[str], str] | None = None) -> MethodSettings:
    """Build ``get_method(name).Config`` from a spec's mapping, strictly: an unknown or mistyped field is an
    error naming it and the method. ``where`` prefixes every message; ``locate(field)``, when given, says where
    the field is set (``spec.yaml:12``; ``locate(None)``: where the settings as a whole are) and comes first."""
    from solbench.method import get_method  # the registry, in the package this module is part of

    cls = get_method(name)
    values = dict(values or {})
    fields = {f.name: f for f in dataclasses.fields(cls.Config)}

    def at(key: str | None) -> str:
        return f"{locate(key)}: {where}" if locate is not None else where

    unknown = [k for k in values if k not in fields]
    if unknown:
        messages = []
        for key in unknown:
            close = difflib.get_close_matches(key, list(fields), n=1)
            messages.append(f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        raise ConfigError(f"{at(unknown[0])}: unknown field(s) {', '.join(messages)} for method {name!r}; "
                          f"fields are {', '.join(fields)}")
    hints = typing.get_type_hints(cls.Config)
    converted = {}
    for key, value in values.items():
        try:
            converted[key] = _coerce(value, hints[key], f"{where}.{key}")
        except ConfigError as err:
            raise ConfigError(f"{locate(key)}: {err}" if locate is not None else str(err)) from None
    try:
        config = cls.Config(**converted)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{at(None)}: invalid config for method {name!r}: {exc}") from exc
    return MethodSettings.of(name, config)


def validate_method_config(name: str, values: Mapping[str, Any] | None, where: str = "method_config") -> Any:
    """``get_method(name).Config`` built from overrides, rejecting unknown or mistyped fields (the typed config
    of :func:`build_method_settings`)."""
    return build_method_settings(name, values, where).config


def _coerce(value: Any, hint: Any, where: str) -> Any:
    """Check ``value`` against a simple type hint (int, float, bool, str, Literal, Optional, tuple, list)."""
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(value, arg, where)
            except ConfigError as exc:
                errors.append(str(exc))
        raise ConfigError(f"{where}: {value!r} does not match {_hint_name(hint)}")
    if origin is typing.Literal:
        if value in args:
            return value
        close = difflib.get_close_matches(str(value), [str(a) for a in args], n=1)
        hint_text = f"; did you mean {close[0]!r}?" if close else ""
        raise ConfigError(f"{where}: {value!r} is not one of {list(args)}{hint_text}")
    if origin in (tuple, list):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{where}: expected a {origin.__name__}, got {value!r}")
        item_hint = args[0] if args else Any
        items = [_coerce(v, item_hint, f"{where}[{i}]") for i, v in enumerate(value)]
        return origin(items)
    if hint is Any:
        return value
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{where}: expected true/false, got {value!r}")
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{where}: expected an integer, got {value!r}")
    if hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise ConfigError(f"{where}: expected a number, got {value!r}")
    if hint is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{where}: expected a string, got {value!r}")
    return value


def _hint_name(hint: Any) -> str:
    return getattr(hint, "__name__", None) or str(hint).replace("typing.", "")


# ----------------------------------------------------------------------------------------------
# Small helpers shared by methods
# ----------------------------------------------------------------------------------------------

"""One declaration per option: dataclass fields that drive the click options, validation, the manifest
identity and recipe keys (``docs/architecture.md``, "Configs").

A stage (or engine) config is a frozen dataclass of :class:`Config` whose fields are declared with
:func:`opt`::

    @dataclass(frozen=True)
    class MCLabelConfig(Config):
        continuations: int = opt(8, "K: continuations per step prefix.", short="-k", min=1)
        mode: str = opt("exhaustive", "exhaustive or binary.", choices=MODES)

From that one declaration:

* :func:`click_options` makes the click options (flag ``--continuations``, type, range, default, help);
* ``Config.__post_init__`` validates values from any source (flags, recipes, Python callers) and raises
  :class:`~stepkit.errors.ConfigError` naming the option;
* :func:`identity` is the JSON-able part that changes results (``identity=False`` leaves a field out,
  e.g. a server URL or a concurrency), which the runner stores in the manifest;
* :func:`from_params` builds the config from the CLI's keyword arguments, :func:`field_names` lists the
  keys a recipe may set.

The model is vLLM's ``EngineArgs`` (``vllm/engine/arg_utils.py``) and TRL's ``ScriptArguments``: the
dataclass is the source of truth, the parser is derived from it.
"""

from __future__ import annotations

import dataclasses
import math
import os
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from stepkit.errors import ConfigError

_KEY = "stepkit"


@dataclass(frozen=True)
class Opt:
    """What :func:`opt` records in a field's metadata (see :func:`opt` for the meaning of each)."""

    help: str = ""
    flag: str | None = None
    short: str | None = None
    choices: tuple[str, ...] | None = None
    min: float | None = None
    max: float | None = None
    min_open: bool = False
    identity: bool = True
    cli: bool = True
    metavar: str | None = None
    file: bool = False
    words: tuple[str, ...] | None = None


def opt(default: Any = dataclasses.MISSING, help: str = "", *, flag: str | None = None, short: str | None = None,
        choices: tuple[str, ...] | list[str] | None = None, min: float | None = None, max: float | None = None,
        min_open: bool = False, identity: bool = True, cli: bool = True, metavar: str | None = None,
        file: bool = False, words: tuple[str, ...] | None = None) -> Any:
    """A config field with its command-line and identity metadata.

    Args:
        default: the default value (tuples for multi-valued options; ``None`` for "not set").
        help: the option's help text.
        flag: the click flag declaration when it is not ``--<field-name>`` (e.g.
            ``"--prefix-caching/--no-prefix-caching"`` for a boolean that defaults to True).
        short: a short flag such as ``"-k"``.
        choices: allowed values of a string option.
        min / max: bounds of a number (inclusive; ``min_open`` makes ``min`` exclusive).
        identity: whether the value changes results (it enters the manifest identity, so a rerun with
            another value refuses). False for where a server runs, concurrency, timeouts.
        cli: False for a field with no command-line option (set by code or a recipe only).
        metavar: click's metavar.
        file: the value names a file that must exist.
        words: words a number option also takes (``("auto",)`` for ``--rank auto``); the config keeps the
            word, and its own ``__post_init__`` turns it into a number.
    """
    meta = Opt(help=help, flag=flag, short=short, choices=tuple(choices) if choices else None, min=min, max=max,
               min_open=min_open, identity=identity, cli=cli, metavar=metavar, file=file,
               words=tuple(words) if words else None)
    return dataclasses.field(default=default, metadata={_KEY: meta})


def _meta(f: dataclasses.Field) -> Opt:
    return f.metadata.get(_KEY) or Opt(cli=False)


def _base_type(tp: Any) -> tuple[type, bool, bool]:
    """(scalar type, optional?, multiple?) of an annotation such as ``int``, ``str | None``, ``tuple[str, ...]``."""
    optional = multiple = False
    args = typing.get_args(tp)
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        non_none = [a for a in args if a is not type(None)]
        optional, tp = len(non_none) < len(args), non_none[0]
        args = typing.get_args(tp)
    if typing.get_origin(tp) is tuple:
        multiple, tp = True, args[0]
    return tp, optional, multiple


def _fields(cls) -> list[tuple[dataclasses.Field, Any]]:
    hints = typing.get_type_hints(cls)
    return [(f, hints[f.name]) for f in dataclasses.fields(cls)]


class Config:
    """Base of every stage and engine config: validates each field against its :func:`opt` metadata.

    Raises:
        ConfigError: a value outside its range or choices, a non-finite float, or the wrong type;
            the message names the option as a flag (``--continuations``).
    """

    def __post_init__(self):
        for f in dataclasses.fields(self):
            object.__setattr__(self, f.name, check_field(type(self), f.name, getattr(self, f.name)))


def _check_value(name: str, v: Any, base: type, m: Opt) -> Any:
    """``v`` checked against the field's type and bounds; an int given for a float field becomes a float
    (so ``temperature: 1`` in a recipe and ``--temperature 1`` on the command line are one configuration)."""
    if base is bool:
        if not isinstance(v, bool):
            raise ConfigError(f"{name} must be true or false, got {v!r:.60}")
        return v
    if base in (int, float):
        if m.words and isinstance(v, str) and v in m.words:
            return v
        if isinstance(v, bool) or not isinstance(v, (int, float)) or (base is int and not isinstance(v, int)):
            what = "an integer" if base is int else "a number"
            raise ConfigError(f"{name} must be {what}{''.join(f' or {w}' for w in m.words or ())}, got {v!r:.60}")
        if base is float:
            try:
                v = float(v)
            except OverflowError:
                raise ConfigError(f"{name} must be a finite number, got a {len(str(v))}-digit integer") from None
            if not math.isfinite(v):
                raise ConfigError(f"{name} must be a finite number, got {v}")
        if m.min is not None and (v < m.min or (m.min_open and v == m.min)):
            raise ConfigError(f"{name} must be {'>' if m.min_open else '>='} {m.min}, got {str(v)[:40]}")
        if m.max is not None and v > m.max:
            raise ConfigError(f"{name} must be <= {m.max}, got {str(v)[:40]}")
        return v
    if base is str:
        if not isinstance(v, str):
            raise ConfigError(f"{name} must be text, got {v!r:.60}")
        if m.choices and v not in m.choices:
            raise ConfigError(f"{name} must be one of {', '.join(m.choices)}, got {v!r:.60}")
        if m.file and not os.path.isfile(v):
            raise ConfigError(f"{name}: {v}: no such file")
    return v


def flag_of(f: dataclasses.Field) -> str:
    """The long flag of a field (``--max-tokens``), as users see it in messages."""
    m = _meta(f)
    if m.flag:
        return m.flag.split("/")[0]
    return "--" + f.name.replace("_", "-")


def field_names(cls) -> tuple[str, ...]:
    """The names of a config's fields (the keys a recipe may set)."""
    return tuple(f.name for f in dataclasses.fields(cls))


def identity(cfg: Any) -> Any:
    """The JSON-able part of ``cfg`` that changes results: fields with ``identity=True``, nested configs
    by their own identity, tuples as lists. Non-config values are returned as they are."""
    if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
        if hasattr(cfg, "identity") and not isinstance(cfg, Config):
            return cfg.identity()
        return {f.name: identity(getattr(cfg, f.name)) for f in dataclasses.fields(cfg) if _meta(f).identity}
    if isinstance(cfg, (list, tuple)):
        return [identity(v) for v in cfg]
    if isinstance(cfg, dict):
        return {k: identity(v) for k, v in cfg.items()}
    return cfg


def from_params(cls, params: dict[str, Any], **overrides: Any):
    """Build ``cls`` from the CLI's keyword arguments (keys are field names; others are ignored), with
    ``overrides`` taking precedence.

    Raises:
        ConfigError: a value fails validation (see :class:`Config`).
    """
    kw = {f.name: params[f.name] for f in dataclasses.fields(cls) if f.name in params}
    kw.update(overrides)
    return cls(**kw)


def click_options(cls, defaults: dict[str, Any] | None = None, only: tuple[str, ...] | None = None) -> Callable:
    """A decorator adding one click option per CLI field of ``cls`` (in field order).

    Args:
        cls: a :class:`Config` dataclass.
        defaults: per-command defaults that replace the field defaults (e.g. the judge's temperature).
        only: restrict to these field names.

    Click's parameter name is the field name, so ``from_params(cls, kwargs)`` finds every value.
    """
    import click

    defaults = defaults or {}

    def decorate(fn):
        for f, tp in reversed(_fields(cls)):
            m = _meta(f)
            if not m.cli or (only is not None and f.name not in only):
                continue
            base, optional, multiple = _base_type(tp)
            default = defaults.get(f.name, f.default)
            decls = [d for d in (m.flag or flag_of(f), m.short) if d] + [f.name]
            kw: dict[str, Any] = {"help": m.help, "default": default, "metavar": m.metavar}
            if base is bool:
                if "/" not in decls[0]:
                    kw["is_flag"] = True
                kw["show_default"] = "/" in decls[0]
            else:
                kw["type"] = _click_type(base, m)
                kw["show_default"] = default not in (None, ())
                kw["multiple"] = multiple
                if multiple:
                    kw["default"] = tuple(default or ())
            fn = click.option(*decls, **kw)(fn)
        return fn

    return decorate


def _click_type(base: type, m: Opt):
    import click

    if m.words and base in (int, float):
        return _number_or_words(_click_type(base, dataclasses.replace(m, words=None)), m.words)
    if base is str:
        if m.file:
            return click.Path(exists=True, dir_okay=False)
        return click.Choice(list(m.choices)) if m.choices else click.STRING
    if base is int:
        return click.IntRange(m.min, m.max) if (m.min is not None or m.max is not None) else click.INT
    return _finite_float(m.min, m.max, m.min_open)


def _finite_float(lo, hi, lo_open):
    """click's FloatRange that also refuses nan and inf (which compare false to every bound)."""
    import click

    class FiniteFloatRange(click.FloatRange):
        name = "float"

        def _describe_range(self) -> str:
            return super()._describe_range() if (lo is not None or hi is not None) else "finite"

        def convert(self, value, param, ctx):
            v = super().convert(value, param, ctx)
            if not math.isfinite(v):
                self.fail(f"{value!r} is not a finite number", param, ctx)
            return v

    return FiniteFloatRange(lo, hi, min_open=lo_open)


def _number_or_words(number, words: tuple[str, ...]):
    """A click type taking one of ``words`` as it is, or a number checked by the click type ``number``."""
    import click

    class NumberOrWords(click.ParamType):
        name = f"{number.name}|{'|'.join(words)}"

        def convert(self, value, param, ctx):
            if isinstance(value, str) and value in words:
                return value
            return number.convert(value, param, ctx)

    return NumberOrWords()


def given_on_command_line(ctx, name: str) -> bool:
    """Whether click's parameter ``name`` was given on the command line (or by environment)."""
    src = ctx.get_parameter_source(name)
    return src is not None and src.name in ("COMMANDLINE", "ENVIRONMENT")


def check_field(cls, name: str, value: Any) -> Any:
    """Validate one value for field ``name`` of ``cls`` (recipes check key by key); returns the value
    (a list becomes a tuple for multi-valued fields).

    Raises:
        ConfigError: unknown field, or the value fails the field's checks.
    """
    for f, tp in _fields(cls):
        if f.name == name:
            base, optional, multiple = _base_type(tp)
            if value is None:
                if not optional:
                    raise ConfigError(f"{flag_of(f)} needs a value")
                return value
            if multiple:
                if isinstance(value, (str, bytes)) or not isinstance(value, (list, tuple)):
                    raise ConfigError(f"{flag_of(f)} takes a list of values, got {value!r:.60}")
                return tuple(_check_value(flag_of(f), v, base, _meta(f)) for v in value)
            return _check_value(flag_of(f), value, base, _meta(f))
    raise ConfigError(f"unknown option {name!r}")

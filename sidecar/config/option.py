"""Fields that are options of ``ckpt serve``: the Option in a field's metadata, and a configuration's options.

A field declared ``field(..., metadata=option("what it does"))`` is set by the flag ``--NAME`` and the
environment variable ``CKPT_NAME`` (NAME its field name: dashes, or capitals). Its help, how its text is
read, and its default come from that one declaration: the command line builds its parser from
:func:`declared`, and :meth:`ServeConfig.from_options` the configuration from what it parsed.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, fields
from typing import Any

_OPTION = "ckpt.option"
_NESTED = "ckpt.nested_options"


@dataclass(frozen=True, slots=True, kw_only=True)
class Option:
    """How a configuration field is set from text."""

    help: str
    #: Reads the option's text (int, float, str, Path).
    parse: Callable[[str], Any] = str
    #: The texts it may be (shown in the usage); ``convert`` makes the field's value of the one given.
    choices: tuple[str, ...] = ()
    convert: Callable[[Any], Any] | None = None
    metavar: str | None = None
    #: What the help calls the default. None: the field's default (sizes in binary units), or nothing if that is None.
    shown: str | None = None
    #: Given again for each value (the variable: comma-separated); the field holds a tuple of the texts.
    repeated: bool = False
    #: The default where the field has none (a required field).
    default: Any = None


def option(help: str, **how: Any) -> dict[str, Any]:
    """A field's metadata that makes it an option of ``ckpt serve``."""
    return {_OPTION: Option(help=help, **how)}


def options_of(cls: type) -> dict[str, Any]:
    """A field's metadata saying that its value, a ``cls``, has options of its own (ServeConfig.store)."""
    return {_NESTED: cls}


def size_text(nbytes: int) -> str:
    """A size as people read it: in the largest binary unit it is a whole number of."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if nbytes >= 1 << shift and nbytes % (1 << shift) == 0:
            return f"{nbytes >> shift} {unit}"
    return f"{nbytes} bytes"


@dataclass(frozen=True, slots=True)
class Declared:
    """An option, as its field declares it."""

    #: The field's names from the top configuration down: ("store", "retention", "keep_last_versions").
    path: tuple[str, ...]
    option: Option
    default: Any

    @property
    def name(self) -> str:
        return self.path[-1]

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def env(self) -> str:
        return "CKPT_" + self.name.upper()

    @property
    def shown(self) -> str | None:
        """The default as the help says it (None: it says none)."""
        if self.option.shown is not None:
            return self.option.shown
        default = self.default
        if default is None:
            return None
        if isinstance(default, enum.Enum):
            return str(default.value)
        if isinstance(default, float):
            return f"{default:g}"
        if isinstance(default, int) and self.name.endswith("_bytes"):
            return size_text(default)
        return str(default)

    def value(self, parsed: Any) -> Any:
        """The field's value for what the option's text was read as."""
        if self.option.repeated:
            return tuple(text.strip() for text in parsed)
        return parsed if self.option.convert is None else self.option.convert(parsed)


def declared(cls: type, *, within: tuple[str, ...] = ()) -> list[Declared]:
    """The options of ``cls`` and of the configurations its fields hold, in field order."""
    out: list[Declared] = []
    for f in fields(cls):
        if _OPTION in f.metadata:
            how: Option = f.metadata[_OPTION]
            out.append(Declared((*within, f.name), how, how.default if f.default is MISSING else f.default))
        elif _NESTED in f.metadata:
            out.extend(declared(f.metadata[_NESTED], within=(*within, f.name)))
    names = [d.name for d in out]
    if len(set(names)) < len(names):  # one flat command line: a name may be an option once
        raise TypeError(
            f"{cls.__name__} declares an option name twice: {sorted(n for n in names if names.count(n) > 1)}"
        )
    return out


def option_values(cls: type, values: Mapping[str, Any]) -> dict[str, Any]:
    """Keyword arguments of ``cls`` for its own options (not those of the configurations it holds) in ``values``,
    by field name; an option absent or None is left to its field's default."""
    return {
        d.name: d.value(values[d.name]) for d in declared(cls) if len(d.path) == 1 and values.get(d.name) is not None
    }

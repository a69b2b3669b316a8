"""Name -> object registries that remember which plugin added each entry."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, Iterator, TypeVar

T = TypeVar("T")


class RegistryError(LookupError):
    """Unknown name or a name claimed by two plugins."""


class NameClash(RegistryError):
    """Two plugins registered the same name: a usage error (pytest exit 4, ``clharness list`` exit 2)."""


@dataclass(frozen=True)
class Lazy:
    """An entry's object named by where it lives (``module``, ``attr``), imported on first use: a name
    check (a suite's typo) needs only the name, not the heavy module behind it."""
    module: str
    attr: str

    def load(self):
        import importlib
        return getattr(importlib.import_module(self.module), self.attr)


@dataclass(frozen=True)
class Entry(Generic[T]):
    name: str
    obj: T
    source: str


class Registry(Generic[T]):
    """A flat namespace for one kind of thing (methods, datasets, suites, backbones)."""

    def __init__(self, kind: str):
        self.kind = kind
        self.source = "<unknown>"    # set by the plugin manager while a plugin's hook runs
        self._entries: dict[str, Entry[T]] = {}

    def add(self, name_or_obj: Any, obj: T | None = None) -> T:
        """``add(obj)`` keys by ``obj.name``; ``add(name, obj)`` by the given name."""
        if obj is None:
            obj = name_or_obj
            name = getattr(obj, "name", None)
            if not name:
                raise RegistryError(f"cannot register {obj!r} as a {self.kind}: it has no name; "
                                    f"set a class attribute `name` or call add('name', obj)")
        else:
            name = name_or_obj
        if not isinstance(name, str) or not name or any(c in name for c in "[]:, /"):
            raise RegistryError(f"{self.kind} name {name!r} from {self.source} must be a non-empty string "
                                "without spaces, brackets, commas, colons or slashes (it appears in test ids)")
        old = self._entries.get(name)
        if old is not None and old.obj is not obj:
            raise NameClash(f"{self.kind} {name!r} is registered twice: by {old.source} and by {self.source}. "
                            f"Fix: rename one of them (its registry name), or uninstall one (pip uninstall its "
                            "package, or drop its -p/--clh-plugin module or conftest.py hook)")
        self._entries[name] = Entry(name, obj, self.source)
        return obj

    def __getitem__(self, name: str) -> T:
        return self.entry(name).obj

    def entry(self, name: str) -> Entry[T]:
        try:
            entry = self._entries[name]
        except KeyError:
            raise RegistryError(f"unknown {self.kind} {name!r}; known: {', '.join(sorted(self._entries)) or 'none'}"
                                ) from None
        if isinstance(entry.obj, Lazy):   # imported now, kept for the next lookup
            entry = self._entries[name] = Entry(name, entry.obj.load(), entry.source)
        return entry

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._entries))

    def __len__(self) -> int:
        return len(self._entries)

    def entries(self) -> list[Entry[T]]:
        return [self.entry(n) for n in self]

"""Settings per section (gateway.core.sections): each section takes declared settings
only, with their types and defaults, and copies their values out of a Settings."""

from __future__ import annotations

import dataclasses
import importlib
import re
import typing
from pathlib import Path

import pytest

from gateway.core.config import OPTIONS, Settings, load_settings
from gateway.core.sections import ConnectionLimits, Section

ROOT = Path(__file__).resolve().parent.parent
_CLASS = re.compile(r"^class (\w+)\(Section\)", re.MULTILINE)


def _declared() -> dict[str, type[Section]]:
    """Every section class written in gateway/ (found in the source, then imported)."""
    found: dict[str, type[Section]] = {}
    for path in sorted((ROOT / "gateway").rglob("*.py")):
        names = _CLASS.findall(path.read_text())
        if not names:
            continue
        module = importlib.import_module(
            ".".join(path.relative_to(ROOT).with_suffix("").parts))
        for name in names:
            found[f"{module.__name__}.{name}"] = getattr(module, name)
    return found


SECTIONS = _declared()



def _setting_keys(section: type[Section]) -> dict[str, str]:
    """The setting each field of ``section`` takes: field name -> key (derived fields
    left out)."""
    return {f.name: f.metadata["key"] for f in dataclasses.fields(section) if "key" in f.metadata}


def test_the_sections_are_found() -> None:
    names = {cls.__name__ for cls in SECTIONS.values()}
    assert {"ConnectionLimits", "FiggSettings"} <= names


@pytest.mark.parametrize("cls", SECTIONS.values(), ids=list(SECTIONS))
def test_each_field_has_the_type_and_default_of_its_setting(cls: type[Section]) -> None:
    by_key = {option.key: option for option in OPTIONS}
    declared = typing.get_type_hints(Settings)
    own = typing.get_type_hints(cls)
    assert _setting_keys(cls), f"{cls.__name__} takes no setting"
    for name, key in _setting_keys(cls).items():
        option = by_key[key]
        assert own[name] == declared[option.attr], (
            f"{cls.__name__}.{name} is {own[name]}, setting {key} is {declared[option.attr]}")
    section = cls()
    for name, key in _setting_keys(cls).items():
        assert getattr(section, name) == by_key[key].default, f"{cls.__name__}.{name}"


@pytest.mark.parametrize("cls", SECTIONS.values(), ids=list(SECTIONS))
def test_of_copies_the_values_of_the_settings(cls: type[Section]) -> None:
    made, default = cls.of(load_settings()), cls()
    assert all(getattr(made, name) == getattr(default, name) for name in _setting_keys(cls))
    for name, key in _setting_keys(cls).items():
        changed = _another_value(key)
        if changed is None:
            continue
        attr, value = changed
        section = cls.of(Settings().with_overrides(**{attr: value}))
        assert getattr(section, name) == getattr(Settings().with_overrides(**{attr: value}),
                                                 attr), f"{cls.__name__}.{name}"
        assert getattr(section, name) != getattr(cls(), name)


def _another_value(key: str) -> tuple[str, object] | None:
    """A value of setting ``key`` other than its default (None: not easily made)."""
    option = next(o for o in OPTIONS if o.key == key)
    default = option.default
    if isinstance(default, bool):
        return option.attr, not default
    if isinstance(default, (int, float)):
        return option.attr, default + 1
    choices = getattr(option.parse, "choices", None)
    if choices:
        return option.attr, next(c for c in choices if c != default)
    return None


def test_a_section_is_frozen() -> None:
    limits = ConnectionLimits()
    with pytest.raises(dataclasses.FrozenInstanceError):
        limits.max_connections = 1  # type: ignore[misc]


def test_a_section_names_declared_settings_only() -> None:
    from gateway.core.sections import setting

    with pytest.raises(KeyError):
        setting("figg.no_such_setting")

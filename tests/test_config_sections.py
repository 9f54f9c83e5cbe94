"""Settings per section (gateway.core.sections): each section takes declared settings
only, with their types and defaults, and copies their values out of a Settings."""

from __future__ import annotations

import dataclasses
import importlib
import re
import typing
from pathlib import Path

import pytest

from gateway.backend.embedded import EmbeddedSettings, store_settings
from gateway.core.config import OPTIONS, ListenerTable, Settings, load_settings
from gateway.core.sections import ConnectionLimits, Section
from gateway.kafka.settings import KafkaSettings

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


def test_a_listener_section_holds_its_own_tables_values_not_every_listeners() -> None:
    # No section takes the [listeners.NAME] tables whole: a Kafka listener's section
    # holds the SASL mechanisms of its own table.
    assert not [cls for cls in SECTIONS.values()
                if "listeners" in _setting_keys(cls).values()]
    settings = Settings(listeners={
        "kafka": ListenerTable(sasl_mechanisms=("SCRAM-SHA-256",)),
        "secure": ListenerTable(protocol="kafka", address="127.0.0.1:0",
                                sasl_mechanisms=("SCRAM-SHA-512", "PLAIN"),
                                sasl_plain_without_tls=True)})
    assert KafkaSettings.of(settings).sasl_mechanisms == ("SCRAM-SHA-256",)
    assert KafkaSettings.of(settings, "kafka").sasl_mechanisms == ("SCRAM-SHA-256",)
    assert KafkaSettings.of(settings, "secure").sasl_mechanisms == ("SCRAM-SHA-512", "PLAIN")
    assert KafkaSettings.of(settings, "plain").sasl_mechanisms == ()
    assert KafkaSettings().sasl_mechanisms == ()


def test_the_embedded_section_is_made_without_the_listeners(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The listeners' connection slots are the wiring's to give (open_embedded_backend's
    # connection_slots), not worked out of the whole Settings by the section.
    settings = Settings(max_connections=100)
    assert settings.connection_slots() > 100

    def listeners(self: Settings) -> None:
        raise AssertionError("the store's section looked at the listeners")

    monkeypatch.setattr(Settings, "listener_specs", listeners)
    section = EmbeddedSettings.of(settings)
    assert not [f for f in dataclasses.fields(section) if "key" not in f.metadata]
    assert store_settings(section).descriptor_allowance == section.max_open_segments
    assert store_settings(section, connection_slots=300).descriptor_allowance == \
        section.max_open_segments + 300

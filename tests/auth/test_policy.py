"""The access policy file: parsing, validation errors, and how rules decide."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from gateway.auth.access import load_access
from gateway.auth.policy import (
    ALLOW_ALL,
    Operation,
    Policy,
    PolicyError,
    normalise_identity,
    parse_policy,
)
from gateway.auth.principal import Principal

PUBLISH, SUBSCRIBE, CREATE = Operation.PUBLISH, Operation.SUBSCRIBE, Operation.CREATE
CONFIGURE, ADMIN = Operation.CONFIGURE, Operation.ADMIN

ALICE = Principal("figg", "CN=alice,O=acme")
ANALYTICS = Principal("analytics")
TANK = Principal("tank")

EXAMPLE = """
default = "deny"
[[rule]]
who = ["CN=alice,O=acme", "listener:figg"]
topics = ["orders-*", "audit"]
allow = ["publish", "subscribe", "create"]
[[rule]]
who = ["listener:analytics"]
topics = ["*"]
allow = ["consume"]
deny = ["produce", "create", "configure"]
[[quota]]
who = ["*"]
bytes_in_per_sec = 1024
"""


def policy(text: str) -> Policy:
    return parse_policy(tomllib.loads(text), "p.toml")


def test_the_example_decides_per_identity_listener_topic_and_operation() -> None:
    p = policy(EXAMPLE)
    assert p.allows(ALICE, "orders-eu", PUBLISH)
    assert p.allows(ALICE, "orders-", PUBLISH)
    assert p.allows(ALICE, "audit", SUBSCRIBE)
    assert not p.allows(ALICE, "audit2", SUBSCRIBE)      # a name is exact
    assert not p.allows(ALICE, "payments", SUBSCRIBE)   # default deny
    assert not p.allows(ALICE, "orders-eu", CONFIGURE)
    # another identity on the figg listener: the listener entry matches it too
    assert p.allows(Principal("figg", "CN=bob"), "orders-1", PUBLISH)
    assert not p.allows(Principal("tank", "CN=bob"), "orders-1", PUBLISH)
    assert p.allows(ANALYTICS, "payments", SUBSCRIBE)
    assert not p.allows(ANALYTICS, "payments", PUBLISH)
    assert not p.allows(ANALYTICS, "payments", ADMIN)


def test_first_rule_naming_the_operation_decides_then_the_default() -> None:
    p = policy("""
        [[rule]]
        who = "*"
        topics = ["secret-*"]
        deny = ["subscribe"]
        [[rule]]
        who = "*"
        topics = "*"
        allow = ["subscribe"]
        deny = ["configure"]
    """)
    assert not p.allows(TANK, "secret-1", SUBSCRIBE)    # the first rule wins
    assert p.allows(TANK, "public", SUBSCRIBE)
    # the first rule does not name publish: the second does not either: default allow
    assert p.allows(TANK, "secret-1", PUBLISH)
    assert not p.allows(TANK, "secret-1", CONFIGURE)


def test_admin_is_decided_only_by_rules_over_every_topic() -> None:
    p = policy("""
        default = "deny"
        [[rule]]
        who = "*"
        topics = ["a*"]
        allow = ["admin"]
        [[rule]]
        who = ["listener:ops"]
        topics = ["*"]
        allow = ["admin"]
    """)
    assert not p.allows(TANK, None, ADMIN)
    assert p.allows(Principal("ops"), None, ADMIN)


def test_identities_are_compared_whole_after_normalisation() -> None:
    assert normalise_identity("cn=alice, o=acme") == "CN=alice,O=acme"
    assert normalise_identity("CN = a\\, b ,O=x+OU=y") == "CN=a\\, b,O=x+OU=y"
    p = policy('[[rule]]\nwho = ["cn=alice, O=acme"]\ntopics = "*"\ndeny = ["publish"]\n')
    assert not p.allows(ALICE, "t", PUBLISH)
    assert not p.allows(Principal("x", "CN=alice ,  O=acme"), "t", PUBLISH)
    assert p.allows(Principal("x", "CN=alice"), "t", PUBLISH)   # a part is not the whole
    assert p.allows(Principal("x", "CN=Alice,O=acme"), "t", PUBLISH)  # values keep case


def test_no_rules_allows_everything_and_deny_by_default_nothing() -> None:
    assert policy("").allows(TANK, "t", CREATE)
    assert ALLOW_ALL.allows(TANK, None, ADMIN)
    deny = policy('default = "deny"')
    assert not any(deny.allows(TANK, "t", op) for op in Operation)
    assert not deny.allows_any(TANK, "t")


@pytest.mark.parametrize(("text", "message"), [
    ('default = "maybe"', 'p.toml: default: expected "allow" or "deny", got \'maybe\''),
    ("defaults = 1", "p.toml: defaults: unknown key"),
    ('[[rule]]\ntopics = ["a"]\nallow = ["publish"]', "p.toml: rule[0]: who: missing"),
    ('[[rule]]\nwho = "*"\nallow = ["publish"]', "p.toml: rule[0]: topics: missing"),
    ('[[rule]]\nwho = "*"\ntopics = "*"', "p.toml: rule[0]: allow: missing"),
    ('[[rule]]\nwho = "*"\ntopics = "*"\nallow = ["publish"]\n'
     '[[rule]]\nwho = "*"\ntopics = "*"\nallow = ["write"]',
     "p.toml: rule[1]: allow: unknown operation 'write'"),
    ('[[rule]]\nwho = []\ntopics = "*"\nallow = ["publish"]',
     "p.toml: rule[0]: who: expected a non-empty list of strings"),
    ('[[rule]]\nwho = "*"\ntopics = ["a*b"]\nallow = ["publish"]',
     "p.toml: rule[0]: topics: 'a*b': '*' may only end a prefix"),
    ('[[rule]]\nwho = "*"\ntopics = "*"\nallow = ["publish"]\ndeny = ["produce"]',
     "p.toml: rule[0]: deny: publish also in allow"),
    ('[[rule]]\nwho = "*"\ntopics = "*"\nallow = ["publish"]\ntopic = "x"',
     "p.toml: rule[0]: topic: unknown key"),
    ('[[rule]]\nwho = ["listener:"]\ntopics = "*"\nallow = ["publish"]',
     "p.toml: rule[0]: who: 'listener:' names no listener"),
])
def test_mistakes_are_one_line_naming_the_file_rule_and_key(text: str, message: str) -> None:
    with pytest.raises(PolicyError) as caught:
        policy(text)
    assert str(caught.value).startswith(message)
    assert "\n" not in str(caught.value)


def test_load_access_reads_the_file_and_accepts_quota_entries(tmp_path: Path) -> None:
    path = tmp_path / "access.toml"
    path.write_text(EXAMPLE)
    access = load_access(path)
    assert not access.policy.default_allow
    assert len(access.policy.rules) == 2


def test_load_access_names_the_file_when_it_is_missing_or_not_toml(tmp_path: Path) -> None:
    with pytest.raises(PolicyError, match=r"^.*nope\.toml: No such file"):
        load_access(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[[rule]\n")
    with pytest.raises(PolicyError, match=r"bad\.toml: "):
        load_access(bad)

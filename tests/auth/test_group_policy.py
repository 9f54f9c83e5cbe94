"""Kafka consumer groups in the access policy: ``groups`` in a rule, ``subscribe`` and
``discover`` on a group, what a file without group rules means (every group open), and
the mistakes refused."""

from __future__ import annotations

import tomllib

import pytest

from gateway.auth.policy import Operation, Policy, PolicyError, parse_policy
from gateway.auth.principal import Principal

SUBSCRIBE, DISCOVER, PUBLISH = Operation.SUBSCRIBE, Operation.DISCOVER, Operation.PUBLISH
BILLING = Principal("kafka", user="billing")
OPS = Principal("ops")
OTHER = Principal("kafka", user="mallory")

GROUPS = """
default = "deny"
[[rule]]
who = ["user:billing"]
topics = ["invoices"]
groups = ["billing-*"]
allow = ["subscribe"]
[[rule]]
who = ["listener:ops"]
groups = ["*"]
allow = ["discover"]
[[rule]]
who = ["*"]
groups = ["billing-audit"]
deny = ["subscribe", "discover"]
"""


def policy(text: str) -> Policy:
    return parse_policy(tomllib.loads(text), "p.toml")


def test_group_rules_decide_subscribe_and_discover() -> None:
    p = policy(GROUPS)
    assert p.names_groups
    assert p.allows_group(BILLING, "billing-eu", SUBSCRIBE)
    assert p.allows_group(BILLING, "billing-eu", DISCOVER)  # subscribe implies discover
    assert not p.allows_group(BILLING, "payroll", SUBSCRIBE)  # the default
    assert p.allows_group(OPS, "payroll", DISCOVER)
    assert not p.allows_group(OPS, "payroll", SUBSCRIBE)
    assert not p.allows_group(OTHER, "billing-eu", DISCOVER)
    # The first rule naming the operation decides: billing's own rule comes first.
    assert p.allows_group(BILLING, "billing-audit", SUBSCRIBE)
    assert not p.allows_group(OPS, "billing-audit", SUBSCRIBE)
    # subscribe implies discover, but a rule deciding discover itself wins (its deny).
    assert not p.allows_group(BILLING, "billing-audit", DISCOVER)


def test_topic_patterns_and_group_patterns_do_not_mix() -> None:
    p = policy(GROUPS)
    # The rule's topics decide topics, its groups groups.
    assert p.allows(BILLING, "invoices", SUBSCRIBE)
    assert not p.allows(BILLING, "billing-eu", SUBSCRIBE)  # a topic named like the group
    assert not p.allows_group(BILLING, "invoices", SUBSCRIBE)  # a group named like the topic
    # A rule with only groups decides no topic: ops' discover does not make topics visible.
    assert not p.allows_any(OPS, "invoices")


def test_a_policy_without_group_rules_leaves_every_group_open() -> None:
    # What every policy file written before groups were in the policy means, whatever
    # its default: consumers keep working after an upgrade.
    old = policy('default = "deny"\n[[rule]]\nwho = "*"\ntopics = "t"\nallow = ["subscribe"]')
    assert not old.names_groups
    for op in (SUBSCRIBE, DISCOVER):
        assert old.allows_group(OTHER, "any-group", op)
    assert not old.allows(OTHER, "u", SUBSCRIBE)  # topics are still decided as before
    # One rule naming groups puts every group under the rules and the default.
    new = policy('default = "deny"\n[[rule]]\nwho = "*"\ngroups = "g"\nallow = ["subscribe"]')
    assert new.allows_group(OTHER, "g", SUBSCRIBE)
    assert not new.allows_group(OTHER, "h", DISCOVER)
    assert policy('[[rule]]\nwho = "*"\ngroups = "g"\ndeny = ["subscribe"]').allows_group(
        OTHER, "h", SUBSCRIBE)  # default allow


@pytest.mark.parametrize(("text", "message"), [
    ('[[rule]]\nwho = "*"\nallow = ["subscribe"]',
     "p.toml: rule[0]: topics: missing (a rule needs topics or groups)"),
    ('[[rule]]\nwho = "*"\ngroups = "g"\nallow = ["publish", "subscribe"]',
     "p.toml: rule[0]: allow: publish does not apply to groups"),
    ('[[rule]]\nwho = "*"\ngroups = "g"\ndeny = ["create"]',
     "p.toml: rule[0]: deny: create does not apply to groups"),
    ('[[rule]]\nwho = "*"\ntopics = "t"\nallow = ["discover"]',
     "p.toml: rule[0]: allow: discover applies to groups only"),
    ('[[rule]]\nwho = "*"\ngroups = ["a*b"]\nallow = ["subscribe"]',
     "p.toml: rule[0]: groups: 'a*b': '*' may only end a prefix"),
    ('[[rule]]\nwho = "*"\ngroups = []\nallow = ["subscribe"]',
     "p.toml: rule[0]: groups: expected a non-empty list of strings"),
    ('[[rule]]\nwho = "*"\ngroup = "g"\ntopics = "t"\nallow = ["subscribe"]',
     "p.toml: rule[0]: group: unknown key (expected who, topics, groups, allow, deny)"),
])
def test_group_mistakes_are_one_line(text: str, message: str) -> None:
    with pytest.raises(PolicyError) as caught:
        policy(text)
    assert str(caught.value).startswith(message), str(caught.value)


def test_a_rule_with_topics_and_groups_takes_both_kinds_of_operation() -> None:
    p = policy('default = "deny"\n[[rule]]\nwho = "*"\ntopics = "t"\ngroups = "g"\n'
               'allow = ["publish", "subscribe", "discover"]')
    assert p.allows(OTHER, "t", PUBLISH) and p.allows(OTHER, "t", SUBSCRIBE)
    assert p.allows_group(OTHER, "g", SUBSCRIBE) and p.allows_group(OTHER, "g", DISCOVER)
    assert not p.allows_group(OTHER, "t", SUBSCRIBE) and not p.allows(OTHER, "g", PUBLISH)

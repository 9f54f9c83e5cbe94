"""The access policy: which principal may do which operation on which topic or group.

A policy is a default (``allow`` or ``deny``) and an ordered list of rules, each naming
who (certificate identities, ``listener:NAME``, or ``*``), which topics (names, prefixes
ending in ``*``, or ``*``) and which operations it allows or denies. The decision for
(principal, topic, operation) is made by the **first rule that matches the principal and
the topic and names the operation** (in its ``allow`` or its ``deny`` list; one rule may
not name an operation in both); when no rule does, the default decides.

- An identity entry matches the certificate subject of a mutual-TLS connection, compared
  after normalisation (attribute types in upper case, no spaces around ``,``, ``+`` and
  ``=``): ``"cn=alice, O=acme"`` is ``"CN=alice,O=acme"``. A part of the subject alone
  (``"CN=alice"``) does not match: subjects are compared whole.
- ``user:NAME`` matches a Kafka connection authenticated (SASL) as user NAME (compared
  exactly, case included).
- ``listener:NAME`` matches every connection that arrived through listener NAME, with or
  without a certificate.
- ``admin`` (Tank Status) names no topic: only rules whose topics include ``"*"`` decide it.

Kafka consumer groups: a rule may name ``groups`` (patterns as for topics) as well as, or
instead of, ``topics``. On a group, ``subscribe`` is joining it (JoinGroup, SyncGroup,
Heartbeat, LeaveGroup) and committing or deleting its offsets, and ``discover`` is
describing it, listing it, finding its coordinator and reading its committed offsets
(as Kafka's Group READ and DESCRIBE; ``subscribe`` implies ``discover``, as READ implies
DESCRIBE). Group checks use only rules with ``groups``, topic checks only rules with
``topics``. **A policy where no rule names groups leaves every group open** (what it
meant before groups were in the policy, so an existing file keeps working, whatever its
default); once one rule names groups, the groups are decided like topics, by the first
matching rule and then the default.

This module does no I/O: it takes the decoded TOML; :mod:`gateway.auth.access` reads the
file.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from gateway.auth.principal import Principal


class Operation(enum.Enum):
    """What a request does to a topic."""

    PUBLISH = "publish"      # Figg PUBLISH, Tank Produce
    SUBSCRIBE = "subscribe"  # Figg ATTACH, Tank Consume
    CREATE = "create"        # Tank CreateTopic; auto-creation by publish, produce, attach
    CONFIGURE = "configure"  # Tank ReloadConf
    ADMIN = "admin"          # Tank Status (names no topic)
    DISCOVER = "discover"    # a Kafka group: describe, list, find its coordinator


#: Names an operation is written as in a policy file.
OPERATION_NAMES: Final = {
    "publish": Operation.PUBLISH, "produce": Operation.PUBLISH,
    "subscribe": Operation.SUBSCRIBE, "consume": Operation.SUBSCRIBE,
    "create": Operation.CREATE, "configure": Operation.CONFIGURE, "admin": Operation.ADMIN,
    "discover": Operation.DISCOVER,
}
#: The operations that apply to groups; the others apply to topics only.
GROUP_OPERATIONS: Final = frozenset({Operation.SUBSCRIBE, Operation.DISCOVER})


class PolicyError(ValueError):
    """The policy file is not valid; the message is one line naming where."""


def normalise_identity(subject: str) -> str:
    """``subject`` (an RFC 4514 distinguished name) in the form policies compare: attribute
    types upper-cased, spaces around the separators ``,`` ``+`` ``=`` dropped (escaped
    characters, ``\\,`` say, are kept as they are)."""
    out: list[str] = []
    part: list[str] = []
    in_value = False
    i = 0

    def flush() -> None:
        text = "".join(part).strip()
        out.append(text if in_value else text.upper())
        part.clear()

    while i < len(subject):
        c = subject[i]
        if c == "\\" and i + 1 < len(subject):
            part.append(subject[i:i + 2])
            i += 2
            continue
        if c == "=" and not in_value:
            flush()
            out.append("=")
            in_value = True
        elif c in ",+" and in_value:
            flush()
            out.append(c)
            in_value = False
        else:
            part.append(c)
        i += 1
    flush()
    return "".join(out)


@dataclass(frozen=True, slots=True)
class TopicPattern:
    """The topics of a rule: exact names, prefixes, or every topic."""

    names: frozenset[str]
    prefixes: tuple[str, ...]
    every: bool

    def matches(self, topic: str | None) -> bool:
        """Whether ``topic`` is one of these (None, no topic: only ``"*"`` matches)."""
        if self.every:
            return True
        if topic is None:
            return False
        return topic in self.names or topic.startswith(self.prefixes)


@dataclass(frozen=True, slots=True)
class Rule:
    """One ``[[rule]]`` of the file."""

    who: frozenset[str]
    anyone: bool
    topics: TopicPattern | None
    allow: frozenset[Operation]
    deny: frozenset[Operation]
    groups: TopicPattern | None = None

    def applies_to(self, principal: Principal) -> bool:
        if self.anyone:
            return True
        who = self.who
        if f"listener:{principal.listener}" in who:
            return True
        if principal.user is not None and f"user:{principal.user}" in who:
            return True
        return principal.identity is not None and normalise_identity(principal.identity) in who


@dataclass(frozen=True, slots=True)
class Policy:
    """A default and ordered rules; see the module doc for how they decide."""

    default_allow: bool
    rules: tuple[Rule, ...]

    @property
    def names_groups(self) -> bool:
        """Whether some rule names groups (else every group is open)."""
        return any(rule.groups is not None for rule in self.rules)

    def allows(self, principal: Principal, topic: str | None, operation: Operation) -> bool:
        """Whether ``principal`` may do ``operation`` on ``topic`` (None: no topic)."""
        for rule in self.rules:
            if operation not in rule.allow and operation not in rule.deny:
                continue
            if (rule.topics is not None and rule.topics.matches(topic)
                    and rule.applies_to(principal)):
                return operation in rule.allow
        return self.default_allow

    def allows_group(self, principal: Principal, group: str, operation: Operation) -> bool:
        """Whether ``principal`` may do ``operation`` (``subscribe`` or ``discover``) on the
        Kafka group ``group``. ``subscribe`` implies ``discover`` unless a rule decides
        ``discover`` itself (a deny of it wins, as Kafka's DENY DESCRIBE beside ALLOW
        READ)."""
        if not self.names_groups:
            return True
        decided = self._decide_group(principal, group, operation)
        if decided is None and operation is Operation.DISCOVER:
            decided = self._decide_group(principal, group, Operation.SUBSCRIBE)
        return self.default_allow if decided is None else decided

    def _decide_group(self, principal: Principal, group: str,
                      operation: Operation) -> bool | None:
        """What the first rule naming ``operation`` for ``group`` and ``principal`` says,
        or None when no rule does."""
        for rule in self.rules:
            if operation not in rule.allow and operation not in rule.deny:
                continue
            if (rule.groups is not None and rule.groups.matches(group)
                    and rule.applies_to(principal)):
                return operation in rule.allow
        return None

    def grants_topics(self, principal: Principal) -> bool:
        """Whether ``principal`` may be allowed something on some topic: the default
        allows, or a rule with topics that applies to it allows an operation. False:
        every topic request of it is refused."""
        return self.default_allow or any(
            rule.allow and rule.topics is not None and rule.applies_to(principal)
            for rule in self.rules)

    def allows_any(self, principal: Principal, topic: str) -> bool:
        """Whether ``principal`` may do anything with ``topic`` (and so may see it)."""
        return any(self.allows(principal, topic, op) for op in Operation
                   if op not in (Operation.ADMIN, Operation.DISCOVER))


#: The policy in force without a policy file: everything allowed (as before policies).
ALLOW_ALL: Final = Policy(True, ())

_RULE_KEYS: Final = frozenset({"who", "topics", "groups", "allow", "deny"})
_TOP_KEYS: Final = frozenset({"default", "rule", "quota", "user", "token"})


def parse_policy(document: Mapping[str, Any], source: str = "policy") -> Policy:
    """The policy a decoded TOML document describes; :class:`PolicyError` (one line,
    naming ``source``, the rule's index and the key) when it is not valid. The
    document's ``[[quota]]`` entries are not looked at here."""
    for key in document:
        if key not in _TOP_KEYS:
            raise PolicyError(f"{source}: {key}: unknown key (expected default, [[rule]], "
                              "[[quota]], [[user]], [[token]])")
    default = document.get("default", "allow")
    if default not in ("allow", "deny"):
        raise PolicyError(f"{source}: default: expected \"allow\" or \"deny\", got "
                          f"{default!r}")
    entries = document.get("rule", [])
    if not isinstance(entries, list):
        raise PolicyError(f"{source}: rule: expected [[rule]] tables")
    rules = tuple(_rule(entry, f"{source}: rule[{i}]") for i, entry in enumerate(entries))
    return Policy(default == "allow", rules)


def _rule(entry: object, where: str) -> Rule:
    if not isinstance(entry, Mapping):
        raise PolicyError(f"{where}: expected a table")
    for key in entry:
        if key not in _RULE_KEYS:
            raise PolicyError(f"{where}: {key}: unknown key (expected who, topics, groups, "
                              "allow, deny)")
    if "who" not in entry:
        raise PolicyError(f"{where}: who: missing")
    if "topics" not in entry and "groups" not in entry:
        raise PolicyError(f"{where}: topics: missing (a rule needs topics or groups)")
    if "allow" not in entry and "deny" not in entry:
        raise PolicyError(f"{where}: allow: missing (a rule needs allow or deny)")
    who = _strings(entry["who"], f"{where}: who")
    for name in who:
        for prefix in ("listener:", "user:"):
            if name.startswith(prefix) and not name[len(prefix):]:
                raise PolicyError(f"{where}: who: {name!r} names no {prefix[:-1]}")
    topics = _pattern(entry, "topics", where)
    groups = _pattern(entry, "groups", where)
    allow = _operations(entry.get("allow", []), f"{where}: allow")
    deny = _operations(entry.get("deny", []), f"{where}: deny")
    both = allow & deny
    if both:
        names = ", ".join(sorted(op.value for op in both))
        raise PolicyError(f"{where}: deny: {names} also in allow")
    for key, ops in (("allow", allow), ("deny", deny)):
        if topics is None and ops - GROUP_OPERATIONS:
            names = ", ".join(sorted(op.value for op in ops - GROUP_OPERATIONS))
            raise PolicyError(f"{where}: {key}: {names} does not apply to groups (the "
                              "rule names no topics; groups take subscribe and discover)")
        if groups is None and Operation.DISCOVER in ops:
            raise PolicyError(f"{where}: {key}: discover applies to groups only (the rule "
                              "names no groups; a topic is visible to whoever may use it)")
    return Rule(
        who=frozenset(w if w.startswith(("listener:", "user:")) else normalise_identity(w)
                      for w in who if w != "*"),
        anyone="*" in who, topics=topics, allow=allow, deny=deny, groups=groups)


def _pattern(entry: Mapping[str, Any], key: str, where: str) -> TopicPattern | None:
    """A rule's ``topics`` or ``groups`` (None when it has no such key)."""
    if key not in entry:
        return None
    names = _strings(entry[key], f"{where}: {key}")
    for name in names:
        if "*" in name[:-1]:
            raise PolicyError(f"{where}: {key}: {name!r}: '*' may only end a prefix")
    return TopicPattern(frozenset(n for n in names if not n.endswith("*")),
                        tuple(n[:-1] for n in names if n.endswith("*") and n != "*"),
                        "*" in names)


def _strings(value: object, where: str) -> list[str]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not value:
        raise PolicyError(f"{where}: expected a non-empty list of strings")
    for item in value:
        if not isinstance(item, str) or not item:
            raise PolicyError(f"{where}: expected non-empty strings, got {item!r}")
    return value


def _operations(value: object, where: str) -> frozenset[Operation]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, Sequence) or isinstance(value, str):
        raise PolicyError(f"{where}: expected a list of operations")
    ops = set()
    for item in value:
        op = OPERATION_NAMES.get(item) if isinstance(item, str) else None
        if op is None:
            raise PolicyError(f"{where}: unknown operation {item!r} (expected "
                              f"{', '.join(OPERATION_NAMES)})")
        ops.add(op)
    return frozenset(ops)

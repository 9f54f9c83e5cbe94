"""Reading the access file (``auth.policy_file``): the policy and the quotas it holds.

The file is TOML: ``default`` and ``[[rule]]`` entries make the
:class:`~gateway.auth.policy.Policy`; its ``[[quota]]`` entries make the
:class:`~gateway.auth.quotas.QuotaRules`; its ``[[user]]`` entries the SASL users
(:class:`~gateway.auth.users.Users`); its ``[[token]]`` entries the HTTP listener's static
bearer tokens (:class:`~gateway.auth.tokens.StaticTokens`). Any
mistake is one :class:`~gateway.auth.policy.PolicyError` line naming the file, and for a
rule its index and key.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

from gateway.auth.policy import Policy, PolicyError, parse_policy
from gateway.auth.quotas import QuotaRules, parse_quotas
from gateway.auth.tokens import NO_TOKENS, StaticTokens, parse_tokens
from gateway.auth.users import Users, parse_users


@dataclass(frozen=True, slots=True)
class Access:
    """What an access file says: the ``policy``, the ``quotas``, the SASL ``users`` and
    the HTTP bearer ``tokens``."""

    policy: Policy
    quotas: QuotaRules
    users: Users
    tokens: StaticTokens = NO_TOKENS


def load_access(path: Path) -> Access:
    """Read and validate the access file at ``path``; :class:`PolicyError` (one line, the
    file named) when it can not be read or is not valid."""
    try:
        with open(path, "rb") as f:
            document = tomllib.load(f)
    except OSError as exc:
        raise PolicyError(f"{path}: {exc.strerror or exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise PolicyError(f"{path}: {exc}") from None
    policy = parse_policy(document, str(path))
    try:
        quotas = parse_quotas(document.get("quota", []))
        users = parse_users(document.get("user", []))
        tokens = parse_tokens(document.get("token", []))
    except ValueError as exc:
        raise PolicyError(f"{path}: {exc}") from None
    return Access(policy, quotas, users, tokens)

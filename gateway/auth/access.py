"""Reading the access file (``auth.policy_file``): the policy and the quotas it holds.

The file is TOML: ``default`` and ``[[rule]]`` entries make the
:class:`~gateway.auth.policy.Policy`; its ``[[quota]]`` entries are handed to
``gateway.auth.quotas.parse_quotas`` when that module is present (else ignored). Any
mistake is one :class:`~gateway.auth.policy.PolicyError` line naming the file, and for a
rule its index and key.
"""

from __future__ import annotations

import importlib
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gateway.auth.policy import Policy, PolicyError, parse_policy


@dataclass(frozen=True, slots=True)
class Access:
    """What an access file says: the ``policy`` and the ``quotas`` (None when figtank
    has no quota support, i.e. ``gateway.auth.quotas`` is absent)."""

    policy: Policy
    quotas: Any | None


def _parse_quotas() -> Any | None:
    """``gateway.auth.quotas.parse_quotas``, or None when that module is absent."""
    try:
        module = importlib.import_module("gateway.auth.quotas")
    except ImportError:
        return None
    return getattr(module, "parse_quotas", None)


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
    parse_quotas = _parse_quotas()
    quotas = None
    if parse_quotas is not None:
        entries = document.get("quota", [])
        if not isinstance(entries, list):
            raise PolicyError(f"{path}: quota: expected [[quota]] tables")
        try:
            quotas = parse_quotas(entries)
        except ValueError as exc:
            raise PolicyError(f"{path}: {exc}") from None
    return Access(policy, quotas)

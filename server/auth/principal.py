"""The caller of an API request, as authentication established it."""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass
from typing import Final

from runtime.model import APPROVER_ROLE

APPROVER: Final = APPROVER_ROLE
"""May decide the approvals of runs in the principal's tenant."""
ADMIN: Final = "admin"
"""May cancel any run of the tenant, not only the principal's own."""
ROLES: Final = frozenset({APPROVER, ADMIN})
ANY_SCOPE: Final = "*"
"""A scope grant that lets the principal ask for any scope in a run's context."""


NAME_MAX: Final = 200
NAME_RULE: Final = (
    f"1 to {NAME_MAX} characters, none a control, format or line-break one, no space"
    " at either end and none but U+0020 inside"
)
"""What :func:`is_name` asks, for messages."""
_UNSEEN: Final = frozenset({"Cc", "Cf", "Zl", "Zp"})
"""Unicode categories a name may not hold: controls, invisible format characters
(U+200B, a right-to-left override) and line breaks, which make a name print as another."""


def is_name(value: object) -> bool:
    """A user or tenant id, a role, a scope or an issuer as a principal may carry: 1 to
    200 characters, none of them unseen (a tenant "t\\x01" would print as "t"), no
    space that makes it print as another ("alice " as "alice", a no-break space as a
    space: the four-eyes rule compares ids as given) and text every store keeps (JSON
    may carry half a surrogate pair, which none does)."""
    if not (isinstance(value, str) and 0 < len(value) <= NAME_MAX):
        return False
    if value != value.strip():
        return False
    if any(unicodedata.category(c) in _UNSEEN or (c.isspace() and c != " ") for c in value):
        return False
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return True


@dataclass(frozen=True)
class Principal:
    user_id: str
    tenant_id: str
    roles: frozenset[str]
    scopes: frozenset[str]
    via: str
    """How the caller proved it: ``key:<key_id>`` or ``jwt:<issuer>``; kept in the audit."""

    def has_role(self, role: str) -> bool:
        return role in self.roles

    def grants(self, scope: str) -> bool:
        return ANY_SCOPE in self.scopes or scope in self.scopes

    @property
    def default_scope(self) -> list[str]:
        """The run scope when a request names none: every scope granted by name."""
        return sorted(s for s in self.scopes if s != ANY_SCOPE)

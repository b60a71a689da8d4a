"""JWT bearer tokens (PyJWT): HS256 with a shared secret for local use, RS256 with a
public key or a JWKS file for production.

Claims: ``sub`` is the user, ``tenant_id`` (or ``tid``) the tenant, ``roles`` a list,
``scope`` a space-separated string (or ``scopes`` a list). ``exp`` is required.
"""

from __future__ import annotations

import json
from typing import Any

import jwt
from jwt.algorithms import RSAAlgorithm

from server.auth.principal import NAME_RULE, Principal, is_name
from server.settings import Settings, refused


class JwtError(Exception):
    """The token is not a valid JWT for this server; the message says why."""


CLOCK_SKEW_S = 30
"""How far the identity provider's clock may be off ours, either way, for ``exp``,
``nbf`` and ``iat``: with none, a provider a second ahead had its fresh tokens
refused as not yet valid (iat) now and then."""


class JwtVerifier:
    def __init__(self, settings: Settings) -> None:
        self.issuer = settings.jwt_issuer
        self.audience = settings.jwt_audience
        self._hs_secret = (
            settings.jwt_hs256_secret.get_secret_value() if settings.jwt_hs256_secret else None
        )
        if self._hs_secret is not None and len(self._hs_secret.encode()) < 32:
            raise ValueError("AGENT_RUNTIME_JWT_HS256_SECRET must be at least 32 bytes")
        rs256 = settings.jwt_public_key_file is not None or settings.jwt_jwks_file is not None
        if rs256 and not (settings.jwt_audience and settings.jwt_issuer):
            # A shared identity provider signs tokens for other applications too.
            raise ValueError(
                "RS256 JWTs need AGENT_RUNTIME_JWT_AUDIENCE and AGENT_RUNTIME_JWT_ISSUER, "
                "or tokens issued for other applications would be accepted"
            )
        # Keys are parsed now: one that cannot be would refuse every token, not the start.
        self._rs_key: Any = None
        if settings.jwt_public_key_file is not None:
            try:
                self._rs_key = RSAAlgorithm(RSAAlgorithm.SHA256).prepare_key(
                    settings.jwt_public_key_file.read_text()
                )
            except OSError as exc:  # not there, a directory, not readable
                why = f"cannot read {settings.jwt_public_key_file}: {exc.strerror or exc}"
                raise refused("jwt_public_key_file", why) from exc
            except (jwt.PyJWTError, ValueError) as exc:  # (not UTF-8 is a ValueError)
                raise refused("jwt_public_key_file", exc) from exc
        self._jwks: list[jwt.PyJWK] | None = None
        if settings.jwt_jwks_file is not None:
            try:
                jwks = jwt.PyJWKSet.from_dict(json.loads(settings.jwt_jwks_file.read_text()))
            except OSError as exc:
                why = f"cannot read {settings.jwt_jwks_file}: {exc.strerror or exc}"
                raise refused("jwt_jwks_file", why) from exc
            except (jwt.PyJWTError, ValueError) as exc:
                raise refused("jwt_jwks_file", exc) from exc
            # Only RS256 signing keys: an identity provider's set may also hold EC, OKP or
            # encryption keys, which a token naming their kid must not reach the RSA check
            # with (PyJWT raises a TypeError there, not a token error).
            self._jwks = [
                key
                for key in jwks.keys
                if key.key_type == "RSA"
                and key.algorithm_name == "RS256"
                and key.public_key_use in (None, "sig")
            ]
            if not self._jwks:
                raise ValueError("AGENT_RUNTIME_JWT_JWKS_FILE holds no RS256 signing key")

    @property
    def enabled(self) -> bool:
        return bool(self._hs_secret or self._rs_key or self._jwks)

    def _key_for(self, token: str) -> tuple[Any, str]:
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError as exc:
            raise JwtError(f"malformed token: {exc}") from exc
        alg = header.get("alg")
        if alg == "HS256" and self._hs_secret:
            return self._hs_secret, alg
        if alg == "RS256" and self._jwks:
            kid = header.get("kid")
            for key in self._jwks:
                if kid is None or key.key_id == kid:
                    return key.key, alg
            raise JwtError(f"no RS256 signing key {kid!r:.80} in the JWKS")  # kid: the token's
        if alg == "RS256" and self._rs_key is not None:
            return self._rs_key, alg
        # Never let the token pick an algorithm this server was not configured for.
        raise JwtError(f"algorithm {alg!r} is not accepted")

    def verify(self, token: str) -> Principal:
        key, alg = self._key_for(token)
        try:
            claims: dict[str, Any] = jwt.decode(
                token,
                key,
                algorithms=[alg],
                issuer=self.issuer,
                audience=self.audience,
                leeway=CLOCK_SKEW_S,
                options={"require": ["exp", "sub"], "verify_aud": self.audience is not None},
            )
        except (jwt.PyJWTError, TypeError, ValueError) as exc:
            # TypeError/ValueError: PyJWT's word for a key that cannot check this token.
            raise JwtError(str(exc)) from exc
        # A claim given is read as given: a false, zero or empty one is not taken for
        # one left out (a tenant_id of false read "tid"), though null is (an identity
        # provider's mapper writes it for "not set"); and a time is a number (PyJWT
        # reads "exp": "1700000000", text, as one).
        for name in ("exp", "nbf", "iat"):
            if name in claims and not _number(claims[name]):
                raise JwtError(f"{name} must be a number (RFC 7519)")
        tenant = claims.get("tenant_id")
        tenant = claims.get("tid") if tenant is None else tenant
        if not isinstance(tenant, str) or not is_name(tenant):
            raise JwtError("token has no usable tenant_id claim")
        if not is_name(claims["sub"]):
            raise JwtError("token has no usable sub claim")
        roles = claims.get("roles")
        roles = [] if roles is None else roles
        scope = claims.get("scope")
        if scope is not None and not isinstance(scope, str):
            raise JwtError("scope must be a space-separated string")
        scopes = claims.get("scopes")
        scopes = (scope or "").split() if scopes is None else scopes
        if not isinstance(roles, list) or not isinstance(scopes, list):
            raise JwtError("roles and scopes must be lists")
        if not all(is_name(name) for name in (*roles, *scopes)):
            raise JwtError("roles and scopes must be lists of names (1-200 characters each)")
        issuer = claims.get("iss")
        # Written into the audit trail and the events as ``via``: a name, like the rest
        # (an empty one is as good as none).
        if issuer not in (None, "") and not is_name(issuer):
            raise JwtError(f"iss must be a name of {NAME_RULE}")
        return Principal(
            user_id=str(claims["sub"]),
            tenant_id=tenant,
            roles=frozenset(roles),
            scopes=frozenset(scopes),
            # The local secret's holder can write any iss: its tokens are named by it.
            via=f"jwt:{issuer}" if alg == "RS256" and issuer else f"jwt:{alg}",
        )


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)

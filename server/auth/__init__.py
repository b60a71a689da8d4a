"""Who is calling: bearer API keys and JWTs, mapped to a :class:`Principal`."""

from server.auth.principal import Principal

__all__ = ["Principal"]

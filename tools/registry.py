"""The tool registry: ``name@version`` → ToolSpec; an unversioned name means the latest version."""

from __future__ import annotations

from collections.abc import Iterable

from runtime.tooling import ToolSpec


def _version_key(version: str) -> tuple[tuple[int, int, str], ...]:
    # Numeric parts compare as numbers ("10" > "9") and rank above text ones ("2" > "2.0-rc1").
    return tuple((1, int(p), "") if p.isdigit() else (0, 0, p) for p in version.split("."))


class DuplicateTool(ValueError):
    pass


class ToolRegistry:
    def __init__(self, specs: Iterable[ToolSpec] = ()) -> None:
        self._tools: dict[str, dict[str, ToolSpec]] = {}
        for spec in specs:
            self.register(spec)

    def register(self, spec: ToolSpec) -> ToolSpec:
        versions = self._tools.setdefault(spec.name, {})
        if spec.version in versions:
            raise DuplicateTool(f"{spec.ref} is registered already")
        versions[spec.version] = spec
        return spec

    def resolve(self, name: str, version: str | None = None) -> ToolSpec | None:
        if "@" in name and version is None:
            name, version = name.split("@", 1)
        versions = self._tools.get(name)
        if not versions:
            return None
        if version is None:
            return versions[max(versions, key=_version_key)]
        return versions.get(version)

    def specs(self) -> list[ToolSpec]:
        """The latest version of every tool, by name."""
        return [spec for name in sorted(self._tools) if (spec := self.resolve(name))]

    def all_versions(self) -> list[ToolSpec]:
        return [s for name in sorted(self._tools) for _, s in sorted(self._tools[name].items())]

"""The tool registry: name@version resolution, latest by numeric version, descriptions."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, Field

from runtime.tooling import ToolContext, ToolSpec
from tools.registry import DuplicateTool, ToolRegistry


class Args(BaseModel):
    sku: str = Field(min_length=1)


async def handler(args: Args, ctx: ToolContext) -> dict[str, str]:
    return {"sku": args.sku}


def spec(name: str, version: str, **kwargs: object) -> ToolSpec:
    return ToolSpec(name, version, f"{name} v{version}", Args, handler, **kwargs)  # type: ignore[arg-type]


@pytest.fixture
def registry() -> ToolRegistry:
    return ToolRegistry(
        [
            spec("lookup", "1"),
            spec("lookup", "9"),
            spec("lookup", "10"),
            spec("lookup", "2"),
            spec("refund", "1", risk="high", side_effect=True, idempotent=False),
        ]
    )


def test_name_and_version_resolve_exactly(registry: ToolRegistry) -> None:
    found = registry.resolve("lookup", "2")
    assert found is not None and found.ref == "lookup@2"


def test_unversioned_name_resolves_to_the_numerically_latest(registry: ToolRegistry) -> None:
    found = registry.resolve("lookup")
    assert found is not None and found.version == "10"


def test_dotted_versions_compare_numerically() -> None:
    reg = ToolRegistry([spec("t", "1.9"), spec("t", "1.10"), spec("t", "1.2.3")])
    assert reg.resolve("t").version == "1.10"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("name", "version"),
    [("nope", None), ("nope", "1"), ("lookup", "3"), ("lookup@3", None), ("refund@", None)],
)
def test_unknown_names_and_versions_resolve_to_none(
    registry: ToolRegistry, name: str, version: str | None
) -> None:
    assert registry.resolve(name, version) is None


def test_at_string_form(registry: ToolRegistry) -> None:
    assert registry.resolve("lookup@2") is registry.resolve("lookup", "2")
    assert registry.resolve("lookup@10").ref == "lookup@10"  # type: ignore[union-attr]


def test_duplicate_registration_raises_and_keeps_the_first(registry: ToolRegistry) -> None:
    first = registry.resolve("lookup", "2")
    with pytest.raises(DuplicateTool, match="lookup@2"):
        registry.register(spec("lookup", "2"))
    assert registry.resolve("lookup", "2") is first


def test_duplicate_in_constructor_raises() -> None:
    with pytest.raises(DuplicateTool):
        ToolRegistry([spec("a", "1"), spec("a", "1")])


def test_specs_lists_the_latest_of_each_tool_by_name(registry: ToolRegistry) -> None:
    assert [s.ref for s in registry.specs()] == ["lookup@10", "refund@1"]
    assert len(registry.all_versions()) == 5


def test_describe_has_schema_and_risk(registry: ToolRegistry) -> None:
    described = registry.resolve("refund").describe()  # type: ignore[union-attr]
    assert described["name"] == "refund" and described["version"] == "1"
    assert described["risk"] == "high"
    assert described["side_effect"] is True and described["idempotent"] is False
    assert described["reconcile"] is False and described["compensate"] is False
    assert described["schema"]["properties"]["sku"]["type"] == "string"
    assert described["schema"]["required"] == ["sku"]


def test_a_release_outranks_its_pre_release() -> None:
    # Mixed numeric and text parts must compare without a TypeError.
    reg = ToolRegistry([spec("t", "2.0"), spec("t", "2.0-rc1"), spec("t", "1.9")])
    assert reg.resolve("t").version == "2.0"  # type: ignore[union-attr]

"""How deep the data a planner or a tool hands the runtime may nest (runtime.storable)."""

from __future__ import annotations

from typing import Any

from runtime.storable import MAX_NESTING, nests_deeper


def nested(levels: int, leaf: Any = "leaf") -> Any:
    value = leaf
    for i in range(levels):
        value = {"a": value} if i % 3 == 0 else [value] if i % 3 == 1 else (value,)
    return value


def test_containers_are_counted_not_the_leaves_in_them() -> None:
    assert not nests_deeper(nested(MAX_NESTING))
    assert nests_deeper(nested(MAX_NESTING + 1))
    assert nests_deeper(nested(MAX_NESTING, leaf=[]))  # an empty list is a level too
    assert not nests_deeper("text") and not nests_deeper(None) and not nests_deeper({})
    assert nests_deeper([[]], 1) and not nests_deeper([[]], 2)


def test_a_value_past_pythons_stack_is_measured_without_recursion() -> None:
    assert nests_deeper(nested(100_000))


def test_a_container_shared_many_times_over_is_read_once_a_level() -> None:
    """A DAG of 2**80 paths: read path by path, the check would never end."""
    shared: list[Any] = []
    for _ in range(80):
        shared = [shared, shared]
    assert nests_deeper(shared)
    assert not nests_deeper(shared, 81)

"""The runner's side effects run in one task group: awaited by settle and close, a bug never lost."""

from __future__ import annotations

import asyncio

import pytest

from controller.shell.effects import Effects

# A coroutine left never awaited (reported as it is collected) fails the test.
pytestmark = [
    pytest.mark.filterwarnings("error::RuntimeWarning"),
    pytest.mark.filterwarnings("error::pytest.PytestUnraisableExceptionWarning"),
]


def test_settle_waits_for_the_effects_under_way_and_for_those_they_spawn() -> None:
    done: list[str] = []

    async def later(effects: Effects) -> None:
        await asyncio.sleep(0)
        done.append("second")

    async def first(effects: Effects) -> None:
        await asyncio.sleep(0)
        done.append("first")
        effects.spawn(later(effects))

    async def main() -> None:
        effects = Effects()
        await effects.settle()  # nothing spawned yet: returns at once
        effects.spawn(first(effects))
        await effects.settle()
        assert done == ["first", "second"]
        await effects.close()

    asyncio.run(main())


def test_an_unexpected_failure_is_raised_from_settle_and_close_and_nothing_runs_after_it() -> None:
    ran: list[str] = []

    async def broken() -> None:
        raise RuntimeError("a bug in a side effect")

    async def fine() -> None:
        ran.append("fine")

    async def main() -> None:
        effects = Effects()
        effects.spawn(broken())
        with pytest.raises(ExceptionGroup) as raised:
            await effects.settle()
        assert isinstance(raised.value.exceptions[0], RuntimeError)
        effects.spawn(fine())  # closed, not left pending: no "never awaited" coroutine
        with pytest.raises(ExceptionGroup):
            await effects.close()
        assert ran == []

    asyncio.run(main())


def test_close_lets_the_effects_under_way_finish() -> None:
    async def main() -> None:
        flag = asyncio.Event()

        async def slow() -> None:
            await asyncio.sleep(0.01)
            flag.set()

        effects = Effects()
        effects.spawn(slow())
        await effects.close()
        assert flag.is_set()

    asyncio.run(main())

"""The pass slots: bounded, jobs without a world first, first come first served within a class."""

from __future__ import annotations

import asyncio

import pytest

from elastra.controller.slots import PassSlots


async def _settle() -> None:
    """Let every runnable task run until it blocks."""
    for _ in range(20):
        await asyncio.sleep(0)


def test_urgent_waiters_go_first_and_each_class_keeps_its_order() -> None:
    async def main() -> list[str]:
        slots = PassSlots(1)
        order: list[str] = []
        hold = asyncio.Event()

        async def job(name: str, *, urgent: bool, wait: asyncio.Event | None = None) -> None:
            async with slots.slot(urgent=urgent):
                order.append(name)
                if wait is not None:
                    await wait.wait()

        first = asyncio.create_task(job("running", urgent=False, wait=hold))
        await _settle()
        queued = [("later-1", False), ("urgent-1", True), ("later-2", False), ("urgent-2", True)]
        tasks = []
        for name, urgent in queued:
            tasks.append(asyncio.create_task(job(name, urgent=urgent)))
            await _settle()
        assert slots.waiting == 4 and order == ["running"]
        hold.set()
        await asyncio.gather(first, *tasks)
        return order

    assert asyncio.run(main()) == ["running", "urgent-1", "urgent-2", "later-1", "later-2"]


def test_never_more_than_size_at_once() -> None:
    async def main() -> int:
        slots = PassSlots(3)
        inside = most = 0

        async def job(urgent: bool) -> None:
            nonlocal inside, most
            async with slots.slot(urgent=urgent):
                inside += 1
                most = max(most, inside)
                await asyncio.sleep(0)
                inside -= 1

        await asyncio.gather(*(job(i % 3 == 0) for i in range(30)))
        return most

    assert asyncio.run(main()) == 3


@pytest.mark.parametrize("cancel_after_handover", [False, True])
def test_a_cancelled_waiter_loses_no_slot(cancel_after_handover: bool) -> None:
    """Cancelled while queued, or just after the slot was handed to it: the slot is not lost."""

    async def main() -> bool:
        slots = PassSlots(1)
        hold = asyncio.Event()
        queued: list[asyncio.Task[None]] = []

        async def holder() -> None:
            async with slots.slot(urgent=False):
                await hold.wait()
            if cancel_after_handover:
                queued[0].cancel()  # at once: handed the slot, the waiter has not resumed yet

        async def waiter() -> None:
            async with slots.slot(urgent=True):
                pass

        running = asyncio.create_task(holder())
        await _settle()
        queued.append(asyncio.create_task(waiter()))
        await _settle()
        if not cancel_after_handover:
            queued[0].cancel()
            await _settle()
        hold.set()
        await running
        results = await asyncio.gather(queued[0], return_exceptions=True)
        assert isinstance(results[0], asyncio.CancelledError)
        async with asyncio.timeout(1):
            async with slots.slot(urgent=False):  # the one slot is free again
                return slots.waiting == 0

    assert asyncio.run(main())


def test_size_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        PassSlots(0)

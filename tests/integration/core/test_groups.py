"""The group registry in Redis: members publish their assignment, expire when silent, and the
newest assignment of a partition wins while a rebalance is in flight."""

from __future__ import annotations

import asyncio

from streamrank import keys
from streamrank.redis.client import client_for_url
from streamrank.runtime import groups
from streamrank.runtime.tasks import cancel_and_wait
from tests.conftest import StackInfo
from tests.integration.support.features import poll


async def test_members_publish_expire_and_the_newest_assignment_wins(
    stack: StackInfo, unique: str
) -> None:
    redis = client_for_url(stack.redis_url)
    group = f"g-{unique}"
    try:
        old = groups.Member("w1", "h1", 11, (("t", 0), ("t", 1)), since=1_000, kind="scoring")
        new = groups.Member("w2", "h2", 22, (("t", 1),), since=2_000, kind="scoring")
        await groups.publish(redis, group, old)
        await groups.publish(redis, group, new)
        listed = await groups.members(redis, group)
        assert [m.member for m in listed] == ["w1", "w2"]
        assert listed[0] == old
        owner = groups.owners(listed)
        assert owner[("t", 0)].member == "w1" and owner[("t", 1)].member == "w2"
        assert 0 < await redis.pttl(keys.group_members(group)) <= groups.TTL_S * 1000

        # a member that stops refreshing expires; an unreadable entry is dropped
        await groups.publish(redis, group, old, ttl_s=0.2)
        await redis.hset(keys.group_members(group), "junk", b"{not json")
        await asyncio.sleep(0.4)
        assert [m.member for m in await groups.members(redis, group)] == ["w2"]
        assert set(await redis.hkeys(keys.group_members(group))) == {b"w2"}

        await groups.withdraw(redis, group, "w2")
        assert await groups.members(redis, group) == []
    finally:
        await redis.delete(keys.group_members(group))
        await redis.aclose()


async def test_a_registration_publishes_each_assignment_at_once(
    stack: StackInfo, unique: str
) -> None:
    redis = client_for_url(stack.redis_url)
    group = f"g-{unique}"
    registration = groups.Registration(redis=redis, group=group, member="w", kind="features")
    task = asyncio.create_task(registration.run(refresh_s=60))
    try:
        registration.assigned([("clicks", 3), ("clicks", 1)])

        async def published() -> list[groups.Member]:
            found = await groups.members(redis, group)
            return found if found and found[0].partitions else []

        [member] = await poll(published, timeout_s=10, what="the registration in Redis")
        assert member.partitions == (("clicks", 1), ("clicks", 3)) and member.kind == "features"
        assert member.since > 0 and member.pid is not None
    finally:
        task.cancel()
        await registration.withdraw()
        await redis.aclose()
    check = client_for_url(stack.redis_url)
    try:
        assert await check.hlen(keys.group_members(group)) == 0
    finally:
        await check.aclose()


async def test_a_registration_stops_whichever_iteration_the_cancel_lands_in(
    stack: StackInfo, unique: str
) -> None:
    """Workers stop the registration's task with ``cancel_and_wait``: it ends even when the
    cancellation lands as an assignment wakes it and it publishes (redis-py's ``wait_for``
    loses one cancellation on Python 3.11; a single cancel + gather hung a worker's stop)."""
    redis = client_for_url(stack.redis_url)
    group = f"g-{unique}"
    try:
        for turns in range(8):  # the cancel lands 0..7 loop iterations after the assignment
            registration = groups.Registration(
                redis=redis, group=group, member=f"w{turns}", kind="scoring"
            )
            task = asyncio.create_task(registration.run(refresh_s=60))

            async def published(member: str = f"w{turns}") -> list[groups.Member]:
                return [m for m in await groups.members(redis, group) if m.member == member]

            await poll(published, timeout_s=10, what="the registration in Redis")
            registration.assigned([("rank-requests", 0)])
            for _ in range(turns):
                await asyncio.sleep(0)
            async with asyncio.timeout(15):
                await cancel_and_wait([task], what="test", timeout_s=10)
            assert task.cancelled(), turns
    finally:
        await redis.delete(keys.group_members(group))
        await redis.aclose()

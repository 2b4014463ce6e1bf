"""What ``RankClient.rank`` sends (the producer replaced by a capture): candidates or a
retrieval request, top_k, scene, exclude, ts and the reply topic; an empty candidate list or
a string where ids belong is refused before anything is sent."""

from __future__ import annotations

import asyncio

import orjson
import pytest

from schemas import RankRequest, RankResult, decode_request
from scoring.client import RankClient, RankRejected, build_request
from streamrank.settings import Settings


class CapturingClient(RankClient):
    """Answers every request at once with ``reply`` (its request_id filled in)."""

    def __init__(self, settings: Settings, reply: RankResult, **kw: object) -> None:
        super().__init__(settings=settings, **kw)  # type: ignore[arg-type]
        self.sent: list[RankRequest] = []
        self.reply = reply

    async def send(self, request: RankRequest) -> asyncio.Future[RankResult]:
        self.sent.append(decode_request(request.to_json()))  # what the worker would read
        future: asyncio.Future[RankResult] = asyncio.get_running_loop().create_future()
        fields = {f: getattr(self.reply, f) for f in self.reply.__dataclass_fields__}
        future.set_result(RankResult(**{**fields, "request_id": request.request_id}))
        return future


REPLY = RankResult("r", "u1", ("b", "a"), (0.9, 0.2), "din-1", cached=True, served_at=1)


async def test_a_retrieval_request_and_a_candidate_request() -> None:
    client = CapturingClient(Settings(), REPLY)
    got = await client.rank("u1", top_k=2, scene="home", exclude=["x", "y"], ts=1_700_000_000_000)
    assert got.items == ("b", "a") and got.cached
    (retrieval,) = client.sent
    assert retrieval.retrieves and retrieval.items == ()
    assert (retrieval.top_k, retrieval.scene, retrieval.exclude) == (2, "home", ("x", "y"))
    assert retrieval.ts == 1_700_000_000_000 and retrieval.reply_to is None
    await client.rank("u1", ["a", "b"], {"page": 2}, request_id="r-7")  # today's callers
    ranked = client.sent[-1]
    assert ranked.items == ("a", "b") and ranked.context == {"page": 2}
    assert ranked.request_id == "r-7" and ranked.top_k is None and ranked.scene == "default"
    assert ranked.exclude == ()


async def test_the_reply_topic_and_refusals() -> None:
    settings = Settings().with_env(STREAMRANK_REPLY_TOPICS_ALLOWED="svc")
    client = CapturingClient(settings, REPLY, reply_topic="svc")
    await client.rank("u1", ("a",))
    assert client.sent[-1].reply_to == "svc"
    with pytest.raises(ValueError, match="items=None"):
        await client.rank("u1", [])
    with pytest.raises(TypeError, match="not the string 'a,b'"):
        await client.rank("u1", "a,b")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="exclude must be a sequence"):
        await client.rank("u1", exclude="x")  # type: ignore[arg-type]
    assert len(client.sent) == 1  # nothing else was sent
    refused = RankResult("r", "u1", (), (), "", degraded=True, reason="invalid_request: top_k")
    with pytest.raises(RankRejected, match="invalid_request"):
        await CapturingClient(settings, refused).rank("u1", top_k=5)


def test_build_request_defaults() -> None:
    request = build_request("u1", None)
    assert len(request.request_id) == 32 and request.scene == "default"
    assert orjson.loads(request.to_json())["items"] is None

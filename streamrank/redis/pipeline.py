"""One batch of commands = one pipeline per Redis node, the nodes served concurrently.

:class:`NodePipeline` queues commands, each with a *route*: a key of the slot it touches (every
multi-key command of ours stays in one slot, see :mod:`streamrank.keys`). On a single server
it is a plain non-transactional pipeline: one round trip. On a cluster it is redis-py's
cluster pipeline with every command addressed to the node that serves its route, which groups
the commands by node and sends the nodes' pipelines concurrently: one round trip of wall time.
Addressing the node ourselves skips redis-py's per-command slot and policy lookup (much of the
client CPU of a large batch: docs/scaling.md), and everything else stays redis-py's: a command
answered ``MOVED``/``ASK`` (a slot moving while the batch is in flight) is sent again on its
own through the cluster client, which follows the redirection and updates its slot map; a node
that does not answer makes redis-py refresh the topology and retry the pipeline.

:func:`run_scripts` sends many calls of one Lua script that way. Two things redis-py does not
do there: a node that has not loaded the script (a new or restarted node, a promoted replica)
answers ``NOSCRIPT`` inside a pipeline, which redis-py does not retry: the script is loaded on
every master and those calls are sent again. And a :class:`ReplicaWait` appends ``WAIT`` to each
node's pipeline (same connection, so it covers that pipeline's writes), then ``INFO
replication``: a node whose writes fewer replicas acknowledged than asked (or than it has, if it
has fewer: a master whose replica is gone, e.g. the replica promoted in a failover, keeps
accepting writes, as safe as its one copy) raises :class:`~streamrank.errors.RedisUnavailable`,
so the caller retries rather than counting on writes a failover could lose. (A command
redirected while a slot moves is sent on its own connection, outside that node's ``WAIT``.)
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from redis.exceptions import NoScriptError

from streamrank.errors import RedisUnavailable
from streamrank.redis.client import is_cluster

logger = logging.getLogger(__name__)
_WARN_EVERY_S = 60.0


@dataclass(frozen=True, slots=True)
class ScriptCall:
    """One call of a Lua script: its keys (all in one slot), arguments, and ``route`` (a key of
    that slot; its first key unless given)."""

    keys: Sequence[str]
    args: Sequence[Any]
    route: str = ""

    @property
    def target(self) -> str:
        return self.route or self.keys[0]


class ReplicaWait:
    """How a writer waits for replicas: ``WAIT`` for ``wanted`` replicas per node written, or
    for all the node has when it has fewer (the count it reported with its previous batch, so
    a master without replicas, e.g. after a failover, does not wait out the timeout each
    batch). One per writer: it remembers each node's replica count."""

    def __init__(self, wanted: int, timeout_ms: int) -> None:
        self.wanted = wanted
        self.timeout_ms = timeout_ms
        self._replicas: dict[str, int] = {}  # node -> connected replicas, as last reported
        self._warned: dict[str, float] = {}

    async def learn(self, client: Any, nodes: dict[str, Any]) -> None:
        """Ask the nodes not seen before how many replicas they have (once each)."""
        for name, node in nodes.items():
            if name not in self._replicas:
                extra = {} if node is None else {"target_nodes": node}
                info = await client.execute_command("INFO", "replication", **extra)
                self._replicas[name] = int(info.get("connected_slaves", 0))

    def command(self, node: str) -> tuple[Any, ...]:
        return ("WAIT", min(self.wanted, self._replicas.get(node, self.wanted)), self.timeout_ms)

    def check(self, node: str, ack: Any, info: Any) -> None:
        """Raise RedisUnavailable unless the node's writes reached ``wanted`` replicas (or all
        it has, if fewer)."""
        for reply in (ack, info):
            if isinstance(reply, Exception):
                raise reply
        connected = int(info.get("connected_slaves", 0))
        self._replicas[node] = connected
        if int(ack) < min(self.wanted, connected):
            raise RedisUnavailable(
                f"Redis node {node}: {ack} of its {connected} replicas acknowledged the batch "
                f"within {self.timeout_ms} ms (STREAMRANK_REDIS_WAIT_REPLICAS={self.wanted}); "
                "it is retried"
            )
        if connected < self.wanted:
            now = time.monotonic()
            if now - self._warned.get(node, -_WARN_EVERY_S) >= _WARN_EVERY_S:
                self._warned[node] = now
                logger.warning(
                    "Redis node %s has %s replicas, fewer than STREAMRANK_REDIS_WAIT_REPLICAS="
                    "%s: its writes count as durable once all it has acknowledge them (until "
                    "a replica rejoins, a crash of it loses what it has not replicated)",
                    node,
                    connected,
                    self.wanted,
                )


class NodePipeline:
    """Commands for one round trip per node: ``add(route, *command)``, then ``execute()``."""

    def __init__(self, client: Any) -> None:
        self._client = client
        self._cluster = is_cluster(client)
        self._queued: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    def __len__(self) -> int:
        return len(self._queued)

    def add(self, route: str, *command: Any, **options: Any) -> None:
        """Queue ``command`` (name and arguments, as ``execute_command`` takes them), which
        touches the slot of ``route``; ``options`` go to the reply parser (``withscores``)."""
        self._queued.append((route, command, options))

    async def execute(
        self, *, raise_on_error: bool = True, wait: ReplicaWait | None = None
    ) -> list[Any]:
        """Send everything queued; the replies in order (exceptions in their place when not
        ``raise_on_error``). With ``wait``, raise RedisUnavailable unless every node written
        to had its writes acknowledged by its replicas (see :class:`ReplicaWait`)."""
        queued, self._queued = self._queued, []
        if not queued:
            return []
        client = self._client
        if not self._cluster:
            if wait is not None:
                await wait.learn(client, {"redis": None})
            pipe = client.pipeline(transaction=False)
            for _route, command, options in queued:
                pipe.execute_command(*command, **options)
            if wait is not None:
                pipe.execute_command(*wait.command("redis"))
                pipe.execute_command("INFO", "replication")
            replies = list(await pipe.execute(raise_on_error=raise_on_error))
            if wait is not None:
                info = replies.pop()
                wait.check("redis", replies.pop(), info)
            return replies
        await client.initialize()  # a slot map to route by (a no-op once built)
        pipe = client.pipeline()
        nodes: dict[str, Any] = {}
        routes: dict[str, str] = {}
        for route, command, options in queued:
            node = client.get_node_from_key(route)
            nodes[node.name] = node
            routes[route] = node.name
            pipe.execute_command(*command, target_nodes=node, **options)
        if wait is not None:
            await wait.learn(client, nodes)
            for name, node in nodes.items():
                pipe.execute_command(*wait.command(name), target_nodes=node)
                pipe.execute_command("INFO", "replication", target_nodes=node)
        replies = list(await pipe.execute(raise_on_error=raise_on_error))
        if wait is not None:
            # A command redis-py sent again elsewhere (a node that failed over, a slot that
            # moved) ran outside its node's WAIT, and the WAIT itself may have gone astray:
            # then the slot map changed, and the batch is sent again on the new one.
            if any(client.get_node_from_key(route).name != node for route, node in routes.items()):
                raise RedisUnavailable(
                    "the cluster's slot map changed while the batch was written (a failover or "
                    "a slot moving); it is sent again so that WAIT covers every write"
                )
            tail, replies = replies[len(queued) :], replies[: len(queued)]
            for name, ack, info in zip(nodes, tail[::2], tail[1::2], strict=True):
                wait.check(name, ack, info)
        return replies


async def run_scripts(
    client: Any,
    script: Any,
    calls: Sequence[ScriptCall],
    *,
    wait: ReplicaWait | None = None,
) -> list[Any]:
    """Run ``script`` (from ``client.register_script``) once per call, one pipeline per node;
    the replies in call order. The calls must be safe to repeat: a call that met ``NOSCRIPT``
    is sent again once the script is loaded, and a failed round is retried by the caller."""
    replies: list[Any] = [None] * len(calls)
    todo = list(range(len(calls)))
    for attempt in range(2):
        pipe = NodePipeline(client)
        for i in todo:
            call = calls[i]
            pipe.add(call.target, "EVALSHA", script.sha, len(call.keys), *call.keys, *call.args)
        results = await pipe.execute(raise_on_error=False, wait=wait)
        missing = []
        for i, result in zip(todo, results, strict=True):
            if isinstance(result, NoScriptError) and attempt == 0:
                missing.append(i)
            elif isinstance(result, Exception):
                raise result
            else:
                replies[i] = result
        if not missing:
            break
        await client.script_load(script.script)  # on every master of a cluster
        todo = missing
    return replies

"""One batch of commands = one pipeline per Redis node, the nodes served concurrently.

:class:`NodePipeline` queues commands, each with a *route*: a key of the slot it touches (every
multi-key command of ours stays in one slot, see :mod:`streamrank.keys`). On a single server
it is a plain non-transactional pipeline: one round trip. On a cluster it is redis-py's
cluster pipeline with every command addressed to the node that serves its route, which groups
the commands by node and sends the nodes' pipelines concurrently: one round trip of wall time.
Addressing the node ourselves skips redis-py's per-command slot and policy lookup (measured:
half the client CPU of a 700-command batch), and everything else stays redis-py's: a command
answered ``MOVED``/``ASK`` (a slot moving while the batch is in flight) is sent again on its
own through the cluster client, which follows the redirection and updates its slot map; a node
that does not answer makes redis-py refresh the topology and retry the pipeline.

:func:`run_scripts` sends many calls of one Lua script that way. Two things redis-py does not
do there: a node that has not loaded the script (a new or restarted node, a promoted replica)
answers ``NOSCRIPT`` inside a pipeline, which redis-py does not retry: the script is loaded on
every master and those calls are sent again. And ``wait_replicas`` appends ``WAIT`` to each
node's pipeline (same connection, so it covers that pipeline's writes): fewer replicas than
asked within the timeout raise :class:`~streamrank.errors.RedisUnavailable`, so the caller
retries rather than counting on writes a failover could lose. (A command redirected while a
slot moves is sent on its own connection, outside that node's ``WAIT``.)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from redis.exceptions import NoScriptError

from streamrank.errors import RedisUnavailable
from streamrank.redis_client import is_cluster


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
        self, *, raise_on_error: bool = True, wait_replicas: int = 0, wait_timeout_ms: int = 0
    ) -> list[Any]:
        """Send everything queued; the replies in order (exceptions in their place when not
        ``raise_on_error``). With ``wait_replicas``, raise RedisUnavailable unless every node
        written to has that many replicas acknowledging its writes within the timeout."""
        queued, self._queued = self._queued, []
        if not queued:
            return []
        client = self._client
        if not self._cluster:
            pipe = client.pipeline(transaction=False)
            for _route, command, options in queued:
                pipe.execute_command(*command, **options)
            if wait_replicas:
                pipe.execute_command("WAIT", wait_replicas, wait_timeout_ms)
            replies = list(await pipe.execute(raise_on_error=raise_on_error))
            if wait_replicas:
                _check_replicated([replies.pop()], wait_replicas, wait_timeout_ms)
            return replies
        await client.initialize()  # a slot map to route by (a no-op once built)
        pipe = client.pipeline()
        nodes: dict[str, Any] = {}
        for route, command, options in queued:
            node = client.get_node_from_key(route)
            nodes[node.name] = node
            pipe.execute_command(*command, target_nodes=node, **options)
        if wait_replicas:
            for node in nodes.values():
                pipe.execute_command("WAIT", wait_replicas, wait_timeout_ms, target_nodes=node)
        replies = list(await pipe.execute(raise_on_error=raise_on_error))
        if wait_replicas:
            acks, replies = replies[len(queued) :], replies[: len(queued)]
            _check_replicated(acks, wait_replicas, wait_timeout_ms)
        return replies


def _check_replicated(acks: list[Any], wanted: int, timeout_ms: int) -> None:
    for ack in acks:
        if isinstance(ack, Exception):
            raise ack
        if int(ack) < wanted:
            raise RedisUnavailable(
                f"a Redis node had {ack} of {wanted} replicas acknowledge the batch within "
                f"{timeout_ms} ms (STREAMRANK_REDIS_WAIT_REPLICAS); it is retried"
            )


async def run_scripts(
    client: Any,
    script: Any,
    calls: Sequence[ScriptCall],
    *,
    wait_replicas: int = 0,
    wait_timeout_ms: int = 1000,
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
        results = await pipe.execute(
            raise_on_error=False, wait_replicas=wait_replicas, wait_timeout_ms=wait_timeout_ms
        )
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

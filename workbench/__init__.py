"""The tools on top of the engine: the ``streamrank`` command, operator tools (tail, top, dlq,
lag, replay), benchmarks, the embedded dev stack and the demo."""

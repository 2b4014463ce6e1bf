"""The embedded development stack (Tansu + Redis) and the one way to start child processes."""

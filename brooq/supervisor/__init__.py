"""The pre-fork supervisor: N isolated worker processes, kill-and-recover."""

"""The engine in a process of its own: typed messages over a pipe, the server-side proxy, the child that hosts it."""

"""Runtime: contexts, graphs, memory handles, groups, sessions. Backends come from `ctxrt.backends`."""

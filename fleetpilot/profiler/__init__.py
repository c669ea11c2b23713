"""The profiler: a serving endpoint, measured into the capacity Profile the planner sizes from.

The flow is cli (flags, progress bar, the file and the ConfigMap) → client (timed streaming requests,
vLLM's /tokenize and /metrics where the server has them) → sweep (pure: the grid, the decode windows,
the Profile).
"""

"""The simulator engine: a GPU-free worker that speaks vLLM's HTTP API and disaggregation protocol.

The flow is cli (flags → performance model, limits, identity; runs uvicorn) → server (OpenAI
completions and chat, `kv_transfer_params`, /health, /metrics) → engine (`Engine`: the real-time
loop and per-request token streams) → scheduler (`Scheduler`: the pure continuous-batching core over
a paged KV cache) → kvcache (`BlockPool`: the blocks, with vLLM's automatic prefix caching), and
metrics (vLLM's metric names, one registry per worker). Timing comes from `fleetpilot.perfmodel`
through the `scheduler.TimingModel` protocol.

Library use::

    from fleetpilot.sim import engine, scheduler, server

    sim = engine.Engine(scheduler.Scheduler(timing, scheduler.SchedulerConfig()), speedup=10)
    app = server.create_app(server.ServerConfig(served_model="llama-8b", role="decode"), sim)
"""

"""The frontend: OpenAI-compatible routing to prefill/decode or aggregated workers."""

"""fleetpilot: a Kubernetes control plane for disaggregated LLM inference fleets."""

__version__ = "0.1.0"

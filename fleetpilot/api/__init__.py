"""The fleetpilot.dev API: pydantic models and the CRDs generated from them."""

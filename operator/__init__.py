"""The DynamoGraph operator: renderers and status (pure), the API adapter, the reconciler, kopf wiring."""

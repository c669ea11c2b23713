"""Local development cluster: a real control plane on loopback with simulated GPU nodes."""

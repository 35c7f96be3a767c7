"""The parameter server: versioned weights and the rollout queue over gRPC (docs/param_server.md)."""

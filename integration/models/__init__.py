"""JAX programs used by the integration tests and the A/B harness."""

"""Local real components (control plane, notebook servers) for tests, the demo and benchmarks."""

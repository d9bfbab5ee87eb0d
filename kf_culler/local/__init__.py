"""The local components `kf-culler demo` runs: a control plane built from upstream, real Jupyter servers,
a loopback router, Prometheus with a stand-in dcgm-exporter, the GPU hand-off scenario.

Needs the `demo` extra (pip install -e '.[demo]'). Tests and benchmarks use these too; what only the
tests use lives in tests/support/, outside the package. Not in the container image.
"""

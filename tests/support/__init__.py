"""Test and benchmark support that is not shipped: clusters to test against (local, KUBECONFIG, kind),
misbehaving servers, code-server, Kubeflow's Jupyter web app, kustomize rendering.

Importable as `support` from tests (pytest puts tests/ on sys.path). The components the demo needs
too live in the package, in kf_culler.local.
"""

"""The only code that talks to the Kubernetes API server: watch cache, writer, lease."""

GROUP, VERSION, PLURAL = "kubeflow.org", "v1", "notebooks"
POD_LABEL = "notebook-name"  # set by Kubeflow's notebook-controller on every notebook pod

"""kf-culler: an idle culler for Kubeflow Notebooks."""

__version__ = "0.1.0"

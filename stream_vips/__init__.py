"""stream_vips: differentially private Bayesian inference (VIPS, DP-SEP) on event streams."""

__version__ = "0.1.0"

"""DP-SEP: private stochastic expectation propagation behind the common model protocol."""

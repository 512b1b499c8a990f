"""moelab: a performance lab for Mixture-of-Experts expert-parallel communication."""

__version__ = "0.1.0"

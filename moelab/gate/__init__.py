"""The CI regression gate (`moelab check`): statistics, the per-case decision, and its outputs."""

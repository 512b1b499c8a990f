"""One module per backend; `registry` maps names to classes (built-ins and the `moelab.backends` entry points)."""

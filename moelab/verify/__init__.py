"""`moelab verify`: run each library's own benchmark at the configuration moelab ran, parse its figures, and
set each beside the moelab figure that must equal it (same bytes, same timing definition), with a verdict.

Pipeline: plan (the RunSpec of moelab's side) → moelab's measurement → per library: command → subprocess
(log kept in RUN_DIR/verify/) → parser → comparison → stored in `library_figures` of the same run.
"""

"""Suite files: named axes whose cartesian product gives the cases. See moelab/suites/loader.py."""

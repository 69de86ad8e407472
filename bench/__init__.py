"""jsample's benchmark: ``python -m bench [--quick]``; see ``bench/run.py``."""

"""Make the in-tree package importable without installing it."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import tempfile

# The link probe's cache (links="probe" tests) in a directory of this run, not ~/.cache.
os.environ.setdefault("STRATA_LINKS_CACHE", tempfile.mkdtemp(prefix="strata-links-"))

"""Make the in-tree package importable without installing it."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import atexit
import shutil
import tempfile

# The link probe's cache (links="probe" tests) in a directory of this run, not ~/.cache,
# removed when the run ends.
if "STRATA_LINKS_CACHE" not in os.environ:
    _links_cache = tempfile.mkdtemp(prefix="strata-links-")
    os.environ["STRATA_LINKS_CACHE"] = _links_cache
    atexit.register(shutil.rmtree, _links_cache, True)

"""The entry of the checks run under mpirun (torch_backend_check.py and its siblings)."""

import sys
import traceback
from typing import Callable


def run(main: Callable[[], None]) -> None:
    """Run ``main``; a failure prints its traceback and ``FAILED: ...`` on stderr (mpirun
    prefixes neither, so every rank's reason shows) and is raised again, so the rank
    exits non-zero and mpirun ends the job."""
    try:
        main()
    except BaseException as e:
        traceback.print_exc()
        print(f"FAILED: {e!r}", file=sys.stderr)
        raise

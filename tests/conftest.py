"""Import torch once in the outer process: pytester's in-process runs restore sys.modules
after each run, and a C extension like torch cannot be imported a second time."""

import torch  # noqa: F401

"""Import torch, and the torch modules the plugin imports lazily, once in the outer process.

pytester's in-process runs restore ``sys.modules`` after each run, so a module first imported
inside a run is imported again by the next user; torch's C-backed modules abort the process
when that happens. Importing them here keeps them loaded for the whole session.
"""

import torch  # noqa: F401
import torch.nn.attention  # noqa: F401
import torch.nn.functional  # noqa: F401
import torch.profiler  # noqa: F401
import torch.utils.flop_counter  # noqa: F401

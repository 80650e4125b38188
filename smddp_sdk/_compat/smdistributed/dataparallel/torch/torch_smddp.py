"""`import smdistributed.dataparallel.torch.torch_smddp` registers the "smddp" torch.distributed backend.

Scripts then call ``dist.init_process_group(backend="smddp")`` exactly as with AWS's library.
"""

import smddp_sdk.collectives  # noqa: F401 - registration happens at import

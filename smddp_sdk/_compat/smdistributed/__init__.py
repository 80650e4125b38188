"""smddp-sdk's stand-in for AWS's `smdistributed` namespace, used only when the real one is absent: a real
package further along sys.path is loaded in its place (``smddp_sdk.runtime.pythonpath.load_real_package``)."""

import os as _os

from smddp_sdk.runtime.pythonpath import load_real_package as _load_real_package

_load_real_package(__name__, _os.path.dirname(_os.path.abspath(__file__)))

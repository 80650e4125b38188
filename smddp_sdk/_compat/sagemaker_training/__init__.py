"""smddp-sdk's stand-in for AWS's `sagemaker_training` (only `environment`), used only when the real one is absent."""

from _smddp_compat_defer import load_real_package as _load_real_package

_load_real_package(__name__)  # a real installation elsewhere on sys.path takes this module's place

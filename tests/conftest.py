import os

from hypothesis import HealthCheck, settings

# Frames are checked for exact bytes, so timing-based flakiness only comes from
# the shared machines: no deadlines. CKPT_HYPOTHESIS_PROFILE=thorough runs ten
# times the examples (used before releases and after codec changes).
_suppressed = [HealthCheck.too_slow, HealthCheck.data_too_large]
settings.register_profile("default", max_examples=60, deadline=None, suppress_health_check=_suppressed)
settings.register_profile("thorough", max_examples=600, deadline=None, suppress_health_check=_suppressed)
settings.load_profile(os.environ.get("CKPT_HYPOTHESIS_PROFILE", "default"))

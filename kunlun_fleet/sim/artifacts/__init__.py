"""Sources of the vendor-artifact stand-ins that `kunlun_fleet/sim/bundle.py` builds."""
